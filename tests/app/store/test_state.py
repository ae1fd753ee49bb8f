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
    assert last_profile() == "fast" and not state_file().with_suffix(".tmp").exists()


def test_the_same_profile_again_does_not_rewrite_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    remember_profile("fast")
    written: list[str] = []
    monkeypatch.setattr(Path, "write_text", lambda self, *a, **k: written.append(str(self)))
    remember_profile("fast")
    assert written == []


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
                                   '{"id": 7, "at": "x"}', '{"id": 7, "at": NaN}'])
def test_a_damaged_last_chat_remembers_nothing(entry: str) -> None:
    from app.store.state import last_chat

    state_file().parent.mkdir(parents=True)
    state_file().write_text('{"last_chat": %s}' % entry)
    assert last_chat() is None


def test_a_draft_is_kept_once_taken_once_and_blank_is_nothing() -> None:
    from app.store.state import remember_draft, take_draft

    assert take_draft() is None
    remember_profile("fast")
    remember_draft("half a question\nand more")
    assert take_draft() == "half a question\nand more"
    assert take_draft() is None and last_profile() == "fast"  # taken once; the rest of the file kept
    remember_draft("kept")
    remember_draft("  \n ")  # the box emptied before the next quit: nothing comes back
    assert take_draft() is None
    state_file().write_text('{"draft": 7}')
    assert take_draft() is None
