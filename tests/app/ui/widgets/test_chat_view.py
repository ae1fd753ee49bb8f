"""Messages on screen: the colour view of a reply's pieces, and the states a message shows."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

import app.ui.app as app_module
from app.ui.app import SpecChatApp
from app.ui.widgets.chat_log import ChatLog
from app.ui.widgets.chat_view import AssistantMessage, UserMessage, legend
from tests.app.ui.widgets.test_reply_markdown import LISTS

pytestmark = pytest.mark.anyio


class OneReply(App[None]):
    """The app's stylesheet and one reply, empty."""

    CSS_PATH = str(Path(app_module.__file__).with_name(SpecChatApp.CSS_PATH))

    def compose(self) -> ComposeResult:
        yield AssistantMessage("fast")


def test_colour_view_reads_markdown_and_keeps_each_tokens_colour() -> None:
    from app.ui.widgets.chat_view import SOURCE_STYLES, pieces_content

    pieces = [("## Plan\n", "draft"), ("Run:\n\n```sh\n", "target"), ("ls -l\n", "draft"), ("```\n", "target"),
              ("done", "draft")]
    content = pieces_content(pieces)
    assert content.plain == "Plan\nRun:\n\n  ls -l\ndone"

    def style_at(i: int) -> str:
        return next(str(s.style) for s in content.spans if s.start <= i < s.end)

    plain = content.plain
    assert style_at(plain.index("ls")) == SOURCE_STYLES["draft"]
    assert style_at(plain.index("Run")) == SOURCE_STYLES["target"]
    assert style_at(plain.index("Plan")) == SOURCE_STYLES["draft"] + " bold"
    assert SOURCE_STYLES["draft"] != SOURCE_STYLES["target"]


def test_the_colour_view_counts_lines_as_markdown_does_whatever_other_separators_the_text_holds() -> None:
    """U+2028 and U+2029 end lines for str.splitlines, not for markdown-it: every heading and fence
    after one fell on the wrong line, "# Heading" shown with its mark and the text after it hidden
    (a hostile tester's)."""
    from app.ui.widgets.chat_view import pieces_content

    text = "Line one\u2028still line one\u2029para\n\n# Heading\n\nText after heading.\n\n```python\nprint('x')\n```\n\nEnd."
    plain = pieces_content([(text, "target")]).plain
    assert plain == ("Line one\u2028still line one\u2029para\n\nHeading\n\nText after heading.\n\n"
                     "  print('x')\n\nEnd.")
    assert pieces_content([("a\n```\ncode", "target")]).plain == "a\n  code"  # the last line, unended, is code too
    assert pieces_content([("<details>\n```py\nx = 1\n```\n", "target")]).plain == "<details>\n  x = 1\n"  # not HTML


def test_a_prompt_shows_whether_it_waits_and_whether_it_was_asked_again() -> None:
    prompt = UserMessage("hi")
    prompt.set_waiting("waiting for the reply above")
    assert prompt.waiting and prompt.border_subtitle == "⧗ waiting for the reply above"
    prompt.set_waiting(None)
    assert not prompt.waiting and prompt.border_subtitle == ""
    prompt.set_superseded()
    assert prompt.superseded and prompt.border_title == "you · earlier"


def test_a_reply_waits_until_it_is_finished_and_says_when_it_was_answered_again() -> None:
    reply = AssistantMessage("fast")
    assert reply.streaming and reply.waiting and not reply.superseded
    done = AssistantMessage("fast", text="ok", finish_reason="eos")
    assert not done.waiting
    done.set_superseded()
    assert done.superseded and done.border_title == "fast · earlier reply"


@pytest.mark.parametrize("finish_reason", ["eos", "cancelled", "error"])
async def test_a_finished_reply_is_styled_as_a_full_restyle_would_style_it(finish_reason: str) -> None:
    """The end of a reply (and F4) restyles the box and its children only, not every block
    of the reply (app.ui.widgets.chat_view): nothing deeper may depend on those classes."""

    def look(message: AssistantMessage) -> list[tuple[str, str]]:
        return [(repr(node), str(node.styles.base.css_lines)) for node in message.walk_children(with_self=True)]

    app = OneReply()
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


class Log(App[None]):
    CSS_PATH = str(Path(app_module.__file__).with_name(SpecChatApp.CSS_PATH))

    def __init__(self, *messages: Any) -> None:
        super().__init__()
        self.messages = messages

    def compose(self) -> ComposeResult:
        yield ChatLog(*self.messages)


def footer(message: AssistantMessage) -> str:
    return str(message.query_one(".reply-footer", Static).render())


def test_a_prompt_knows_its_saved_row() -> None:
    class Record:
        user_id = 12

    assert UserMessage("hi").saved_id() is None
    sent = UserMessage("hi")
    sent.record = Record()
    assert sent.saved_id() == 12  # saved by the saver in this session
    assert UserMessage("hi", message_id=3).saved_id() == 3  # loaded from the history


def test_a_reply_without_pieces_is_all_the_targets() -> None:
    assert AssistantMessage("fast", text="ok", finish_reason="eos").pieces == [("ok", "target")]
    assert AssistantMessage("fast").pieces == []
    merged = AssistantMessage("fast", text="ab", pieces=[("a", "draft"), ("b", "draft")], finish_reason="eos")
    assert merged.pieces == [("ab", "draft")] and AssistantMessage(None).border_title == "assistant"
    assert legend().plain == " draft accepted    target produced "


@pytest.mark.parametrize("finish_reason, shown", [
    ("eos", ""), ("cancelled", "■ stopped"), ("error", "✗ failed"), ("length", "… length limit"),
    ("context", "… context window full"),
])
async def test_the_footer_says_how_a_reply_ended(finish_reason: str, shown: str) -> None:
    reply = AssistantMessage("fast", text="ok", finish_reason=finish_reason)
    async with Log(reply).run_test(size=(80, 30)):
        assert footer(reply) == shown


async def test_a_reply_streams_then_finishes_with_its_figures() -> None:
    reply = AssistantMessage("fast")
    async with Log(reply).run_test(size=(80, 30)) as pilot:
        # before its first token the engine reads the prompt (a long paste said "generating…" a minute)
        assert footer(reply) == "reading the prompt…" and reply.has_class("-streaming")
        await reply.append("Hello", [("Hel", "draft"), ("lo", "draft")])
        assert footer(reply) == "generating…"
        await reply.append("", [("ignored", "target")])  # no text: nothing changes
        await reply.append(" there", [(" there", "target")])
        assert reply.text == "Hello there" and reply.pieces == [("Hello", "draft"), (" there", "target")]
        stats = {"mode": "spec", "proposed": 4, "alpha": 0.5, "alpha_per_token": 0.6, "tau": 2.0,
                 "tokens_per_s": 40.0, "speedup": 1.5, "tokens": 3}
        await reply.finish("cancelled", stats)
        await pilot.pause()
        assert reply.finish_reason == "cancelled" and reply.stats == stats and not reply.streaming
        assert footer(reply) == ("■ stopped · speculative · model draft · accepted 50% · α/token 0.60 · τ 2.00 · "
                                 "40.0 tok/s · 1.50× vs plain · 3 tokens")
        assert reply.has_class("-stopped") and not reply.has_class("-streaming")


async def test_the_colour_view_is_built_when_switched_on_and_follows_the_stream() -> None:
    reply = AssistantMessage("fast")
    async with Log(reply).run_test(size=(80, 30)):
        sources = reply.query_one(".sources", Static)
        await reply.append("one", [("one", "draft")])
        assert str(sources.render()) == ""  # Markdown only: the colour view is not kept up to date
        reply.set_show_sources(True)
        assert reply.has_class("-sources") and str(sources.render()) == "one"
        await reply.append(" two", [(" two", "target")])
        assert str(sources.render()) == "one two"
        reply.set_show_sources(False)
        assert not reply.has_class("-sources")


@pytest.mark.parametrize("opening", ["Some text.", "## A heading", "```python\nx = 1\n```"])
async def test_a_reply_starts_on_its_boxs_first_row_whatever_block_opens_it(opening: str) -> None:
    """A heading or a code block first kept its top margin: one or two blank rows under the
    box's border before the reply (a code block's own shaded padding row stays)."""
    reply = AssistantMessage("fast")
    async with Log(reply).run_test(size=(60, 20)) as pilot:
        await reply.append(opening + "\n\nThe end.", [])
        await reply.finish("eos", None)
        await pilot.pause()
        rows = [strip.text.strip("│ ") for strip in pilot.app.screen._compositor.render_strips()]
        top = next(i for i, row in enumerate(rows) if row.startswith("╭"))
        first = next(i for i, row in enumerate(rows) if i > top and row)
        expected = {"Some text.": "Some text.", "## A heading": "A heading", "```python\nx = 1\n```": "x = 1"}
        assert rows[first] == expected[opening]
        assert first - top - 1 == (1 if opening.startswith("```") else 0)


@pytest.mark.parametrize("text", ["# Title\n\nafter\n", "```\ncode\n```\n\nafter\n", "plain words\n\n# Title\n"])
async def test_a_reply_starts_on_its_boxs_first_row_streamed_or_rendered_whole(text: str) -> None:
    """A reply that opens with a heading or a code block has no blank rows above it; the blocks
    after the first keep their margins (a heading later in the reply has its row above)."""
    app = OneReply()
    async with app.run_test(size=(60, 30)) as pilot:
        message = app.query_one(AssistantMessage)
        for line in text.splitlines(keepends=True):  # streamed, then rendered whole at the end
            await message.append(line, [])
            await pilot.pause()
        for final in (False, True):
            if final:
                await message.finish("eos", None)
                await pilot.pause()
                await pilot.pause()
            rows = [strip.text.strip(" │╭╮╰╯─") for strip in app.screen._compositor.render_strips()]
            first = next(i for i, row in enumerate(rows) if "fast" in row)  # the box's top border
            assert rows[first + 1].strip() == text.splitlines()[0].lstrip("# `") or rows[first + 1].strip() == "code"
            if text.startswith("plain"):
                title = rows.index("Title") if "Title" in rows else next(i for i, r in enumerate(rows) if "Title" in r)
                assert rows[title - 1].strip() == ""  # its own top margin, kept


async def test_a_block_added_to_a_reply_leaves_the_blocks_before_it_unstyled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule on the order of children (``:first-child``) made Textual restyle every block of
    the reply, and all their widgets, at each mount: a streaming reply cost more with every block
    already shown."""
    from textual.widgets._markdown import MarkdownBlock

    app = OneReply()
    async with app.run_test(size=(60, 30)) as pilot:
        message = app.query_one(AssistantMessage)
        for i in range(5):
            await message.append(f"paragraph {i}\n\n", [])
        await pilot.pause()
        restyled: list[object] = []
        original = MarkdownBlock.update_node_styles

        def spy(self: MarkdownBlock, *args: object, **kwargs: object) -> None:
            restyled.append(self)
            original(self, *args, **kwargs)

        monkeypatch.setattr(MarkdownBlock, "update_node_styles", spy)
        await message.append("one more\n\n", [])
        await pilot.pause()
        assert restyled == []


@pytest.mark.parametrize("text, again", [("Some words.\n\n## A heading\n\n- a\n- b\n\n```py\nx = 1\n```\n", False),
                                         ("1. a\n\n2. b made the list loose\n", True)])
async def test_a_finished_reply_is_mounted_again_only_where_a_fresh_parse_differs(
        text: str, again: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reply's end parsed and mounted all its blocks again: 16 s of stalls after 100k tokens
    of prose, and after Esc on a long reply "■ stopped" then waited seconds (a hostile test's)."""
    from app.ui.widgets.reply_markdown import ReplyMarkdown

    updates: list[str] = []
    real = ReplyMarkdown.update
    monkeypatch.setattr(ReplyMarkdown, "update",  # (the empty update is the widget's own, as it mounts)
                        lambda self, markdown: (markdown and updates.append(markdown)) or real(self, markdown))
    app = OneReply()
    async with app.run_test(size=(60, 40)) as pilot:
        message = app.query_one(AssistantMessage)
        for char in text:  # the "2" of the second item alone first: a paragraph, then a list of its own
            await message.append(char, [])
        await message.finish("eos", None)
        for _ in range(3):
            await pilot.pause()
        assert updates == ([text] if again else [])


async def test_a_saved_reply_of_more_blocks_than_are_laid_out_is_shown_unformatted() -> None:
    """A chat whose last reply held a table of 3,000 rows froze the app 41 s at every start
    (which reopens it): each row and cell is a widget. Such a reply is now one text."""
    from textual.widgets._markdown import MarkdownBlock

    from app.ui.widgets import chat_view

    table = "| n | square |\n|---|---|\n" + "".join(f"| {i} | {i * i} |\n" for i in range(600))
    short = "| n | square |\n|---|---|\n" + "".join(f"| {i} | {i * i} |\n" for i in range(5))

    class Two(App[None]):
        CSS_PATH = str(Path(app_module.__file__).with_name(SpecChatApp.CSS_PATH))

        def compose(self) -> ComposeResult:
            yield AssistantMessage("fast", text=table, finish_reason="eos")
            yield AssistantMessage("fast", text=short, finish_reason="eos")

    assert chat_view.too_many_blocks(table) == 1 + 1 + 1 + 2 + 1 + 600 * 3  # table, thead, tr, th x2, tbody, rows
    assert chat_view.too_many_blocks(short) is None
    compact = "|a|b|\n|-|-|\n" + "|1|2|\n" * 600  # under 4,000 characters (a review's)
    assert len(compact) < chat_view.QUICK_CHARS and chat_view.too_many_blocks(compact) == 6 + 600 * 3
    app = Two()
    async with app.run_test(size=(80, 40)) as pilot:
        await pilot.pause()
        long, laid_out = app.query(AssistantMessage)
        assert not long.query(MarkdownBlock) and laid_out.query(MarkdownBlock)
        assert str(long.query_one(".body-plain", Static).render()).startswith("| n | square |\n|---|---|\n| 0 | 0 |")
        footer = str(long.query_one(".reply-footer", Static).render())
        assert "shown unformatted: 1,806 blocks are more than the screen lays out" in footer
        long.set_show_sources(True)  # F4: the colour view instead, as for any reply
        await pilot.pause()
        assert not long.query_one(".body-plain").display and long.query_one(".sources").display


async def test_a_streaming_code_block_is_highlighted_whole_every_few_lines_and_at_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole fence was highlighted again at every paint: 29 ms a paint at 200 lines of Python,
    115 ms at 800, growing with the fence (a hostile test: 39 s of a 48 s reply stalled)."""
    from app.ui.widgets import reply_markdown
    from app.ui.widgets.reply_markdown import ReplyFence

    code = "".join(f"value_{i} = table.get('key{i}') + compute({i})\n" for i in range(60))
    text = f"```python\n{code}```\n\nDone.\n"
    whole: list[str] = []
    real = ReplyFence.highlight.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(ReplyFence, "highlight", classmethod(lambda cls, c, *a, **k: whole.append(c) or real(cls, c, *a, **k)))
    ReplyFence._last.clear()
    app = OneReply()
    async with app.run_test(size=(100, 90)) as pilot:
        message = app.query_one(AssistantMessage)
        for line in text.splitlines(keepends=True)[:-3]:  # the code, a line a paint, not yet closed
            await message.append(line, [])
        fence = message.query_one(ReplyFence)
        assert len(whole) <= 60 // reply_markdown.PLAIN_TAIL_LINES + 2  # not once a line
        assert fence.partial and fence._highlighted_code.plain == fence.code  # the newest lines plain, all there
        for line in text.splitlines(keepends=True)[-3:]:
            await message.append(line, [])
        await message.finish("eos", None)
        for _ in range(3):
            await pilot.pause()
        fence = message.query_one(ReplyFence)
        assert not fence.partial and fence._highlighted_code == real(ReplyFence, fence.code, "python", False,
                                                                      app.current_theme.dark)
