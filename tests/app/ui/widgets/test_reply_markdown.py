"""Replies' Markdown: code highlighted by its named language only; lists that grow in place while they stream."""
from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Markdown, Static
from textual.widgets._markdown import MarkdownBlock, MarkdownBullet

from app.ui.widgets.reply_markdown import ReplyFence, ReplyMarkdown, known_language

pytestmark = pytest.mark.anyio


def test_code_blocks_are_highlighted_by_name_never_by_guessing() -> None:
    assert known_language("python") == "python"
    assert known_language("") == "text"  # no guesser run over the code at every paint
    assert known_language("no-such-language-at-all") == "text"  # no plugin search at every paint
    highlighted = ReplyFence.highlight("def f():\n    return 1\n", "python")
    assert highlighted.plain.startswith("def f()") and highlighted.spans  # still coloured


def test_fenced_and_indented_code_both_use_the_reply_fence() -> None:
    assert ReplyMarkdown.BLOCKS["fence"] is ReplyFence and ReplyMarkdown.BLOCKS["code_block"] is ReplyFence
    assert known_language("Python") == "Python"  # pygments knows names case-insensitively


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


class Two(App[None]):
    def compose(self) -> ComposeResult:
        yield ReplyMarkdown(id="streamed")
        yield ReplyMarkdown(id="fresh")


@pytest.mark.parametrize("text", [
    "".join(f"{i}. item {i}\n" for i in range(7, 13)) + "\nafter\n",  # starts at 7, widens at 10
    "- a\n- b\n\n1. one\n2. two\n\n- c\n",  # a bullet list, a numbered one, a bullet list again
    "- a\n  1. inner\n  2. inner two\n- b\n",  # a numbered list inside a bullet item
], ids=["numbers-widen", "lists-in-turn", "nested"])
async def test_every_line_streamed_shows_what_a_fresh_parse_shows(text: str) -> None:
    app = Two()
    async with app.run_test(size=(100, 120)) as pilot:
        streamed, fresh = app.query_one("#streamed", ReplyMarkdown), app.query_one("#fresh", ReplyMarkdown)
        for line in text.splitlines(keepends=True):
            await streamed.append(line)
            await fresh.update(streamed.source)
            await pilot.pause()
            assert shape(streamed) == shape(fresh), streamed.source
        assert streamed.source == text


class Shown(App[None]):
    """One Markdown widget of the given class, showing ``text``."""

    def __init__(self, kind: type[Markdown], text: str) -> None:
        super().__init__()
        self.kind, self.text = kind, text

    def compose(self) -> ComposeResult:
        yield self.kind(self.text)


async def screen_text(kind: type[Markdown], text: str, size: tuple[int, int]) -> tuple[list[str], int]:
    """The screen's text with ``text`` shown by ``kind``, and how many containers lay it out."""
    app = Shown(kind, text)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        lines = [strip.text.rstrip() for strip in app.screen._compositor.render_strips()]
        return lines, len(app.query("Horizontal, Vertical"))


@pytest.mark.parametrize("width", [28, 60])
async def test_a_list_item_of_one_paragraph_looks_as_textual_draws_it_with_one_container_fewer(width: int) -> None:
    """An item's paragraph sits beside its bullet without Textual's ``Vertical`` around it (one
    container fewer to arrange at each paint); wrapped lines still hang under the text, nested
    lists and items of several blocks still look as Textual draws them."""
    text = LISTS + "\n- first paragraph\n\n  second paragraph of the same item\n"
    ours, our_boxes = await screen_text(ReplyMarkdown, text, (width, 120))
    theirs, their_boxes = await screen_text(Markdown, text, (width, 120))
    assert ours == theirs
    if width == 28:
        assert "   10. Step number 10," in ours and "       with bold and code." in ours  # wrapped under its text
    assert our_boxes < their_boxes


ENDINGS = {
    "table": "| a | b |\n|---|---|\n" + "".join(f"| {i} | **{i * i}** |\n" for i in range(12)) + "\nafter the table\n",
    "table-stopped": "Numbers:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4",
    "fence-stopped": "Here:\n\n```python\ndef f(x):\n    return x * 2\n",
    "fence": "```sh\nls -l\n```\n\nThen `code` and *more*.\n",
    "setext": "Title\n=====\n\nSub\n---\n\ntext\n",
    "quote": "> quoted **bold**\n> second\n\n> another\n\nplain\n",
    "mixed": LISTS + "\n# Head\n\n---\n\n1. a\n\n2. loose b\n",
    "html": "<div>\nraw html\n</div>\n\ntext <b>b</b>\n",
    "no-newline": "one paragraph\n\nand a last line without its end",
}


SHOWN_AS_STREAMED = {"fence-stopped", "fence", "setext", "quote", "no-newline", "html"}  # html: read as text
"""Endings whose streamed blocks are what a fresh parse makes, in whatever pieces they came."""


@pytest.mark.parametrize("chunk", [1, 5, 23])
@pytest.mark.parametrize("name", sorted(ENDINGS))
async def test_a_reply_is_parsed_again_at_its_end_only_where_its_pieces_showed_it_otherwise(name: str, chunk: int) -> None:
    """The end of a reply parsed and mounted every block again (chat_view.AssistantMessage.finish):
    seconds for a long reply, the keys typed meanwhile waiting. Where the streamed blocks already
    show what a fresh parse shows it is skipped; where they do not (a list a blank line made loose
    streamed as two, a table's cells), it still happens, and the end looks as a fresh parse."""
    app = Two()
    text = ENDINGS[name]
    async with app.run_test(size=(100, 200)) as pilot:
        streamed, fresh = app.query_one("#streamed", ReplyMarkdown), app.query_one("#fresh", ReplyMarkdown)
        for start in range(0, len(text), chunk):
            await streamed.append(text[start:start + chunk])
        await fresh.update(text)
        await pilot.pause()
        skipped = streamed.shows(text)
        assert skipped == (name in SHOWN_AS_STREAMED) or (name == "mixed" and chunk > 1)
        if not skipped:
            await streamed.update(text)
            await pilot.pause()
        assert shape(streamed) == shape(fresh)


@pytest.mark.parametrize("text", ["See [the docs][1].\n\n[1]: https://example.com\n",
                                  "See [the docs][d].\n\n> [d]: https://example.com\n",  # in a quote (a review's)
                                  "See [the docs][d].\n\n- [d]: https://example.com\n",  # in a list item
                                  "Rows:\n\n> | a | b |\n> |---|---|\n> | 1 | 2 |\n"])  # a table in a quote
async def test_a_link_reference_or_a_table_anywhere_has_the_reply_parsed_again(text: str) -> None:
    app = Two()
    async with app.run_test(size=(100, 40)) as pilot:
        streamed, fresh = app.query_one("#streamed", ReplyMarkdown), app.query_one("#fresh", ReplyMarkdown)
        for start in range(0, len(text), 4):
            await streamed.append(text[start:start + 4])
        await pilot.pause()
        assert not streamed.shows(text)
        await streamed.update(text)
        await fresh.update(text)
        await pilot.pause()
        assert shape(streamed) == shape(fresh)


async def test_what_looks_like_html_in_a_reply_is_shown_as_the_model_wrote_it() -> None:
    """Textual draws no HTML token: pocket's "List<String> and ArrayList<String>" showed as "List and
    ArrayList", and a <details> block or the first part of a <think> block vanished (a hostile tester's)."""
    text = ("In Java, List<String> and ArrayList<String> differ.\n\n"
            "<details>\nHidden answer text.\n</details>\n\n#include <iostream> at the top.\n")
    lines, _ = await screen_text(ReplyMarkdown, text, (80, 30))
    shown = "\n".join(lines)
    assert "List<String> and ArrayList<String>" in shown
    assert "Hidden answer text." in shown and "<details>" in shown and "#include <iostream>" in shown
