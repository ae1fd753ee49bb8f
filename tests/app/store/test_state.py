"""The state file remembers the last profile; a missing, damaged or unwritable file is never an error."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.store.state import last_profile, remember_profile, state_file


def test_the_state_file_lives_in_the_state_dir(tmp_path: Path) -> None:
    assert state_file() == tmp_path / "state" / "state.json"


def test_nothing_is_remembered_before_the_first_write() -> None:
    assert not state_file().exists() and last_profile() is None


def test_a_remembered_profile_is_read_back_and_other_keys_are_kept() -> None:
    state_file().parent.mkdir(parents=True)
    state_file().write_text(json.dumps({"other": 3}))
    remember_profile("lookup")
    assert last_profile() == "lookup"
    assert json.loads(state_file().read_text()) == {"other": 3, "last_profile": "lookup"}
    remember_profile("fast")
    assert last_profile() == "fast"
    assert sorted(p.name for p in state_file().parent.iterdir()) == ["state.json", "state.lock"]  # no temporary left


def test_the_same_profile_again_does_not_rewrite_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.store.state as state

    remember_profile("fast")
    written: list[object] = []
    monkeypatch.setattr(state, "_write", written.append)
    remember_profile("fast")
    assert written == []
    remember_profile("lookup")
    assert len(written) == 1  # the stand-in sees writes: the first call's silence meant something


@pytest.mark.parametrize("data", [b"{not json", b"[1, 2]", b'{"last_profile": 7}', b'{"last_profile": ""}', b"\xff"])
def test_a_damaged_file_remembers_nothing(data: bytes) -> None:
    state_file().parent.mkdir(parents=True)
    state_file().write_bytes(data)
    assert last_profile() is None


def test_a_damaged_file_is_replaced_by_the_next_write() -> None:
    state_file().parent.mkdir(parents=True)
    state_file().write_text("{not json")
    remember_profile("lookup")
    assert json.loads(state_file().read_text()) == {"last_profile": "lookup"}


def test_a_failed_write_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file where the state dir should be")
    remember_profile("fast")  # no exception
    assert last_profile() is None


def test_the_last_chat_is_remembered_with_when_it_was_left_and_the_profile_kept() -> None:
    from app.store.state import last_chat, remember_chat

    assert last_chat() is None
    remember_profile("fast")
    remember_chat(7, 1234.5)
    assert last_chat() == (7, 1234.5) and last_profile() == "fast"


@pytest.mark.parametrize("entry", ['7', '{"id": "7", "at": 1}', '{"id": 7}', '{"id": true, "at": 1}',
                                   '{"id": 7, "at": "x"}', '{"id": 7, "at": NaN}', '{"id": 7, "at": 1%s}' % ("0" * 400)])
def test_a_damaged_last_chat_remembers_nothing(entry: str) -> None:
    from app.store.state import last_chat

    state_file().parent.mkdir(parents=True)
    state_file().write_text('{"last_chat": %s}' % entry)
    assert last_chat() is None


def test_a_file_nested_beyond_the_parsers_depth_remembers_nothing_and_is_replaced() -> None:
    state_file().parent.mkdir(parents=True)
    state_file().write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    assert last_profile() is None
    remember_profile("fast")
    assert json.loads(state_file().read_text()) == {"last_profile": "fast"}


def test_a_draft_is_kept_once_taken_once_and_blank_is_nothing() -> None:
    from app.store.state import remember_draft, take_draft

    assert take_draft() is None
    remember_profile("fast")
    remember_draft("half a question\nand more")
    assert take_draft() == "half a question\nand more"
    assert take_draft() is None and last_profile() == "fast"  # taken once; the rest of the file kept
    remember_draft("  \n ")
    assert take_draft() is None
    state_file().write_text('{"draft": 7, "drafts": [3, ""]}')
    assert take_draft() is None
    state_file().write_text('{"draft": "kept by 0.x"}')  # how one draft used to be kept
    assert take_draft() == "kept by 0.x" and take_draft() is None


def test_a_window_closing_with_an_empty_box_leaves_anothers_unsent_text() -> None:
    from app.store.state import remember_draft, take_draft

    remember_draft("window A's eight careful lines")  # A closes with text in its box
    remember_draft("")  # then B, opened before, closes with an empty box
    remember_draft(None)
    assert take_draft() == "window A's eight careful lines"


def test_two_windows_closing_with_text_each_get_theirs_back_newest_first() -> None:
    from app.store.state import DRAFTS_KEPT, remember_draft, take_draft

    remember_draft("A's text")
    remember_draft("B's text")
    remember_draft("A's text")  # the same text again is kept once, as the newest
    assert [take_draft(), take_draft(), take_draft()] == ["A's text", "B's text", None]
    for n in range(DRAFTS_KEPT + 3):
        remember_draft(f"text {n}")
    assert [take_draft() for _ in range(DRAFTS_KEPT + 1)] == [f"text {n}" for n in range(DRAFTS_KEPT + 2, 2, -1)] + [None]


def test_the_state_file_is_readable_by_its_owner_only() -> None:
    from app.store.state import remember_draft

    remember_draft("private words")
    assert state_file().stat().st_mode & 0o077 == 0


def test_windows_changing_the_file_at_once_never_tear_it_nor_lose_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers in threads (each its own lock descriptor, as windows have), and a reader that must
    never find the file torn: every text kept by every writer is there to take afterwards."""
    import threading

    import app.store.state as state
    from app.store.state import remember_draft, take_draft

    per_writer, writers = 60, 3
    monkeypatch.setattr(state, "DRAFTS_KEPT", per_writer * writers)
    remember_profile("fast")
    done = threading.Event()
    torn: list[str] = []

    def read() -> None:
        while not done.is_set():
            try:
                text = state_file().read_text()
            except FileNotFoundError:
                continue
            try:
                json.loads(text)
            except ValueError:
                torn.append(text[:80])

    def write(w: int) -> None:
        for n in range(per_writer):
            remember_draft(f"window {w} text {n}")

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    assert torn == []
    taken = set(iter(take_draft, None))
    assert taken == {f"window {w} text {n}" for w in range(writers) for n in range(per_writer)}
    assert last_profile() == "fast"


def test_a_draft_comes_back_in_the_chat_it_was_typed_in_before_the_newest_of_another(specchat_dirs) -> None:
    """Two windows closed with text: window A's text (chat 1) came back in chat 2's box at the next
    start, the chat used last (a hostile tester's). A draft of the chat opened is taken first."""
    from app.store.state import remember_draft, take_draft, take_draft_for

    remember_draft("typed in chat 1", 1, "Name a planet.")
    remember_draft("typed in chat 2", 2, "Name a mountain.")
    remember_draft("typed in a new chat")
    draft = take_draft_for(1)
    assert draft is not None and (draft.text, draft.chat_id, draft.title) == ("typed in chat 1", 1, "Name a planet.")
    assert take_draft(7) == "typed in a new chat"  # none of chat 7: the newest
    assert take_draft(None) == "typed in chat 2" and take_draft(None) is None


def test_drafts_kept_before_they_named_their_chat_are_still_read(specchat_dirs) -> None:
    import json

    from app.store.state import state_file, take_draft

    state_file().parent.mkdir(parents=True)
    state_file().write_text(json.dumps({"drafts": ["an old one", "a newer one"]}))
    assert take_draft(3) == "a newer one" and take_draft(3) == "an old one" and take_draft() is None
