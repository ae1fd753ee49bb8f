"""A chat exported to Markdown, with its statistics."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.ui.export import chat_markdown, export_chat
from app.store.history import History
from tests.app.store.locking import mode


def test_export_markdown_with_stats(specchat_dirs: Path, tmp_path: Path) -> None:
    history = History.open()
    chat = history.create_chat("Code please", "fast", "Be brief.")
    history.add_message(chat, "user", "show code", profile="fast")
    history.add_message(chat, "assistant", "```python\nprint(1)\n```", profile="fast", finish_reason="cancelled",
                        stats={"mode": "spec", "drafter": "model", "k": 4, "adaptive": True, "alpha": 0.8,
                               "tau": 3.2, "tokens_per_s": 50.0, "itl_ms": 20.0, "speedup": 2.5, "tokens": 9,
                               "proposed": 5})
    path = export_chat(history, chat)
    assert path.parent == specchat_dirs / "exports" and mode(path) == 0o600 and mode(path.parent) == 0o700
    text = path.read_text()
    assert text.startswith("# Code please") and "Be brief." in text and "```python\nprint(1)\n```" in text
    assert "accepted 80% of proposed" in text and "2.50×" in text  # named as the HUD names it
    assert "K 4 (adaptive)" in text and "*(stopped)*" in text
    custom = export_chat(history, chat, tmp_path / "out" / "chat.md")
    assert custom.read_text() == text and mode(custom) == 0o600


def test_a_failed_reply_is_exported_with_why_and_its_figures_without_it(specchat_dirs: Path) -> None:
    history = History.open()
    chat = history.create_chat("Down", "srv", None)
    history.add_message(chat, "user", "hi", profile="srv")
    history.add_message(chat, "assistant", "Hel", profile="srv", finish_reason="error",
                        stats={"mode": "plain", "drafter": "none", "tokens": 1, "tokens_per_s": 5.0,
                               "error": "u: the server closed\nthe stream"})
    history.add_message(chat, "assistant", "", profile="srv", finish_reason="error", stats={"error": "refused"})
    text = chat_markdown(history, chat)
    assert "*(failed: u: the server closed the stream)*" in text and "*(failed: refused)*" in text
    assert text.count("> mode ") == 1 and "error" not in text.split("> mode ")[1].splitlines()[0]


def test_export_gives_each_mode_its_share_of_the_tokens(specchat_dirs: Path) -> None:
    history = History.open()
    chat = history.create_chat("Summary", "pocket", None)
    history.add_message(chat, "user", "summarise", profile="pocket")
    history.add_message(chat, "assistant", "text", profile="pocket", finish_reason="eos",
                        stats={"mode": "plain", "drafter": "n-gram lookup", "alpha": 0.54, "alpha_per_token": 0.8,
                               "proposed": 50, "tokens": 100, "mode_tokens": {"ngram": 72, "plain": 28},
                               "plain_rounds": 31, "plain_tokens_per_s": 95.0, "plain_measured_tokens_per_s": 97.0,
                               "speedup": 1.3, "speedup_se": 0.05})
    history.add_message(chat, "user", "again", profile="pocket")
    history.add_message(chat, "assistant", "short", profile="pocket", finish_reason="eos",
                        stats={"mode": "ngram", "proposed": 5, "tokens": 8, "plain_tokens_per_s": 4.8,
                               "plain_rounds": 1, "plain_measured_tokens_per_s": 89.0})
    text = export_chat(history, chat).read_text()
    assert "mode lookup on 72% · plain 28%" in text and "plain decoding" not in text
    assert "α/token 0.80" in text and "accepted 54% of proposed" in text
    assert "31 K=0 rounds: 97.0 tok/s" in text
    assert "4.8" not in text and "89.0" not in text  # no speedup shown for it: no plain estimate beside it


def test_export_stats_line_says_speculation_off_once_and_uses_times_sign() -> None:
    from app.ui.export import stats_line

    line = stats_line({"mode": "plain", "tokens": 3, "speedup": 0.05,
                       "speculation_off_reason": "speculation switched off: 0.05× over the last 32 rounds"})
    assert line.count("speculation") == 1 and "0.05×" in line and "0.05x" not in line
    assert "speculation off: switched off by you" in stats_line({"speculation_off_reason": "switched off by you"})


def test_export_never_replaces_an_existing_file_nor_changes_its_mode(specchat_dirs: Path, tmp_path: Path) -> None:
    from app.ui.export import ask_export

    history = History.open()
    chat = history.create_chat("Notes", "fast")
    history.add_message(chat, "user", "hello", profile="fast")
    target = tmp_path / "chat.md"
    target.write_text("my own notes\n")
    target.chmod(0o644)
    written = export_chat(history, chat, target)
    assert written == tmp_path / "chat-2.md" and written.read_text().startswith("# Notes")
    assert target.read_text() == "my own notes\n" and mode(target) == 0o644
    again = export_chat(history, chat, target)
    assert again == tmp_path / "chat-3.md" and (tmp_path / "chat-2.md").read_text() == again.read_text()
    told: list[tuple[str, str]] = []
    _screen, done = ask_export(history, chat, "Notes", lambda text, severity: told.append((text, severity)))
    done(str(target))
    assert told == [(f"{target} exists and was left as it was; exported to {tmp_path / 'chat-4.md'}", "warning")]
    assert target.read_text() == "my own notes\n" and mode(target) == 0o644


def test_unsaved_transcript_export_is_inert() -> None:
    """What quit exports when the history cannot take it is made inert like F9's export."""
    from app.ui.export import transcript_markdown
    from tests.hostile import ALL, raw_in

    text = transcript_markdown(f"title {ALL}", [("user", f"ask {ALL}"), ("assistant", f"reply {ALL}")], f"unsent {ALL}")
    assert raw_in(text) == []
    assert text.count("␛]52;c;cm0gLXJmIH4=␇") == 4


def test_export_to_a_folder_writes_the_default_name_inside_it(specchat_dirs: Path, tmp_path: Path) -> None:
    history = History.open()
    chat = history.create_chat("Notes", "fast")
    history.add_message(chat, "user", "hello", profile="fast")
    folder = tmp_path / "out"
    folder.mkdir()
    written = export_chat(history, chat, folder)  # was a new file "out-2" beside the folder
    assert written == folder / f"notes-{chat}.md" and written.read_text().startswith("# Notes")
    assert not (tmp_path / "out-2").exists()


def test_export_marks_replies_answered_again_and_names_the_chats_sampling(specchat_dirs: Path) -> None:
    """Two replies to one prompt read as a conversation's two turns, and the sampling was left out
    (a new user's review)."""
    history = History.open()
    chat = history.create_chat("Colours", "fast", "Be brief.", sampling={"temperature": 0.7, "top_p": 0.9, "seed": 42})
    history.add_message(chat, "user", "name a colour", profile="fast")
    first = history.add_message(chat, "assistant", "red", profile="fast", finish_reason="eos")
    history.mark_superseded(chat, first)
    history.add_message(chat, "assistant", "blue", profile="fast", finish_reason="eos")
    text = export_chat(history, chat).read_text()
    assert "- Sampling: T 0.7 · top-p 0.9 · seed 42 (what the chat sets; the rest as its profile sets)" in text
    other = history.create_chat("Seeded", "warm", sampling={"seed": 5})  # its profile samples at T 0.7
    assert "- Sampling: seed 5 (what the chat sets" in export_chat(history, other).read_text()  # was "greedy"
    assert "## Assistant (fast) · earlier reply, answered again below\n\nred" in text
    assert "## Assistant (fast)\n\nblue" in text and text.count("earlier reply") == 1
    assert "## System prompt (the chat's as it is now)\n\nBe brief." in text


def test_export_marks_a_reply_answered_again_as_ctrl_r_saves_it(specchat_dirs: Path) -> None:
    """ctrl+r saves a second reply after the first without marking the first (the screen reads two
    replies in a row as one answered again): the export reads them the same way (a reviewer's
    export showed two plain replies back to back)."""
    history = History.open()
    chat = history.create_chat("Cats", "fast", None)
    history.add_message(chat, "user", "three names for a cat", profile="fast")
    history.add_message(chat, "assistant", "Tom", profile="fast", finish_reason="eos")
    history.add_message(chat, "assistant", "Felix", profile="fast", finish_reason="eos")
    text = export_chat(history, chat).read_text()
    assert "## Assistant (fast) · earlier reply, answered again below\n\nTom" in text
    assert "## Assistant (fast)\n\nFelix" in text and text.count("earlier reply") == 1


def test_the_export_dialog_takes_a_folder_a_new_folder_and_refuses_impossible_names_without_crashing(
        specchat_dirs: Path, tmp_path: Path) -> None:
    """A hostile tester's paths: a name over 255 bytes or with a NUL ended the app (the check for a
    folder ran outside the error handling); a folder was called "exists and was left as it was";
    ``newdir/`` made a file called newdir."""
    from app.ui.export import ask_export

    history = History.open()
    chat = history.create_chat("Notes", "fast")
    history.add_message(chat, "user", "hello", profile="fast")
    told: list[tuple[str, str]] = []
    _screen, done = ask_export(history, chat, "Notes", lambda text, severity: told.append((text, severity)))
    folder = tmp_path / "out"
    folder.mkdir()
    done(str(folder))
    assert told.pop() == (f"Exported to {folder / f'notes-{chat}.md'}", "information")
    done(f"{tmp_path / 'new' / 'dir'}/")
    assert told.pop() == (f"Exported to {tmp_path / 'new' / 'dir' / f'notes-{chat}.md'}", "information")
    done(str(tmp_path / ("y" * 300 + ".md")))
    text, severity = told.pop()
    assert severity == "error" and text.startswith(f"Could not export to {tmp_path / 'y'}") and "too long" in text
    done(str(tmp_path / "nul\0.md"))
    assert told.pop() == ("Could not export: a file path cannot hold a NUL character.", "error")
    assert not list(tmp_path.glob("y*")) and not list(tmp_path.glob("nul*"))


async def _export_with_f9(pilot, app, path: Path) -> None:  # type: ignore[no-untyped-def]
    from app.ui.screens.edit import EditScreen
    from tests.app.helpers import wait_for

    await pilot.press("f9")
    await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
    app.screen.query_one("#edit-value").value = str(path)
    await pilot.press("enter")
    await wait_for(pilot, lambda: path.exists())


@pytest.mark.anyio
async def test_f9_exports_a_private_chat_and_replies_the_history_has_not_taken_from_the_screen(
        make_app, specchat_dirs: Path, tmp_path: Path, short_busy: None) -> None:  # type: ignore[no-untyped-def]
    """F9 in a private chat said "Nothing to export yet." with a conversation on screen; with
    history writes failing it exported the file's copy, the new exchange missing, and said
    "Exported to …" (a tester)."""
    from tests.app.helpers import ready, send, wait_for
    from tests.app.ui.test_quit import _unsaved_reply

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await app.action_new_chat(private=True)
        await send(pilot, "a private question")
        await wait_for(pilot, lambda: not app.conversation.generating and len(app.conversation.messages()) == 2)
        await _export_with_f9(pilot, app, tmp_path / "private.md")
        text = (tmp_path / "private.md").read_text()
        assert "A private chat, never saved, exported from the screen" in text
        assert "a private question" in text and "Hello there!" in text
        await app.action_new_chat()
        await _unsaved_reply(pilot, app)  # the second exchange is not in the history
        await _export_with_f9(pilot, app, tmp_path / "behind.md")
        text = (tmp_path / "behind.md").read_text()
        assert "the history had not taken all of it" in text and "my unsaved question" in text
        await app.action_new_chat()
        await pilot.press("f9")
        await wait_for(pilot, lambda: any("Nothing to export yet." in n.message for n in app._notifications))


def test_a_reply_stopped_before_its_first_token_is_not_said_to_be_decoded_plainly() -> None:
    """Enter then Esc at once: the footer read "speculative · lookup · 0 tokens", the export
    "speedup none (decoded plainly)" (a tester)."""
    from app.ui.export import stats_line

    line = stats_line({"mode": "spec", "drafter": "lookup", "tokens": 0, "proposed": 0})
    assert "speedup none (no tokens)" in line and "decoded plainly" not in line
    assert "speedup none (decoded plainly)" in stats_line({"mode": "plain", "tokens": 5, "proposed": 0})


def test_a_plain_replys_export_shows_no_drafting_figures() -> None:
    """A reply decoded plainly read 'K 0 (adaptive) · acceptance rate — (accepted ÷ proposed) ·
    α per token —': figures of drafting that never happened."""
    from app.ui.export import stats_line

    line = stats_line({"mode": "plain", "drafter": "n-gram lookup", "k": 0, "adaptive": True, "proposed": 0,
                       "tokens": 5, "tau": 1.0, "speedup_note": "decoded plainly"})
    assert "K 0" not in line and "accepted" not in line and "α/token" not in line and "τ 1.00" in line


def test_a_reply_still_streaming_is_exported_as_being_written_not_as_never_saved(specchat_dirs: Path) -> None:
    """F9 during a reply wrote "unfinished: its end was never saved" (a hostile tester's)."""
    from app.store.saver import HistorySaver
    from app.store.pending import ChatRef

    history = History.open()
    saver = HistorySaver(history)
    try:
        chat = ChatRef("streaming", "fast")
        record = saver.start_reply(chat, "hi", "fast")
        saver.update(record, "Once upon", [("Once upon", "target")], None)
        assert saver.flush(5) and chat.id is not None and saver.writing() == {record.assistant_id}
        text = chat_markdown(history, chat.id, saver.writing())
        assert "*(still being written when exported)*" in text and "never saved" not in text
        assert "*(unfinished: its end was never saved)*" in chat_markdown(history, chat.id)  # another app's
        saver.update(record, "Once upon a time.", [("Once upon a time.", "target")], None, "eos")
        assert saver.flush(5) and saver.writing() == set()
    finally:
        saver.close(1.0)
        history.close()
