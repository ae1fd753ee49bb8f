"""history.db: private file modes, damaged, locked or newer files set aside, never overwritten."""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import app.store.schema as schema_module
from app.store.db_file import confirm_corrupt
from app.store.history import History, HistoryError
from tests.app.store.locking import hold_lock, mode


def test_roundtrip_and_private_modes(specchat_dirs: Path) -> None:
    history = History.open()
    assert history.notice is None and history.path == specchat_dirs / "history.db"
    chat = history.create_chat("Greeting", "fast", None)
    history.add_message(chat, "user", "hi", profile="fast")
    reply = history.add_message(chat, "assistant", "", profile="fast")
    history.update_message(chat, reply, "Hello!", stats={"alpha": 0.5, "mode": "spec"},
                           pieces=[("Hello", "draft"), ("!", "target")], finish_reason="eos")
    (rec_user, rec_reply) = history.messages(chat)
    assert (rec_user.role, rec_user.content) == ("user", "hi")
    assert rec_reply.pieces == [("Hello", "draft"), ("!", "target")] and rec_reply.stats == {"alpha": 0.5, "mode": "spec"}
    history.rename_chat(chat, "Renamed")
    assert [c.title for c in history.list_chats()] == ["Renamed"]
    assert history.list_chats()[0].message_count == 2
    assert mode(specchat_dirs) == 0o700
    for path in specchat_dirs.glob("history.db*"):
        assert mode(path) == 0o600, path
    history.delete_chat(chat)
    assert history.list_chats() == [] and history.messages(chat) == []
    history.close()


def test_damaged_database_is_set_aside_not_overwritten(specchat_dirs: Path) -> None:
    specchat_dirs.mkdir(parents=True)
    garbage = b"this is not sqlite" * 100
    (specchat_dirs / "history.db").write_bytes(garbage)
    history = History.open()
    assert history.notice is not None and "corrupt-" in history.notice
    (aside,) = specchat_dirs.glob("history.db.corrupt-*")
    assert aside.read_bytes() == garbage
    history.create_chat("still works", None)
    assert [c.title for c in history.list_chats()] == ["still works"]
    history.close()


def test_lock_at_start_is_not_corruption(specchat_dirs: Path, short_busy: None) -> None:
    first = History.open()
    first.create_chat("kept", None)
    first.close()
    thread, _ = hold_lock(specchat_dirs / "history.db", 1.0)
    history = History.open()
    assert history.notice is not None and "locked" in history.notice
    assert not list(specchat_dirs.glob("history.db.corrupt-*"))
    with pytest.raises(HistoryError) as err:
        history.create_chat("while locked", None)
    assert err.value.locked
    thread.join()
    history.create_chat("after the lock", None)  # the same file, not a fresh one
    assert [c.title for c in history.list_chats()] == ["after the lock", "kept"]
    history.close()
    assert not list(specchat_dirs.glob("history.db.corrupt-*"))


def test_lock_released_during_open_is_waited_for(specchat_dirs: Path, short_busy: None) -> None:
    first = History.open()
    first.create_chat("kept", None)
    first.close()
    thread, _ = hold_lock(specchat_dirs / "history.db", 0.3)  # longer than one busy timeout
    history = History.open()
    thread.join()
    assert history.notice is None
    assert [c.title for c in history.list_chats()] == ["kept"]


def test_unusable_or_newer_file_is_left_untouched(specchat_dirs: Path) -> None:
    first = History.open()
    first.create_chat("from the future", None)
    first.close()
    conn = sqlite3.connect(specchat_dirs / "history.db")
    conn.execute(f"PRAGMA user_version = {schema_module.SCHEMA_VERSION + 1}")
    conn.close()
    before = (specchat_dirs / "history.db").read_bytes()
    history = History.open()
    assert history.path is None and history.notice is not None and "newer specchat" in history.notice
    history.create_chat("in memory", None)
    assert (specchat_dirs / "history.db").read_bytes() == before
    assert not list(specchat_dirs.glob("history.db.corrupt-*"))


def test_malformed_database_is_confirmed_and_set_aside(specchat_dirs: Path) -> None:
    first = History.open()
    for i in range(200):
        first.add_message(first.create_chat(f"chat {i}", None), "user", "x" * 500)
    first.close()
    conn = sqlite3.connect(specchat_dirs / "history.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    path = specchat_dirs / "history.db"
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for off in range(2 * page, len(data), page):  # scribble over every b-tree page after the first
        data[off:off + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    assert confirm_corrupt(path, 1.0)
    history = History.open()
    assert history.notice is not None and "damaged" in history.notice
    assert len(list(specchat_dirs.glob("history.db.corrupt-*"))) == 1


def test_the_chats_a_damaged_file_still_holds_are_read_into_the_new_one_whole(specchat_dirs: Path) -> None:
    """One page overwritten in a history of 200 chats: the whole file was set aside and the app
    started empty, though 194 chats still read one by one (a hostile tester). Every chat that reads
    whole is now copied, under its own id and with all its messages; the damaged file is kept as
    it was, and the notice says how many chats came across."""
    import os

    first = History.open()
    for i in range(200):
        chat = first.create_chat(f"chat {i}", "fast")
        first.add_message(chat, "user", f"question {i} " + "q" * 300, profile="fast")
        first.add_message(chat, "assistant", f"answer {i} " + "a" * 300, profile="fast", stats={"tokens": i},
                          finish_reason="eos")
    first.close()
    path = specchat_dirs / "history.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    middle = len(data) // page // 2
    data[middle * page + 8:(middle + 1) * page] = os.urandom(page - 8)  # one page, its header kept
    path.write_bytes(bytes(data))
    history = History.open()
    assert history.notice is not None and "damaged" in history.notice
    (aside,) = specchat_dirs.glob("history.db.corrupt-*")
    assert aside.read_bytes() == bytes(data)  # read from a copy, never written
    chats = history.list_chats()
    assert 150 <= len(chats) < 200
    assert f"{len(chats)} of its 200 chats were read into the new one; {200 - len(chats)} could not be read" \
        in history.notice
    for chat in chats:
        i = chat.id - 1
        assert (chat.title, chat.profile) == (f"chat {i}", "fast")
        assert [(m.role, m.content, m.stats) for m in history.messages(chat.id)] == [
            ("user", f"question {i} " + "q" * 300, None), ("assistant", f"answer {i} " + "a" * 300, {"tokens": i})]
    new = history.create_chat("after", "fast")
    assert new > 200  # ids are never reused, salvaged or not
    history.close()


def test_drafting_texts_are_the_newest_messages_within_the_budget_oldest_first(specchat_dirs: Path) -> None:
    history = History.open()
    chat = history.create_chat("one", "fast")
    for role, text in [("user", "aaaa"), ("assistant", "bbbbbb"), ("user", ""), ("user", "cc"), ("assistant", "ddd")]:
        history.add_message(chat, role, text)  # type: ignore[arg-type]
    assert history.drafting_texts(100) == ["aaaa", "bbbbbb", "cc", "ddd"]  # empty messages skipped
    assert history.drafting_texts(11) == ["bbbbbb", "cc", "ddd"]  # the newest that fit
    assert history.drafting_texts(2) == []
    history.delete_chat(chat)
    assert history.drafting_texts(100) == []
    history.close()


def test_a_data_folder_that_is_a_file_is_named_as_such(specchat_dirs: Path) -> None:
    specchat_dirs.parent.mkdir(parents=True, exist_ok=True)
    specchat_dirs.write_text("not a folder")  # the notice said "[Errno 17] File exists: '.../data'"
    history = History.open()
    assert history.path is None and history.notice is not None
    assert f"{specchat_dirs} is a file, not a folder" in history.notice and "SPECCHAT_DATA_DIR" in history.notice
    assert "Errno" not in history.notice
    assert specchat_dirs.read_text() == "not a folder"


def test_text_with_a_lone_surrogate_is_saved_with_a_replacement_character(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SQLite cannot take one (UTF-8): the write raised UnicodeEncodeError, which ended the saver's thread."""
    history = History.open(tmp_path / "history.db")
    chat = history.create_chat("title \ud800", "fast")
    first = history.add_message(chat, "user", "ask \udfff")
    history.update_message(chat, first, "ask \ud83d again")
    assert [m.content for m in history.messages(chat)] == ["ask \ufffd again"]
    assert history.get_chat(chat).title == "title \ufffd"  # type: ignore[union-attr]
    assert [c.id for c, _ in history.search_chats("\ud800")] == [chat]  # a search holding one finds the U+FFFD
    history.close()


ODD_VALUES = {  # what another program (a DB browser, a script) could write into one chat's rows
    "a title that is not UTF-8": "UPDATE chats SET title = CAST(x'ff1b5d303b70776e6564fe07' AS TEXT) WHERE id = :v",
    "a title stored as a blob": "UPDATE chats SET title = x'41424344' WHERE id = :v",
    "content stored as a blob": "UPDATE messages SET content = x'41424344' WHERE chat_id = :v",
    "content that is not UTF-8": "UPDATE messages SET content = CAST(x'c328ff' AS TEXT) WHERE chat_id = :v",
    "pieces of the wrong shape": "UPDATE messages SET pieces = '[1,2,3]' WHERE chat_id = :v",
    "pieces as an object": "UPDATE messages SET pieces = '{\"ab\": 1}' WHERE chat_id = :v",
    "statistics as a list": "UPDATE messages SET stats = '[1,2]' WHERE chat_id = :v",
    "statistics of the wrong types": "UPDATE messages SET stats = '{\"tokens\": \"x\", \"alpha\": \"bad\", "
                                     "\"tokens_per_s\": [1], \"speedup\": \"y\", \"mode_tokens\": 3}' WHERE chat_id = :v",
    "a time beyond any clock": "UPDATE chats SET updated = 1e300, created = -5 WHERE id = :v",
    "a time as text": "UPDATE chats SET updated = 'yesterday' WHERE id = :v",
    "a profile stored as a blob": "UPDATE chats SET profile = x'00ff' WHERE id = :v",
    "a finish reason that is a number": "UPDATE messages SET finish_reason = 5, created = 'x' WHERE chat_id = :v",
}


@pytest.mark.parametrize("odd", ODD_VALUES)
def test_one_chat_with_odd_values_is_read_and_shown_and_the_others_stay_listed(specchat_dirs: Path, odd: str) -> None:
    """A hostile tester's rows: one title that was not UTF-8 hid every chat ("No saved chats yet"),
    and pieces, statistics or times of the wrong type ended the app at each start (the chat was
    reopened) or at F3. Each now reads as the nearest thing that can be shown."""
    import time as time_module

    from app.ui.export import chat_markdown
    from app.ui.labels import shown_title

    history = History.open()
    ids = []
    for title in ("first", "odd one", "last"):
        chat = history.create_chat(title, "fast")
        history.add_message(chat, "user", f"question in {title}", profile="fast")
        history.add_message(chat, "assistant", f"answer in {title}", profile="fast", stats={"tokens": 3, "alpha": 0.5},
                            pieces=[("answer", "target")], finish_reason="eos")
        ids.append(chat)
    conn = sqlite3.connect(specchat_dirs / "history.db")
    conn.execute(ODD_VALUES[odd], {"v": ids[1]})
    conn.commit()
    conn.close()
    assert sorted(c.id for c in history.list_chats()) == ids
    chat = history.get_chat(ids[1])
    assert chat is not None and isinstance(chat.title, str) and isinstance(chat.profile, str)
    time_module.strftime("%Y-%m-%d", time_module.localtime(chat.updated))
    shown_title(chat.title)
    for message in history.messages(ids[1]):
        assert isinstance(message.content, str) and isinstance(message.finish_reason, (str, type(None)))
        assert message.pieces is None or all(isinstance(t, str) and isinstance(s, str) for t, s in message.pieces)
    assert "## User" in chat_markdown(history, ids[1])
    assert [c.id for c, _ in history.search_chats("question")] != []
    history.close()


def test_every_reply_statistic_has_a_check_of_its_saved_type() -> None:
    from dataclasses import fields

    from app.store.records import _STAT_CHECKS
    from engine.events import ReplyStats

    assert set(_STAT_CHECKS) == {f.name for f in fields(ReplyStats)}


def test_a_data_folder_that_was_there_keeps_its_mode_and_a_new_one_is_private(specchat_dirs: Path) -> None:
    """``SPECCHAT_DATA_DIR`` at a shared 1777 folder: its mode was set to 0700, the sticky bit and
    everyone else's access gone. The history file in it is still private."""
    specchat_dirs.mkdir()
    specchat_dirs.chmod(0o1777)
    History.open().close()
    assert mode(specchat_dirs) == 0o1777 and mode(specchat_dirs / "history.db") == 0o600
    specchat_dirs.chmod(0o755)
    fresh = specchat_dirs / "fresh"
    History.open(fresh / "history.db").close()
    assert mode(fresh) == 0o700


def test_another_programs_sqlite_file_is_left_as_it_was(specchat_dirs: Path) -> None:
    """A tester's SQLite file with a ``chats`` table of its own: the notice said it "was left
    untouched", but it had been switched to WAL, given user_version 2 and a messages table."""
    specchat_dirs.mkdir()
    path = specchat_dirs / "history.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE chats (id INTEGER PRIMARY KEY, name TEXT, body TEXT)")
    conn.execute("INSERT INTO chats (name, body) VALUES ('theirs', 'data')")
    conn.commit()
    conn.close()
    path.chmod(0o644)
    before = path.read_bytes()
    history = History.open()
    assert history.path is None  # this session's chats live in memory
    assert history.notice is not None and "another program's SQLite file: its table 'chats' is not specchat's" \
        in history.notice and "left untouched" in history.notice
    history.close()
    assert path.read_bytes() == before and mode(path) == 0o644
    assert sorted(p.name for p in specchat_dirs.iterdir()) == ["history.db"]



def test_a_full_disk_is_named_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite often says only "disk I/O error" when a write finds no room: the notice says the
    disk is full and which folder's, so the user knows what to free."""
    import subprocess

    import app.store.records as records

    room = tmp_path / "room"
    room.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(room)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (not root)")
    try:
        monkeypatch.setenv("SPECCHAT_DATA_DIR", str(room / "data"))
        history = History.open()
        chat = history.create_chat("t", None)
        with pytest.raises(HistoryError) as err:
            for _ in range(100):
                history.add_message(chat, "user", "x" * 5000)
        assert f"the disk holding {room / 'data'} is full" in str(err.value) and not err.value.locked
        history.close()
    finally:
        subprocess.run(["umount", "-l", str(room)], check=False)
    monkeypatch.setattr(records.shutil, "disk_usage", lambda path: shutil_usage(0))
    said = records.describe("Saving chat history failed", sqlite3.OperationalError("disk I/O error"), tmp_path / "h.db")
    assert said.startswith(f"Saving chat history failed: the disk holding {tmp_path} is full (0 bytes free)")
    monkeypatch.setattr(records.shutil, "disk_usage", lambda path: shutil_usage(10 << 30))
    assert records.describe("Saving", sqlite3.OperationalError("disk I/O error"), tmp_path / "h.db") == \
        "Saving: disk I/O error"  # room enough: another cause, said as SQLite says it


def shutil_usage(free: int) -> SimpleNamespace:
    return SimpleNamespace(total=free + 1, used=1, free=free)


def test_a_read_does_not_wait_behind_a_write_that_waits_for_another_programs_lock(specchat_dirs: Path) -> None:
    """The saver's write, held up by another program's lock, held History's lock for the 5 s the
    lock is waited for, and every read meanwhile (F3's list and search, Up's recall, a chat being
    opened) froze the UI's thread for as long. Reads now go through a connection of their own."""
    import threading

    history = History.open()
    chat = history.create_chat("Before", "fast", None)
    history.add_message(chat, "user", "hi", profile="fast")
    holder, _ = hold_lock(history.path, 3.0, exclusive=False)  # another program's write transaction
    failed: list[HistoryError] = []

    def write() -> None:
        try:
            history.rename_chat(chat, "After")
        except HistoryError as exc:
            failed.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(0.3)  # the write is now waiting for the lock
    assert writer.is_alive()
    chats, said, recalled = history.list_chats(), history.messages(chat), history.recent_prompts(5)
    assert writer.is_alive(), "the reads above waited for the stuck write"
    assert [c.title for c in chats] == ["Before"] and [m.content for m in said] == ["hi"] and recalled == ["hi"]
    holder.join()
    writer.join()
    assert failed == [] and [c.title for c in history.list_chats()] == ["After"]  # the write went in once free
    history.close()


def test_a_closed_history_refuses_reads_too(specchat_dirs: Path) -> None:
    history = History.open()
    history.list_chats()  # the reading connection is open
    history.close()
    with pytest.raises(HistoryError, match="Reading chat history failed"):
        history.list_chats()


def test_a_history_that_can_be_read_but_not_written_is_shown_not_dropped(
        specchat_dirs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only history.db (or one in a read-only folder) said "cannot be used" and the app started
    on an empty history in memory: the past chats could not even be read (a hostile tester's; as root
    the file system lets every write through, so the refusal is the one SQLite gives)."""
    import app.store.history as history_module

    history = History.open()
    chat = history.create_chat("kept", "pocket")
    history.add_message(chat, "user", "an old question")
    history.close()

    def read_only(path: Path, timeout: float) -> sqlite3.Connection:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(history_module, "connect", read_only)
    again = History.open()
    assert again.path == specchat_dirs / "history.db"
    assert again.notice is not None and "can be read but not written" in again.notice
    assert "SPECCHAT_DATA_DIR" in again.notice
    assert [c.title for c in again.list_chats()] == ["kept"]
    assert [m.content for m in again.messages(chat)] == ["an old question"]
    with pytest.raises(HistoryError):
        again.add_message(chat, "user", "a new one")
    again.close()


def test_a_history_in_a_folder_that_cannot_be_written_is_read_for_real(tmp_path: Path) -> None:
    """The file system's own refusal (as root, with the capability to override it dropped): a WAL
    file whose side files cannot be made opened read-only only as immutable, and a second reader
    connection failed with "attempt to write a readonly database"."""
    import os
    import shutil
    import subprocess
    import sys

    as_root = os.geteuid() == 0
    if as_root and shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: the file system lets every write through")
    data = tmp_path / "data"
    history = History.open(data / "history.db")
    chat = history.create_chat("kept", "pocket")
    history.add_message(chat, "user", "an old question")
    history.close()
    (data / "history.db").chmod(0o444)
    data.chmod(0o555)
    code = ("import sys; from pathlib import Path; from app.store.history import History, HistoryError\n"
            f"h = History.open(Path({str(data / 'history.db')!r}))\n"
            "print(h.path is not None, [m.content for c in h.list_chats() for m in h.messages(c.id)])\n"
            "try:\n    h.add_message(1, 'user', 'new')\nexcept HistoryError:\n    print('refused')\n")
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-dac_override,-dac_read_search", "--"] if as_root else []
    try:
        done = subprocess.run([*drop, sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3],
                              capture_output=True, text=True, timeout=60)
    finally:
        data.chmod(0o755)
    if done.returncode != 0 and done.stderr.startswith("setpriv:"):
        pytest.skip(f"capabilities cannot be dropped here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["True ['an old question']", "refused"]
