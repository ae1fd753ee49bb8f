"""Copy, regenerate, edit the last prompt, the HUD's fold, the footer, the last profile remembered."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from textual.widgets import Button, Footer

from app.ui.app import SpecChatApp
from app.ui.screens.copy import CopyScreen, code_blocks, copy_choices
from app.ui.screens.edit import EditScreen
from app.ui.screens.help import help_markdown
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from app.ui.widgets.hud import Hud
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio


async def asked(pilot, text: str) -> SpecChatApp:  # type: ignore[no-untyped-def]
    app = pilot.app
    await send(pilot, text)
    await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage).last().finish_reason)
    return app


def saved_chat_id(app: SpecChatApp) -> int:
    """The chat's id once everything in it is written."""
    assert app.archive.saver is not None and app.archive.saver.flush(5) and app.conversation.chat_id is not None
    return app.conversation.chat_id


@asynccontextmanager
async def reopened(make_app: Callable[..., SpecChatApp], chat_id: int) -> AsyncIterator[tuple[SpecChatApp, Any]]:
    """A fresh app (a restart) with chat ``chat_id`` opened from the history."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await app.open_chat(chat_id)
        await pilot.pause()
        yield app, pilot


def test_code_blocks_and_copy_choices() -> None:
    reply = "Here:\n\n```python\nprint('hi')\n```\n\nand\n\n```\nls -l\n```\n"
    assert code_blocks(reply) == [("python", "print('hi')\n"), ("", "ls -l\n")]
    # HTML read as text, as the reply is shown: after "<details>" the fence was HTML here, no block (a review's)
    assert code_blocks("<details>\n```py\nx = 1\n```\n") == [("py", "x = 1\n")]
    choices = copy_choices([("user", "show code"), ("assistant", reply)])
    assert choices[0].text == reply and choices[0].label.startswith("Last reply")
    assert [c.text for c in choices[1:3]] == ["print('hi')\n", "ls -l\n"]
    assert "python · 1 line" in choices[1].label
    assert [c.text for c in choices[3:]] == ["show code"]  # the last reply once, not again as "Reply"
    earlier = copy_choices([("user", "a"), ("assistant", "one"), ("user", "b"), ("assistant", "two")])
    assert [c.label.split(" · ")[0] for c in earlier] == ["Last reply", "You", "Reply", "You"]
    assert [c.text for c in earlier] == ["two", "b", "one", "a"]
    assert copy_choices([]) == []


async def test_copy_last_reply_message_and_code_block(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await asked(pilot, "Show me some code")
        reply = app.query_one(AssistantMessage).text
        await pilot.press("f7")
        await wait_for(pilot, lambda: isinstance(app.screen, CopyScreen))
        await pilot.press("enter")  # the first choice: the last reply
        await wait_for(pilot, lambda: not isinstance(app.screen, CopyScreen))
        assert app.clipboard == reply
        await pilot.press("f7")
        await wait_for(pilot, lambda: isinstance(app.screen, CopyScreen))
        await pilot.press("down", "enter")  # the code block
        await wait_for(pilot, lambda: not isinstance(app.screen, CopyScreen))
        assert app.clipboard == "print('hi')\n"
        await pilot.press("f7")
        await wait_for(pilot, lambda: isinstance(app.screen, CopyScreen))
        await pilot.press("end", "enter")  # the oldest message: the prompt
        await wait_for(pilot, lambda: not isinstance(app.screen, CopyScreen))
        assert app.clipboard == "Show me some code"
        await app.run_action("copy_last_code")
        assert app.clipboard == "print('hi')\n"


async def test_regenerate_keeps_the_earlier_reply_and_sends_only_the_new_one(
    make_app: Callable[..., SpecChatApp], loader: FakeLoader, specchat_dirs
) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await asked(pilot, "first")
        await asked(pilot, "second")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(loader.backends[0].calls) == 3 and not app.conversation.generating)
        replies = list(app.query(AssistantMessage))
        assert len(replies) == 3 and replies[1].has_class("-superseded") and not replies[2].has_class("-superseded")
        greedy = [n for n in app._notifications if "Temperature 0 (greedy) writes the same reply again" in n.message]
        assert len(greedy) == 1  # an ollama user expects another answer from ctrl+r: said, once
        assert len(app.query(UserMessage)) == 2
        sent = [(m.role, m.content) for m in loader.backends[0].calls[2]][1:]
        assert sent == [("user", "first"), ("assistant", replies[0].text), ("user", "second")]
        chat_id = saved_chat_id(app)
    # Reopened: the prompt is saved once, the earlier reply dimmed and left out of the context.
    async with reopened(make_app, chat_id) as (app, pilot):
        assert [m.text for m in app.query(UserMessage)] == ["first", "second"]
        assert [r.has_class("-superseded") for r in app.query(AssistantMessage)] == [False, True, False]
        assert [t.role for t in app.conversation.turns()] == ["user", "assistant", "user", "assistant"]


async def test_edit_last_prompt_asks_again(make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await asked(pilot, "Summarise this")
        await asked(pilot, "Now shorten th")
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        assert str(app.screen.query_one("#save", Button).label) == "Ask again"
        await pilot.press("i", "s", "space", "t", "e", "x", "t")  # typed at the end (the cursor sat at the start: "is textNow shorten th")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: len(loader.backends[0].calls) == 3 and not app.conversation.generating)
        users = list(app.query(UserMessage))
        assert [u.text for u in users] == ["Summarise this", "Now shorten th", "Now shorten this text"]
        assert users[1].has_class("-superseded")
        first_reply = app.query(AssistantMessage).first().text
        expected = [("user", "Summarise this"), ("assistant", first_reply), ("user", "Now shorten this text")]
        assert [(m.role, m.content) for m in loader.backends[0].calls[2]][1:] == expected
        chat_id = saved_chat_id(app)
    # Reopened: the edited-away exchange is shown dimmed and never sent to the model again.
    async with reopened(make_app, chat_id) as (app, pilot):
        assert [u.has_class("-superseded") for u in app.query(UserMessage)] == [False, True, False]
        assert [r.has_class("-superseded") for r in app.query(AssistantMessage)] == [False, True, False]
        await asked(pilot, "And a title?")
        sent = [m.content for m in loader.backends[-1].calls[-1] if m.role == "user"]
        assert sent == ["Summarise this", "Now shorten this text", "And a title?"]


async def test_hud_folds_to_one_line_on_narrow_terminals_and_toggles(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        hud = app.query_one(Hud)
        await pilot.pause()
        assert hud.has_class("-line") and hud.region.height == 1
        assert app.conversation.chat_log.region.width >= 70
        await asked(pilot, "hi")
        hud.flush()
        line = str(hud.query_one("#hud-line").render())
        assert "fast" in line and "tok/s" in line and "F6: full HUD" in line
        await pilot.press("f6")
        await pilot.pause()
        assert not hud.has_class("-line") and hud.region.width == 40
        await pilot.press("f6")
        await pilot.pause()
        assert hud.has_class("-line")
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        hud = app.query_one(Hud)
        assert hud.has_class("-line")
        await pilot.resize_terminal(140, 30)
        await wait_for(pilot, lambda: not hud.has_class("-line"))
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        assert not app.query_one(Hud).has_class("-line")


async def test_quit_is_in_the_footer_and_help(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        footer_keys = {b.binding.action for b in app.screen.active_bindings.values() if b.binding.show}
        assert {"quit", "copy", "toggle_hud"} <= footer_keys
        assert app.query_one(Footer)
        text = help_markdown([("App", app.BINDINGS)])
        for needle in ("`ctrl+q` | Quit", "`f7` | Copy", "`ctrl+r` | Regenerate", "`f6` | HUD"):
            assert needle in text


async def test_last_profile_is_remembered(make_app: Callable[..., SpecChatApp], loader: FakeLoader,
                                          tmp_path) -> None:
    from app.store.state import last_profile, state_file

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.engine.profile.name == "fast"
        app.switch_profile("lookup")
        await wait_for(pilot, lambda: app.engine.backend is not None and app.engine.profile.name == "lookup" and not app.engine.loading)
    assert last_profile() == "lookup" and state_file().is_relative_to(tmp_path / "state")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.engine.profile.name == "lookup"
    app = make_app(profile="fast")  # --profile still wins
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.engine.profile.name == "fast"
    state_file().write_text("{not json")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.engine.profile.name == "fast"  # unreadable state: the default, no error


async def test_reopened_chat_continues_with_its_own_profile(make_app: Callable[..., SpecChatApp],
                                                             loader: FakeLoader) -> None:
    app = make_app(profile="lookup")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await asked(pilot, "with lookup")
        chat_id = app.conversation.chat_id
        assert app.archive.saver is not None and app.archive.saver.flush(5)
    app = make_app(profile="fast")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await app.open_chat(chat_id)
        await wait_for(pilot, lambda: app.engine.backend is not None and app.engine.profile.name == "lookup" and not app.engine.loading)
        assert [m.text for m in app.query(UserMessage)] == ["with lookup"]


async def test_ctrl_r_or_ctrl_g_right_after_esc_waits_for_the_stop_instead_of_being_refused(
        make_app: Callable[..., SpecChatApp]) -> None:
    """Keys are taken in the order typed: Esc then ctrl+r (100-500 ms apart on a loaded machine) said
    "Wait for the reply to finish (or press Esc to stop it)" and regenerated nothing."""
    long = [[(f"w{i} ", "target")] for i in range(400)]
    loader = FakeLoader(delay=0.05, script=long)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "tell me a long story")
        await wait_for(pilot, lambda: "w3" in (app.query(AssistantMessage).last().text or ""))
        app.action_stop()  # Esc, then ctrl+r before the reply's end has come back
        app.action_regenerate()
        await wait_for(pilot, lambda: len(loader.backends[0].calls) == 2)
        replies = list(app.query(AssistantMessage))
        assert len(replies) == 2 and replies[0].has_class("-superseded")
        await wait_for(pilot, lambda: "w3" in (app.query(AssistantMessage).last().text or ""))
        app.action_stop()
        app.action_edit_last_prompt()
        await wait_for(pilot, lambda: isinstance(app.screen, EditScreen))
        assert not any("Wait for the reply to finish" in n.message for n in app._notifications)


async def test_esc_says_stopping_at_once_while_the_engines_end_of_the_reply_is_on_its_way(
        make_app: Callable[..., SpecChatApp]) -> None:
    """An engine slow to answer Esc (busy, or SIGSTOPped) left "generating…" for up to 10 s, as if
    Esc had not been read (a hostile tester's)."""
    from textual.widgets import Static

    long = [[(f"w{i} ", "target")] for i in range(400)]
    app = make_app(loader=FakeLoader(delay=0.05, script=long))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "tell me a long story")
        await wait_for(pilot, lambda: "w3" in (app.query(AssistantMessage).last().text or ""))
        reply = app.query(AssistantMessage).last()
        footer = reply.query_one(".reply-footer", Static)
        assert str(footer.render()) == "generating…"
        app.action_stop()
        assert str(footer.render()) == "stopping…"  # before the engine's end has come back
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert str(footer.render()).startswith("■ stopped")
