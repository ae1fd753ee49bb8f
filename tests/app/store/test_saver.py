"""The saver: rounds kept while the database is locked, nothing confirmed lost to kill -9."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path


from app.store.history import History
from app.store.saver import HistorySaver
from app.store.pending import ChatRef
from engine.events import ReplyStats
from tests.conftest import REPO
from tests.app.store.locking import hold_lock


def test_saver_keeps_rounds_while_locked_and_writes_the_final_state(specchat_dirs: Path, short_busy: None) -> None:
    history = History.open()
    lags: list[str | None] = []
    saver = HistorySaver(history, lags.append)
    chat = ChatRef("locked reply", "fast")
    first = saver.start_reply(chat, "hello", "fast")
    saver.update(first, "Hi", [("Hi", "target")], None)
    assert saver.flush(5)
    thread, _ = hold_lock(specchat_dirs / "history.db", 1.0, exclusive=False)
    for i in range(5):
        saver.update(first, "Hi" + " there" * (i + 1), [("Hi" + " there" * (i + 1), "target")], {"tokens": i})
    saver.update(first, "Hi there, done.", [("Hi there, done.", "draft")], {"tokens": 9}, "eos")
    second = saver.start_reply(chat, "again", "fast")
    saver.update(second, "Yes.", [("Yes.", "target")], None, "eos")
    time.sleep(0.5)
    assert saver.lagging and saver.unsaved() == 2 and lags and lags[0] and "locked" in lags[0]
    thread.join()
    assert saver.close(5)
    assert lags[-1] is None and not saver.lagging
    rows = [(m.role, m.content, m.finish_reason) for m in history.messages(chat.id)]  # type: ignore[arg-type]
    assert rows == [("user", "hello", None), ("assistant", "Hi there, done.", "eos"),
                    ("user", "again", None), ("assistant", "Yes.", "eos")]
    assert history.messages(chat.id)[1].stats == {"tokens": 9}  # type: ignore[arg-type]


def test_the_engines_stats_are_written_as_the_dict_they_convert_to(specchat_dirs: Path) -> None:
    """The reply worker hands over each round's frozen ReplyStats; the saver converts the one it writes."""
    history = History.open()
    saver = HistorySaver(history)
    chat = ChatRef("stats", "fast")
    record = saver.start_reply(chat, "hello", "fast")
    stats = [ReplyStats(mode="plain", drafter="none", rounds=i, tokens=i, tokens_per_s=40.0 + i) for i in (1, 2, 3)]
    for i, round_stats in enumerate(stats):
        saver.update(record, "Hi" * (i + 1), [("Hi" * (i + 1), "target")], round_stats, "eos" if i == 2 else None)
    assert saver.close(5)
    (_user, reply) = history.messages(chat.id)  # type: ignore[arg-type]
    assert reply.stats == stats[-1].to_dict() and reply.stats["tokens"] == 3


def test_waiting_for_a_chat_waits_for_its_replys_end_not_only_what_was_handed_over(specchat_dirs: Path) -> None:
    """ctrl+n mid-reply, then F3 on that chat: flush() returned once the rounds so far were written, and
    the chat opened showing the reply as "unfinished: its end was never saved" (a review's)."""
    import threading

    history = History.open()
    saver = HistorySaver(history, min_interval_s=0.0)
    chat = ChatRef("left mid-reply", "fast")
    record = saver.start_reply(chat, "count", "fast")
    saver.update(record, "1 2", [("1 2", "target")], None, None)
    assert saver.flush(5) and chat.id is not None  # written so far; the reply has not ended
    assert not saver.wait_chat(chat.id, 0.2)
    threading.Timer(0.3, lambda: saver.update(record, "1 2 3", [("1 2 3", "target")], None, "cancelled")).start()
    assert saver.wait_chat(chat.id, 5)
    (_user, reply) = history.messages(chat.id)
    assert (reply.content, reply.finish_reason) == ("1 2 3", "cancelled")
    saver.close(5)
    history.close()


def _child(db: Path, rounds: int, finish: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.app.saver_child", str(db), str(rounds), "1" if finish else "0"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )


def _saved_reply(db: Path) -> tuple[str, str | None]:
    history = History.open(db)
    assert history.notice is None  # a killed writer leaves no damage and no lock
    (chat,) = history.list_chats()
    (_user, reply) = history.messages(chat.id)
    history.close()
    return reply.content, reply.finish_reason


def test_kill_9_mid_reply_loses_nothing_confirmed(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    child = _child(db, 10_000, finish=False)
    assert child.stdout is not None
    confirmed = 0
    for line in child.stdout:
        if line.startswith("saved "):
            confirmed = int(line.split()[1])
        if confirmed >= 50:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    text, finish = _saved_reply(db)
    assert text.startswith("".join(f" r{i}" for i in range(confirmed)))
    assert finish is None


def test_kill_9_after_a_lock_clears_keeps_the_final_state(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    first = History.open(db)
    first.close()
    thread, _ = hold_lock(db, 1.5, exclusive=False)
    child = _child(db, 40, finish=True)
    assert child.stdout is not None
    lines = []
    for line in child.stdout:
        lines.append(line.strip())
        if line.startswith("all saved"):
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    thread.join()
    assert lines[0] == "pending 1"  # the first rounds waited in memory while the lock was held
    text, finish = _saved_reply(db)
    assert text == "".join(f" r{i}" for i in range(40)) and finish == "length"


def test_streaming_rounds_coalesce_and_a_reply_s_end_is_written_at_once(specchat_dirs: Path) -> None:
    """Rounds arriving faster than ``min_interval_s`` become one write; the final state does not wait
    out the interval (nor does a flush, which quitting does)."""
    history = History.open()
    saver = HistorySaver(history, min_interval_s=30.0)
    writes: list[str] = []
    real = saver._write

    def counting(record: object, version: int, text: str, *rest: object) -> None:
        writes.append(text)
        real(record, version, text, *rest)  # type: ignore[arg-type]

    saver._write = counting  # type: ignore[method-assign]
    chat = ChatRef("streaming", "fast")
    reply = saver.start_reply(chat, "hello", "fast")
    saver.update(reply, "A", [("A", "target")], None)
    time.sleep(0.3)  # the new reply's rows and its first round are written at once
    first = len(writes)
    assert writes and writes[-1] == "A"
    for batch in range(2):
        for i in range(10):
            saver.update(reply, f"A{batch}" + "b" * (i + 1), [(f"A{batch}" + "b" * (i + 1), "target")], None)
        time.sleep(0.3)
    assert len(writes) - first <= 1  # twenty rounds in 0.6 s: one write at most, then the interval
    began = time.monotonic()
    saver.update(reply, "Done.", [("Done.", "target")], {"tokens": 3}, "eos")
    while history.messages(chat.id)[-1].finish_reason != "eos":  # type: ignore[arg-type]
        assert time.monotonic() - began < 5, "the final state waited out the interval"
        time.sleep(0.05)
    assert writes[-1] == "Done."
    second = saver.start_reply(chat, "again", "fast")
    saver.update(second, "Half", [("Half", "target")], None)
    assert saver.flush(5)  # quitting: written now, not 30 s later
    assert saver.close(5)
