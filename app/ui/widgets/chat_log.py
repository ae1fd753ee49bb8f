"""The scrolling transcript, which mounts a long chat a screen at a time.

A long saved chat is not mounted at once: hundreds of Markdown replies took tens
of seconds to build and lay out (docs/performance.md). :class:`ChatLog` mounts the
newest messages that fill :data:`FIRST_SCREENS` screens and keeps the rest, built
but not mounted, above them until the user scrolls up to them.
"""
from __future__ import annotations

from collections.abc import Sequence

from textual.containers import VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static

from app.ui.widgets.chat_view import AssistantMessage


FIRST_SCREENS = 2
"""Opening a chat mounts the newest messages that fill about this many screens; the
older ones are mounted a screen at a time as the user scrolls up to them."""


def estimated_rows(message: Widget, width: int) -> int:
    """About how many rows ``message`` takes at ``width`` columns (border, footer and
    margin included): enough to decide how many messages fill a screen, unrendered."""
    inner = max(width - 6, 10)
    text: str = getattr(message, "text", "")
    lines = sum(max(1, -(-len(line) // inner)) for line in text.split("\n")) if text else 1
    return lines + (4 if isinstance(message, AssistantMessage) else 3)


def newest_that_fill(messages: Sequence[Widget], rows: int, width: int, least: int = 2) -> int:
    """The index from which ``messages`` (oldest first) fill ``rows`` rows; at least ``least``."""
    total, start = 0, len(messages)
    while start > 0 and (total < rows or len(messages) - start < least):
        start -= 1
        total += estimated_rows(messages[start], width)
    return start


class OlderMessages(Static):
    """Stands at the top of the transcript for the messages not mounted yet."""

    def on_click(self) -> None:
        log = self.parent
        if isinstance(log, ChatLog):
            log.call_later(log.show_older)


class ChatLog(VerticalScroll):
    """The scrolling transcript; follows new text only while the user is at the bottom.

    A long saved chat is not mounted at once: hundreds of Markdown replies took
    tens of seconds to build and lay out. :meth:`show_chat` mounts the newest
    messages that fill :data:`FIRST_SCREENS` screens and keeps the rest, built but
    not mounted, in :attr:`older`; scrolling to the top (or clicking the line that
    stands for them) mounts the next screenful above, keeping the view where it
    was. :meth:`transcript` is every message, mounted or not, in order: the turns
    the model sees and what copying offers never depend on what was scrolled to.
    """

    can_focus = False
    """Scrolled by the mouse and by PageUp/PageDown from the prompt box: focused (by Tab, a click),
    it took the keys typed next, Enter too, and dropped them."""

    def __init__(self, *children: Widget, id: str | None = None) -> None:
        super().__init__(*children, id=id)
        self.older: list[Widget] = []
        """Messages above the mounted ones, oldest first, built but not mounted yet."""
        self._showing_older = False

    def on_mount(self) -> None:
        self.anchor()

    def follow(self) -> None:
        """Jump to the bottom and follow again (after the user sends a prompt)."""
        self.anchor()

    def transcript(self) -> list[Widget]:
        """Every message of the chat in order: the ones not mounted yet, then the children."""
        return [*self.older, *self.children]

    async def clear(self) -> None:
        """Remove every message, mounted or not."""
        self.older = []
        await self.remove_children()

    async def show_chat(self, messages: Sequence[Widget]) -> None:
        """Mount the newest ``messages`` that fill the first screens; keep the rest for later."""
        width, height = self._viewport()
        start = newest_that_fill(messages, FIRST_SCREENS * height, width)
        self.older = list(messages[:start])
        if self.older:
            await self.mount(OlderMessages(self._older_label(), id="older-messages"))
        await self.mount_all(messages[start:])
        self.call_after_refresh(self._fill_if_short)

    def _fill_if_short(self) -> None:
        """The estimate fell short (nothing to scroll): show more until the log can scroll."""
        if self.older and self.max_scroll_y < 1:
            self.call_later(self.show_older)

    async def show_older(self) -> None:
        """Mount the next screenful of older messages above the shown ones, the view kept still."""
        if not self.older or self._showing_older:
            return
        self._showing_older = True
        try:
            width, height = self._viewport()
            start = newest_that_fill(self.older, height, width)
            batch, self.older = self.older[start:], self.older[:start]
            marker = self.query_one(OlderMessages)
            before_height, before_y = self.virtual_size.height, self.scroll_y
            # following the end (or all of it fits): the end stays in view, not the row on top
            following = self.max_scroll_y < 1 or self.scroll_y >= self.max_scroll_y
            await self.mount_all(batch, after=marker)
            if self.older:
                marker.update(self._older_label())
            else:
                await marker.remove()
        finally:
            self._showing_older = False
        self.call_after_refresh(self._keep_view, before_height, before_y, following)

    def _keep_view(self, before_height: int, before_y: float, following: bool = False) -> None:
        """Scroll down by what was mounted above, so the messages read stay in place; ``following``:
        to the end instead (a chat just opened fills its first screens this way, and the shift from
        a view at the end, before the first layout, left it short of the end: the last message
        below the fold)."""
        if following:
            self.scroll_end(animate=False, immediate=True)  # anchored as before: new text is followed
        else:
            self.scroll_to(y=before_y + max(0, self.virtual_size.height - before_height), animate=False,
                           immediate=True)
        self._fill_if_short()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self._show_more_if_at_top()

    def _show_more_if_at_top(self) -> None:
        if self.older and not self._showing_older and self.scroll_y < 1:
            self.call_later(self.show_older)

    def _older_label(self) -> Content:
        n = len(self.older)
        return Content(f"▲ {n} earlier message{'s' if n != 1 else ''}: scroll up (or click) to show them")

    def _viewport(self) -> tuple[int, int]:
        """This log's size, or the app's before the first layout."""
        width = self.size.width or self.app.size.width
        height = self.size.height or self.app.size.height
        return width, max(height, 10)
