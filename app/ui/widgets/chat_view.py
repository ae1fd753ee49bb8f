"""The transcript: user prompts, streamed Markdown replies, and their token sources.

A reply is rendered as Markdown while it streams: the app hands it everything that
arrived since the last paint in one :meth:`AssistantMessage.append`, which
re-parses only the last block and lays out once. The same text is
kept as ``(text, source)`` pieces; the colour view shows those pieces tinted by
where each token came from: a draft token the target accepted (coloured by who drafted
it: a draft model, a copy from this chat, an earlier chat), or one the target produced
itself.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Markdown, Static

from app.ui.formatting import FAILURE_CHARS, reply_summary, split_failure
from app.ui.labels import one_line
from app.ui.widgets.reply_markdown import ReplyMarkdown, reply_parser
from app.store.pieces import Pieces, extend_pieces, merge_pieces
from engine.text_safety import inert

UNFINISHED = "unfinished"
"""A saved reply's finish reason where the history has none: its app ended (killed, the machine
went down) before the reply did. It read "■ stopped", as if the user had pressed Esc."""

SOURCE_STYLES = {
    "draft": "$text on $success-muted",
    "chat": "$text on $primary-muted",
    "history": "$text on $error-muted",
    "target": "$text on $accent-muted",
}
"""Styles for the colour view (sources as in :mod:`app.store.pieces`); theme variables keep
them readable in dark and light themes. Green, blue and red against the accent (orange in
the dark themes, purple in the light one)."""

SOURCE_LABELS = {"draft": "draft accepted", "chat": "copied from chat", "history": "from earlier chats",
                 "target": "target produced"}


def legend(sources: Iterable[str] = ("draft", "target"), *, one_line: bool = False) -> Content:
    """The colour view's legend for ``sources`` (those the loaded drafter can produce, see
    :func:`drafted_sources`): on one line for two, one a line for more (a narrow panel
    would otherwise wrap inside a label); ``one_line`` (the one-line HUD's): always on one."""
    sources = tuple(sources)
    gap = "  " if len(sources) <= 2 or one_line else "\n"
    parts: list[tuple[str, str] | str] = []
    for source in sources:
        if parts:
            parts.append(gap)
        parts.append((f" {SOURCE_LABELS[source]} ", SOURCE_STYLES[source]))
    return Content.assemble(*parts)


def drafted_sources(drafter: str | None, lookup: bool = False) -> tuple[str, ...]:
    """The colour view's sources a profile's drafter (``model``, ``ngram``, ``suffix``) produces,
    the target's last; ``lookup``: a model drafter that copies from the chat first."""
    drafted = {"model": ("draft", "chat") if lookup else ("draft",), "ngram": ("chat",),
               "suffix": ("chat", "history")}.get(drafter or "", ())
    return (*drafted, "target")


def pieces_content(pieces: Iterable[tuple[str, str]]) -> Content:
    """Reply text with each run styled by its source, its Markdown still read as Markdown:
    code fences lose their ``` lines and are indented, headings lose their #s and are bold.
    The characters of every token shown keep their source's colour."""
    runs = [(inert(t), src) for t, src in pieces]  # shown, never obeyed: each piece's escapes made visible
    text = "".join(t for t, _ in runs)
    sources: list[str] = []
    for t, src in runs:
        sources.extend([src] * len(t))
    hidden = [False] * len(text)
    bold = [False] * len(text)
    code_lines: set[int] = set()
    starts = [0]  # where each line starts, lines as markdown-it counts them: "\n" alone ends one
    lines = text.split("\n")  # (str.splitlines also breaks at U+2028/U+2029, and every later heading and
    for n, line in enumerate(lines):  # fence then fell on the wrong line: text hidden, "#" shown)
        length = len(line) + (n < len(lines) - 1)
        if length:
            starts.append(starts[-1] + length)

    def line_span(n: int) -> tuple[int, int]:
        return starts[n], starts[n + 1] if n + 1 < len(starts) else len(text)

    for tok in reply_parser().parse(text):  # the blocks the reply view shows (HTML read as text)
        if tok.map is None:
            continue
        first, end = tok.map
        if tok.type == "fence":
            a, b = line_span(first)
            hidden[a:b] = [True] * (b - a)
            last = end - 1
            closing = last > first and last + 1 < len(starts) and text[slice(*line_span(last))].strip().startswith(
                tok.markup)
            if closing:
                a, b = line_span(last)
                hidden[a:b] = [True] * (b - a)
            code_lines.update(range(first + 1, last if closing else end))
        elif tok.type == "heading_open":
            a, b = line_span(first)
            marks = len(text[a:b]) - len(text[a:b].lstrip().lstrip("#").lstrip(" "))
            hidden[a:a + marks] = [True] * marks
            bold[a:b] = [True] * (b - a)
    code_starts = {starts[n] for n in code_lines if n < len(starts) - 1}
    parts: list[tuple[str, str] | str] = []
    run, style = "", None
    for i, ch in enumerate(text):
        if i in code_starts:
            if run:
                parts.append((run, style or ""))
            parts.append(("  ", ""))
            run, style = "", None
        if hidden[i]:
            continue
        st = SOURCE_STYLES.get(sources[i], "") + (" bold" if bold[i] else "")
        if st != style and run:
            parts.append((run, style or ""))
            run = ""
        run, style = run + ch, st
    if run:
        parts.append((run, style or ""))
    return Content.assemble(*parts)


class UserMessage(Static):
    """A prompt the user sent (shown verbatim, its control characters made visible)."""

    role = "user"

    def __init__(self, text: str, message_id: int | None = None) -> None:
        super().__init__(Content(inert(text)), classes="message user")
        self.text = text
        self.border_title = "you"
        self.message_id = message_id
        """Its row in the history, when loaded from there."""
        self.record: Any = None
        """The saver's record (``app.store.pending.ReplyRecord``) when sent in this session."""

    def saved_id(self) -> int | None:
        """Its row id in the history, if it is saved (yet)."""
        if self.message_id is None and self.record is not None:
            return self.record.user_id
        return self.message_id

    def set_superseded(self) -> None:
        """Asked again (edited): shown dimmed, no longer sent to the model."""
        self.add_class("-superseded")
        self.border_title = "you · earlier"

    def set_waiting(self, why: str | None) -> None:
        """Mark the prompt as queued (``why`` shown under it) or as sent (None)."""
        self.set_class(why is not None, "-queued")
        self.border_subtitle = f"⧗ {why}" if why else ""

    @property
    def superseded(self) -> bool:
        """Edited since: shown, never sent to the model again."""
        return self.has_class("-superseded")

    @property
    def waiting(self) -> bool:
        """Queued behind a reply or a load: not sent yet."""
        return self.has_class("-queued")


LAID_OUT_BLOCKS = 1000
"""The most Markdown blocks (paragraphs, list items, table rows and cells: each one widget or
more) a saved reply is laid out with. Beyond it the reply is shown unformatted, as one text: a
chat whose last reply held a table of 3,000 rows froze the app for 41 s at every start, which
reopens it (800 list items: 6 s)."""
QUICK_CHARS = 4_000
QUICK_LINES = 200
"""A reply shorter than both is laid out without counting its blocks (200 lines hold at most
about 800 table cells and rows)."""


def too_many_blocks(text: str) -> int | None:
    """How many blocks ``text`` would be laid out with, where that is more than
    :data:`LAID_OUT_BLOCKS` (None: it is laid out)."""
    if len(text) < QUICK_CHARS and text.count("\n") < QUICK_LINES:  # a table of "|1|2|" rows is short
        return None
    blocks = sum(token.nesting == 1 for token in reply_parser().parse(text))
    return blocks if blocks > LAID_OUT_BLOCKS else None


class AssistantMessage(Vertical):
    """A reply: Markdown while streaming and after, pieces in the colour view (a saved reply of
    more than :data:`LAID_OUT_BLOCKS` blocks: its text unformatted)."""

    role = "assistant"

    def __init__(
        self,
        profile: str | None,
        *,
        text: str = "",
        pieces: Pieces | None = None,
        finish_reason: str | None = None,
        stats: dict[str, Any] | None = None,
        show_sources: bool = False,
    ) -> None:
        super().__init__(classes="message assistant")
        self.profile = profile
        self.text = text
        self.pieces: Pieces = merge_pieces(pieces) if pieces else ([(text, "target")] if text else [])
        self.finish_reason = finish_reason
        self.stopping = False
        """Esc was pressed and the engine's end of the reply has not come back yet."""
        self.stats = stats
        self.unformatted: int | None = None
        """The blocks of a saved reply too long to lay out (:data:`LAID_OUT_BLOCKS`), shown unformatted."""
        self._show_sources = show_sources
        self.border_title = inert(profile or "assistant")
        self.set_class(show_sources, "-sources")

    def compose(self) -> ComposeResult:
        self.unformatted = too_many_blocks(self.text) if self.finish_reason is not None else None
        yield ReplyMarkdown(None if self.unformatted else self.text, classes="body")
        if self.unformatted:
            yield Static(Content(inert(self.text)), classes="body-plain")
        yield Static(pieces_content(self.pieces), classes="sources")
        yield Static(self._footer_text(), classes="reply-footer")

    def on_mount(self) -> None:
        self._update_state()

    @property
    def streaming(self) -> bool:
        """True until :meth:`finish` has been called (or the message was loaded finished)."""
        return self.finish_reason is None

    @property
    def waiting(self) -> bool:
        """Still being written: not part of the conversation the model sees yet."""
        return self.streaming

    @property
    def superseded(self) -> bool:
        """Answered again since (regenerated or edited): shown dimmed, never sent again."""
        return self.has_class("-superseded")

    def _footer_text(self) -> Content:
        if self.finish_reason is None:  # no text yet: the engine reads the prompt (a long paste: a minute on coder)
            if self.stopping:
                return Content("stopping…")
            return Content("generating…" if self.text else "reading the prompt…")
        parts: list[str] = []
        figures, failure = split_failure(self.stats)
        if self.finish_reason == "cancelled":
            parts.append("■ stopped")
        elif self.finish_reason == UNFINISHED:
            parts.append("■ unfinished: its end was never saved")
        elif self.finish_reason == "error":
            reason = one_line(failure or "", FAILURE_CHARS)
            parts.append(f"✗ failed: {reason}" if reason else "✗ failed")
        elif self.finish_reason == "length":
            parts.append("… length limit")
        elif self.finish_reason == "context":
            parts.append("… context window full")
        if self.unformatted:
            parts.append(f"shown unformatted: {self.unformatted:,} blocks are more than the screen lays out")
        summary = reply_summary(figures)
        if summary:
            parts.append(summary)
        return Content(inert(" · ".join(parts)))  # saved stats come from the history file

    def _set_classes(self, **classes: bool) -> None:
        """Set this reply's state classes. They style the box and its own children only
        (specchat.tcss: ``AssistantMessage.-x > child``), so only those are restyled:
        Textual restyles every descendant on a class change, each block of the reply
        (~50 ms for a 2 KB reply as it ends, while the keys typed meanwhile wait)."""
        before = set(self.classes)
        for name, on in classes.items():
            self.set_class(on, name, update=False)
        if set(self.classes) != before:
            self.app.stylesheet.update_nodes([self, *self.children], animate=False)

    def _update_state(self) -> None:
        self._set_classes(**{"-streaming": self.finish_reason is None, "-stopped": self.finish_reason in ("cancelled", UNFINISHED),
                             "-error": self.finish_reason == "error"})
        self.query_one(".reply-footer", Static).update(self._footer_text())

    def set_stopping(self) -> None:
        """Esc was heard: the footer says so at once. An engine that took its time to answer (busy, or
        stopped by SIGSTOP) left "generating…" for up to 10 s, as if Esc had not been read."""
        if self.finish_reason is None and not self.stopping:
            self.stopping = True
            self.query_one(".reply-footer", Static).update(self._footer_text())

    async def append(self, text: str, pieces: Iterable[tuple[str, str]]) -> None:
        """Add the text of the rounds since the last paint, and render it before returning.

        Awaiting the Markdown here (not through ``Markdown.get_stream``, whose task
        would append a moment later) puts the text, the HUD and the scroll of one
        paint into one layout of the screen; the app's paint slots already fold
        rounds together, as the stream would."""
        if not text:
            return
        first = not self.text
        self.text += text
        if first:
            self.query_one(".reply-footer", Static).update(self._footer_text())
        extend_pieces(self.pieces, pieces)
        if self._show_sources:
            self.query_one(".sources", Static).update(pieces_content(self.pieces))
        await self.query_one(".body", Markdown).append(text)

    async def finish(self, finish_reason: str, stats: dict[str, Any] | None) -> None:
        """End the reply: its footer ("■ stopped", the summary) at once, then the whole text
        rendered again once the footer's frame is out.

        The final full render makes a reply whose later lines changed its earlier blocks (a
        list made loose, a table, a link reference) come out exactly as a fresh parse would
        show it; where the streamed blocks show that already (:meth:`ReplyMarkdown.shows`:
        most replies) it is skipped. It parses and lays out every block of the reply (tens of
        milliseconds for a long one, seconds for thousands of blocks), so it waits for the next
        frame: Esc's "■ stopped" shows first.
        """
        self.finish_reason = finish_reason
        self.stats = stats
        self._update_state()
        self.call_after_refresh(self._render_final)

    async def _render_final(self) -> None:
        if not self.is_attached:
            return
        body = self.query_one(".body", ReplyMarkdown)
        if not body.shows(self.text):  # parsed and mounted again: seconds for a long reply, keys waiting
            await body.update(self.text)
        body.colour_code()
        if self._show_sources:  # else built when the colour view is switched on
            self.query_one(".sources", Static).update(pieces_content(self.pieces))

    def set_superseded(self) -> None:
        """Answered again: this earlier reply stays, dimmed, and is no longer sent to the model."""
        self.add_class("-superseded")
        self.border_title = inert(f"{self.profile or 'assistant'} · earlier reply")

    def set_show_sources(self, show: bool) -> None:
        """Switch between Markdown and the token-source colour view."""
        if not self.is_attached:  # an earlier message not shown yet (ChatLog.older): mounted as it says
            self._show_sources = show
            self.set_class(show, "-sources", update=False)
            return
        self._show_sources = show
        self._set_classes(**{"-sources": show})
        if show:
            self.query_one(".sources", Static).update(pieces_content(self.pieces))
