"""How a streaming reply reaches the screen: the Conversation's paints of its rounds.

The reply worker leaves each round in the stream's :class:`~app.ui.messages.Outbox` and posts a
:class:`~app.ui.messages.ReplyChunk` when the UI must look; :meth:`ReplyPainting.on_reply_chunk`
paints every waiting round at once, when the pacer (:mod:`app.ui.pacing`) allows the next paint,
and :meth:`ReplyPainting.on_reply_finished` paints what is left and ends the reply. A mixin of
:class:`~app.ui.widgets.conversation.Conversation`, which owns the state named below.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from textual.widget import Widget

from app.store.pieces import piece_runs
from app.ui import pacing
from app.ui.formatting import with_failure
from app.ui.messages import ReplyChunk, ReplyFinished
from app.ui.notices import notice
from app.ui.widgets.chat_view import AssistantMessage
from app.ui.widgets.transcript import messages_of

if TYPE_CHECKING:
    from app.ui.archive import Archive
    from app.ui.engine_host import EngineHost
    from app.ui.reply_stream import ReplyStream
    from app.ui.widgets.chat_log import ChatLog
    from app.ui.widgets.hud import Hud
    from app.ui.widgets.prompt import PromptArea


# A plain mixin at run time (a Widget base here would reorder Textual's default CSS, whose rules
# rank by their class's place in the MRO); a Widget to the type checker.
_Base = Widget if TYPE_CHECKING else object


class ReplyPainting(_Base):
    """The streaming half of a Conversation: its paints, and the end of each reply."""

    host: EngineHost
    archive: Archive
    stream: ReplyStream
    generating: bool
    private: bool
    chat_log: ChatLog
    hud: Hud
    prompt: PromptArea
    chat_id: int | None
    send_queued: Callable[[], None]
    run_after_reply: Callable[[], None]

    async def on_reply_chunk(self, message: ReplyChunk) -> None:
        """Rounds are waiting: show them now, or when the pacer allows the next paint."""
        if message.reply_id != self.stream.reply_id:
            return
        wait = self.stream.pacer.wait()
        if wait > 0:
            self.set_timer(wait, partial(self._lend_and_paint, message.reply_id))
        else:
            await self._lend_and_paint(message.reply_id)

    async def _lend_and_paint(self, reply_id: int) -> None:
        """Paint now; where the engine lends the UI a core for it, once it has switched."""
        lend = pacing.PAINT_YIELD_S
        if lend > 0 and self.stream.is_current(reply_id) and self.host.yield_to_ui(lend):
            await asyncio.sleep(pacing.PAINT_LEAD_S)  # the engine's next round runs on one thread fewer
        await self.paint_rounds(reply_id)

    async def paint_rounds(self, reply_id: int) -> None:
        """Append every waiting round to the reply at once; the HUD sees each round's statistics."""
        stream = self.stream
        widget = stream.widget
        if not stream.is_current(reply_id) or widget is None or not self.is_attached:
            return  # a later reply, or the app is closing (a paint timer may still fire)
        events = stream.outbox.take()
        if not events:
            return
        stream.pacer.painting()
        hud = self.hud
        with self.app.batch_update():  # the reply and the HUD in one layout of the screen
            await widget.append("".join(e.text for e in events), [r for e in events for r in piece_runs(e.pieces)])
            for event in events:
                hud.set_stats(event.stats, live=True)
                if event.notice:
                    hud.set_notice(event.notice)
                    notice(self, event.notice, severity="warning", title="Engine")
            hud.flush()

    async def on_reply_finished(self, message: ReplyFinished) -> None:
        if message.reply_id != self.stream.reply_id or not self.is_attached:
            return  # a stale reply, or the app closed its screens (the saver has the reply)
        await self.paint_rounds(message.reply_id)  # rounds still waiting for a paint slot
        widget = self.stream.end()
        self.generating = False
        if widget is not None:
            await widget.finish(message.finish_reason,
                                with_failure(message.stats.to_dict() if message.stats else None, message.error))
            self.hud.set_seen_sources(self.hud.seen_sources | {source for _, source in widget.pieces})
        if message.stats is not None:
            self.hud.set_stats(message.stats, live=False)
        if self.chat_id is not None and not self.private:  # a new chat has its id once saved: held from here
            self.archive.open_chats.show(self.chat_id)
        if self.host.backend is not None:
            self.hud.set_engine(self.host.backend.info, self.host.profile)
        self.hud.live = False
        self.hud.flush()
        if message.error:
            notice(self, message.error, severity="error", title="Generation failed")
        if self.screen.is_active and self.screen.focused is None:
            self.prompt.focus()
        self.run_after_reply()  # Esc then ctrl+r: the regenerate it kept, before a prompt queued after it
        self.send_queued()
        if not self.generating:  # no queued prompt took over: collect once the last frame is out
            self.call_after_refresh(self.stream.collector.reply_over)

    def _sources(self) -> set[str]:
        """The token sources in the transcript's replies (the legend must name every colour shown)."""
        return {source for message in messages_of(self.chat_log.transcript())
                if isinstance(message, AssistantMessage) for _, source in message.pieces}
