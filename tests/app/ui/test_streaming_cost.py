"""What keeps streaming cheap: the engine's threads, code-block highlighting, HUD updates."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Markdown, Static
from textual.widgets._markdown import MarkdownBlock, MarkdownBullet

import app.ui.app as app_module
from app.ui.app import SpecChatApp
from app.ui.loading import UI_NICE, engine_threads, ui_nice
from app.ui.widgets.chat_view import AssistantMessage
from app.ui.widgets.reply_markdown import ReplyFence, ReplyMarkdown, known_language
from app.ui.widgets.hud import Hud
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio


def test_the_engine_leaves_the_ui_a_core_unless_the_ui_yields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECCHAT_THREADS", raising=False)
    monkeypatch.delenv("SPECCHAT_UI_NICE", raising=False)
    assert ui_nice() == UI_NICE == 0
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert engine_threads() == 1
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert engine_threads() == 7
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert engine_threads() is None  # torch's default
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.setenv("SPECCHAT_UI_NICE", "10")
    assert ui_nice() == 10 and engine_threads() is None  # the UI yields: every core
    monkeypatch.setenv("SPECCHAT_THREADS", "3")
    assert engine_threads() == 3


def test_code_blocks_are_highlighted_by_name_never_by_guessing() -> None:
    assert known_language("python") == "python"
    assert known_language("") == "text"  # no guesser run over the code at every paint
    assert known_language("no-such-language-at-all") == "text"  # no plugin search at every paint
    highlighted = ReplyFence.highlight("def f():\n    return 1\n", "python")
    assert highlighted.plain.startswith("def f()") and highlighted.spans  # still coloured


async def test_a_streamed_code_block_of_an_unknown_language_renders(make_app: Callable[..., SpecChatApp],
                                                                    loader: FakeLoader) -> None:
    loader.backend_kwargs["script"] = [[("```weird-", "draft"), ("lang\nx", "target")], [(" = 1\n```\nDone.", "target")]]
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "code please")
        await wait_for(pilot, lambda: not app.conversation.generating)
        reply = app.query(AssistantMessage).last()
        assert reply.text.startswith("```weird-lang") and reply.query_one(ReplyFence).code == "x = 1"


async def test_the_hud_redraws_only_the_parts_that_changed(make_app: Callable[..., SpecChatApp],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        hud = app.query_one(Hud)
        hud.flush(force=True)
        updated: list[str | None] = []
        original = Static.update

        def spy(self: Static, *args: object, **kwargs: object) -> None:
            updated.append(self.id)
            original(self, *args, **kwargs)

        monkeypatch.setattr(Static, "update", spy)
        hud.flush(force=True)  # nothing changed
        assert updated == []
        hud.set_notice("draft dropped")
        hud.flush()
        assert set(updated) <= {"hud-line", "hud-engine"} and updated


def shape(markdown: Markdown) -> list[tuple[str, str]]:
    """What a Markdown widget shows: each block's kind and text, bullets included."""
    out = []
    for widget in markdown.query("*"):
        if isinstance(widget, MarkdownBullet):
            out.append(("bullet", widget.symbol))
        elif isinstance(widget, Static):
            out.append((type(widget).__name__.removeprefix("Reply"), widget.render().plain))
        elif isinstance(widget, MarkdownBlock):
            out.append((type(widget).__name__.removeprefix("Reply"), ""))
    return out


LISTS = (
    "Steps:\n\n" + "".join(f"{i}. Step number {i}, with **bold** and `code`.\n" for i in range(1, 13))
    + "\nThen:\n\n- one\n- two\n  - nested a\n  - nested b\n- three, which goes on\n  for a second line\n\n"
    + "* a\n* b\n\nDone.\n"
)


@pytest.mark.parametrize("chunk", [1, 7, 40])
async def test_a_list_streamed_in_pieces_shows_what_a_fresh_parse_shows(chunk: int) -> None:
    """Lists keep their rows while they stream (only the last row is rebuilt); at
    every paint the result must equal rendering the text so far from scratch."""

    class Two(App[None]):
        def compose(self) -> ComposeResult:
            yield ReplyMarkdown(id="streamed")
            yield ReplyMarkdown(id="fresh")

    app = Two()
    async with app.run_test(size=(100, 200)) as pilot:
        streamed, fresh = app.query_one("#streamed", ReplyMarkdown), app.query_one("#fresh", ReplyMarkdown)
        checked = 0
        for end in range(chunk, len(LISTS) + chunk, chunk):
            await streamed.append(LISTS[end - chunk:end])
            if end % (chunk * 5) == 0 or end >= len(LISTS):
                await fresh.update(LISTS[:end])
                await pilot.pause()
                assert shape(streamed) == shape(fresh), LISTS[:end]
                checked += 1
        assert checked >= 3 and ("bullet", " 12. ") in shape(streamed)


@pytest.mark.parametrize("finish_reason", ["eos", "cancelled", "error"])
async def test_a_finished_reply_is_styled_as_a_full_restyle_would_style_it(finish_reason: str) -> None:
    """The end of a reply (and F4) restyles the box and its children only, not every block
    of the reply (app.ui.widgets.chat_view): nothing deeper may depend on those classes."""

    class One(App[None]):
        CSS_PATH = str(Path(app_module.__file__).with_name(SpecChatApp.CSS_PATH))

        def compose(self) -> ComposeResult:
            yield AssistantMessage("fast")

    def look(message: AssistantMessage) -> list[tuple[str, str]]:
        return [(repr(node), str(node.styles.base.css_lines)) for node in message.walk_children(with_self=True)]

    app = One()
    async with app.run_test(size=(100, 60)) as pilot:
        message = app.query_one(AssistantMessage)
        await message.append(LISTS, [])
        await message.finish(finish_reason, None)
        await pilot.pause()
        cheap = look(message)
        app.update_styles(message)  # what Textual does on a class change: every descendant
        await pilot.pause()
        assert look(message) == cheap
        for show in (True, False):  # F4, the colour view: the same kind of class
            message.set_show_sources(show)
            await pilot.pause()
            cheap = look(message)
            app.update_styles(message)
            await pilot.pause()
            assert look(message) == cheap and message.query_one(".sources").display == show
        assert not message.has_class("-streaming")
        assert message.has_class("-stopped") == (finish_reason == "cancelled")
        assert message.has_class("-error") == (finish_reason == "error")
