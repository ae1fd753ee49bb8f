"""Textual's Markdown, made cheap to stream into.

While a reply streams, ``Markdown.append`` parses again only the last top-level
block and hands it to that block's ``_update_from_block``. For a list, Textual
removes the whole list and mounts a new one: every item's widgets built and
laid out again at every paint. Lists here keep the rows they have and rebuild
only the last one, which is the only one new text can change: a 16-item list
streamed at 80 characters a paint cost a median 54-62 ms of the UI's CPU a paint
that way and 25-26 ms this way (paragraphs: 8 ms; ``scripts/ui_paint_cost.py
--sample list [--textual-lists]``, 120x40, two runs). An item of one paragraph
has its paragraph beside the bullet, without Textual's ``Vertical`` around it
(:func:`list_row`): one container fewer per item to arrange at each paint, 29.2
→ 23.4 ms a paint for that 16-item list, 61.3 → 51.5 for 64 items, 23.3 → 20.6
for the mixed sample (80 characters a paint, medians of three runs, alternating).
Code blocks are highlighted by their named language only, a streaming one whole every
few lines (:meth:`ReplyFence.highlight_growing`).

Where streaming showed the text otherwise than a fresh parse would (:meth:`ReplyMarkdown.shows`:
a list made loose later, a table, a link reference), :meth:`AssistantMessage.finish` renders
the whole text once more from a fresh parse, so the finished reply is exactly Markdown's.

Every text given to a reply is made :func:`~engine.text_safety.inert` first:
Textual passes a control character in a widget's text through to the terminal,
so a model's (or a server's, or a saved chat's) escape sequence would be obeyed.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.containers import Horizontal, Vertical
from textual.widget import AwaitMount, Widget
from textual.content import Content
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownBlock, MarkdownFence

from engine.text_safety import inert

try:  # Textual's list widgets are not public: without them lists are rebuilt, as Textual does
    from textual.widgets._markdown import (
        MarkdownBullet, MarkdownBulletList, MarkdownListItem, MarkdownOrderedList, MarkdownParagraph,
    )
except ImportError:  # pragma: no cover - depends on the installed Textual
    MarkdownBullet = MarkdownBulletList = MarkdownListItem = MarkdownOrderedList = None  # type: ignore[assignment,misc]
    MarkdownParagraph = None  # type: ignore[assignment,misc]


@lru_cache(maxsize=256)
def known_language(language: str) -> str:
    """The fence's language if pygments has a lexer for it, else ``text``.

    A streaming code block is highlighted again at every paint. For a name that
    is not built in, pygments searches every installed package's entry points
    (importlib.metadata) on each call, and a fence without a name runs every
    lexer's guesser over the code: that was a third of the UI's time while a
    code block streamed. Asked once per name here; unnamed fences are plain text.
    """
    if not language:
        return "text"
    try:
        get_lexer_by_name(language)
    except ClassNotFound:
        return "text"
    return language


PLAIN_TAIL_LINES = 12
"""The most lines a streaming code block shows plain before it is highlighted whole again."""


class ReplyFence(MarkdownFence):
    """A code block highlighted as its (known) language says, never by guessing, with a scrollbar
    where its lines are wider than the chat (Textual's fence clips them without one: beside the
    full HUD, code lost its right-hand side with nothing to say so)."""

    DEFAULT_CSS = """
    ReplyFence {
        overflow-x: auto;
        scrollbar-size-horizontal: 1;
    }
    """

    _last: dict[tuple[str, bool, bool], tuple[str, Content]] = {}
    """By (language, ansi, dark): the code last highlighted whole while a fence grew, and its colours."""

    def __init__(self, markdown: Markdown, token: Token, code: str) -> None:
        MarkdownBlock.__init__(self, markdown, token)  # MarkdownFence's own, but for the highlighting
        self.code = code
        self.lexer = token.info
        self.auto_links = False
        ansi, dark = self.app.native_ansi_color, self.app.current_theme.dark
        if getattr(markdown, "growing", False):
            self._highlighted_code, self.partial = self.highlight_growing(code, self.lexer, ansi, dark)
        else:
            self._highlighted_code, self.partial = self.highlight(code, self.lexer, ansi, dark), False

    @classmethod
    def highlight(cls, code: str, language: str, ansi: bool = False, dark: bool = False) -> Content:
        return super().highlight(code, known_language(language), ansi, dark)

    @classmethod
    def highlight_growing(cls, code: str, language: str, ansi: bool, dark: bool) -> tuple[Content, bool]:
        """A streaming fence's colours, and whether its last lines are still plain: the code
        highlighted whole when it has grown :data:`PLAIN_TAIL_LINES` lines since it last was,
        else those colours and the lines since, plain. Highlighting every paint cost 29 ms a
        paint at 200 lines of Python and 115 ms at 800, and grew with the fence. The reply's end
        colours the whole of it (:meth:`ReplyMarkdown.colour_code`)."""
        key = (known_language(language), ansi, dark)
        last = cls._last.get(key)
        if last is not None and code.startswith(last[0]) and code.count("\n", len(last[0])) < PLAIN_TAIL_LINES:
            done, colours = last
            return (colours + Content(code[len(done):]), True) if len(code) > len(done) else (colours, False)
        colours = cls.highlight(code, language, ansi, dark)
        cls._last[key] = (code, colours)
        return colours, False

    def _copy_context(self, block: MarkdownBlock) -> None:
        super()._copy_context(block)
        if isinstance(block, ReplyFence):
            self.partial = block.partial

    def colour_whole(self) -> None:
        """Highlight the whole code, where its last lines were left plain as it streamed."""
        if self.partial:
            self._highlighted_code = self.highlight(self.code, self.lexer, self.app.native_ansi_color,
                                                    self.app.current_theme.dark)
            self.partial = False
            self.set_content(self._highlighted_code)


def list_row(symbol: str, blocks: list[MarkdownBlock]) -> Horizontal:
    """One item of a list: its bullet beside its blocks. Textual puts the blocks in a
    ``Vertical`` of their own; an item of one paragraph (nearly every item a model writes)
    gets its paragraph beside the bullet directly, which looks the same (the ``Vertical``
    is as wide and as tall as the paragraph) and is one container fewer to arrange at every
    paint of a streaming reply."""
    bullet = MarkdownBullet()
    bullet.symbol = symbol
    if len(blocks) == 1 and isinstance(blocks[0], MarkdownParagraph):
        return Horizontal(bullet, blocks[0])
    return Horizontal(bullet, Vertical(*blocks))


class _GrowingList:
    """Mixed into a Markdown list: a longer version of the same list only replaces
    its last row and adds the new ones (items before the last one are complete)."""

    _blocks: list[MarkdownBlock]

    def _symbols(self, items: list[MarkdownBlock]) -> list[str]:
        """The bullet of each item, as Textual's own ``compose`` writes it."""
        raise NotImplementedError

    def compose(self) -> ComposeResult:
        """Textual's rows (:func:`list_row`)."""
        items = [block for block in self._blocks if isinstance(block, MarkdownListItem)]
        for item, symbol in zip(items, self._symbols(items)):
            yield list_row(symbol, item._blocks)
        self._blocks.clear()

    async def _update_from_block(self, block: MarkdownBlock) -> None:
        rows = [child for child in self.children if isinstance(child, Horizontal)]  # type: ignore[attr-defined]
        items = [b for b in getattr(block, "_blocks", ()) if isinstance(b, MarkdownListItem)]
        if (type(block) is not type(self) or not rows or len(items) < len(rows)
                or len(rows) != len(self.children)):  # type: ignore[attr-defined]
            await super()._update_from_block(block)  # type: ignore[misc]
            return
        symbols = self._symbols(items)
        old = [row.query_one(MarkdownBullet).symbol for row in rows[:-1]]
        if old != symbols[: len(old)]:  # numbers widened (9 → 10 items) or renumbered
            await super()._update_from_block(block)  # type: ignore[misc]
            return
        self._copy_context(block)  # type: ignore[attr-defined]
        await rows[-1].remove()
        new_rows = [list_row(symbol, item._blocks)
                    for item, symbol in zip(items[len(rows) - 1:], symbols[len(rows) - 1:])]
        await self.mount_all(new_rows)  # type: ignore[attr-defined]


LIST_BLOCKS: dict[str, type[MarkdownBlock]] = {}
if MarkdownBulletList is not None and MarkdownOrderedList is not None:

    class ReplyBulletList(_GrowingList, MarkdownBulletList):  # type: ignore[misc,valid-type]
        """A bullet list that grows row by row while it streams."""

        def _symbols(self, items: list[MarkdownBlock]) -> list[str]:
            return [getattr(item, "bullet", "") for item in items]

    class ReplyOrderedList(_GrowingList, MarkdownOrderedList):  # type: ignore[misc,valid-type]
        """A numbered list that grows row by row while it streams (numbers padded as Textual pads them)."""

        def _symbols(self, items: list[MarkdownBlock]) -> list[str]:
            try:
                first = int(getattr(items[0], "bullet", 1))
            except ValueError:
                first = 1
            numbers = range(first, first + len(items))
            width = max(len(f"{number}. ") for number in numbers)
            return [f"{number}. ".rjust(width + 1) for number in numbers]

    LIST_BLOCKS = {"bullet_list_open": ReplyBulletList, "ordered_list_open": ReplyOrderedList}


def reply_parser() -> MarkdownIt:
    """GFM as Textual reads it, with HTML read as text: Textual draws no HTML token, so ``List<String>``
    showed as "List", a ``<details>`` block vanished whole, and a ``<think>`` block lost its first part
    (a hostile tester's, on pocket's own reply); a terminal cannot render HTML anyway."""
    return MarkdownIt("gfm-like", {"html": False})


FIRST_BLOCK = "-first"
"""The class of a reply's first block."""


class ReplyMarkdown(Markdown):
    """Markdown for replies: :class:`ReplyFence` for code blocks, lists that grow in place."""

    BLOCKS = {**Markdown.BLOCKS, "fence": ReplyFence, "code_block": ReplyFence, **LIST_BLOCKS}

    def __init__(self, markdown: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("parser_factory", reply_parser)
        super().__init__(inert(markdown) if markdown else markdown, **kwargs)

    def mount(self, *widgets: Widget, before: int | str | Widget | None = None,
              after: int | str | Widget | None = None) -> AwaitMount:
        """Mount blocks; the reply's first block is marked ``-first`` (specchat.tcss: no top margin).

        Marked here, not by a ``:first-child`` rule: a rule on the order of children makes Textual
        restyle every block of the reply, and all their widgets, at each mount, so a streaming
        reply cost more with every block already shown (1,000 headings: 38 s of stalls against
        8 s; a hostile test's). Blocks are only added at the end, or replace the last one (a block
        re-read as another kind), or all of them (:meth:`Markdown.update`), each time after the
        ones they replace are gone: the first is the one mounted into no block."""
        if widgets and before is None and after is None and not any(isinstance(c, MarkdownBlock) for c in self.children):
            widgets[0].add_class(FIRST_BLOCK)
        return super().mount(*widgets, before=before, after=after)

    def shows(self, markdown: str) -> bool:
        """Whether the blocks streamed in (:meth:`append`) show what a fresh parse of ``markdown``
        (all of it: the reply's end) shows, so that rendering it again would change nothing. They
        do where they are the same top-level blocks over the same lines, unless the text has a
        table (its streamed cells are other widgets than a fresh parse's) or a link reference
        definition, anywhere (it changes the blocks before it). A list that a blank line and then
        its next item made loose streams in as two: the same lines, other blocks, so not shown."""
        text = inert(markdown)
        if self.source != text:
            return False
        parser = reply_parser() if self._parser_factory is None else self._parser_factory()
        env: dict[str, Any] = {}
        tokens = parser.parse(text, env)
        if env.get("references") or any(t.type == "table_open" for t in tokens):
            return False
        fresh = [tuple(t.map) for t in tokens if t.level == 0 and t.nesting >= 0 and t.map is not None]
        streamed = [tuple(c.source_range) for c in self.children if isinstance(c, MarkdownBlock)]
        return fresh == streamed

    growing = False
    """Whether text is being appended (streamed): its code blocks then colour their newest lines later
    (:meth:`ReplyFence.highlight_growing`)."""

    def update(self, markdown: str) -> AwaitComplete:
        """Show ``markdown`` (made inert) instead."""
        self.growing = False
        return super().update(inert(markdown))

    def append(self, markdown: str) -> AwaitComplete:
        """Add ``markdown`` (made inert: per character, so pieces join as the whole would)."""
        self.growing = True
        return super().append(inert(markdown))

    def colour_code(self) -> None:
        """The reply has ended: every code block highlighted whole (their newest lines were plain)."""
        self.growing = False
        for fence in self.query(ReplyFence):
            fence.colour_whole()
