"""The HUD: what is loaded, how speculation is doing, and what memory it takes.

The app feeds it state (:meth:`Hud.set_engine`, :meth:`Hud.set_stats`, ...)
as often as it likes; the HUD only stores it and marks itself dirty. The app's
timer calls :meth:`Hud.flush` a few times a second, so a fast engine never
waits on the renderer.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Label, ProgressBar, Static

from app.ui.labels import dropped_drafter, spec_label
from app.ui.formatting import (
    DASH,
    bar,
    fmt_bytes,
    fmt_float,
    fmt_percent,
    fmt_rate,
    mode_label,
    modes_label,
    plan_lines,
    spoken_reason,
)
from app.ui.widgets import hud_server
from app.store.pieces import PIECE_SOURCES, drafted_source
from app.ui.widgets.chat_view import SOURCE_STYLES, drafted_sources, legend
from app.ui.widgets.hud_line import status_line
from app.ui.widgets.hud_rows import SPARK_ROUNDS, lines, plain_text, row, sparkline, speedup_text
from engine.api import EngineInfo
from engine.events import OFF_BY_USER, ReplyStats
from engine.text_safety import inert, is_inert

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile

OFF_BY_YOU = "switched off by you"
"""The engine's :data:`~engine.events.OFF_BY_USER`, as the HUD says it to the user."""
ORIGIN_LABELS = {"draft": " model", "chat": " chat", "history": " earlier"}
"""HUD row labels of the drafters (sources of :mod:`app.store.pieces`), indented under τ: each row
is one drafter's share of the reply, not the chat's."""


class Hud(VerticalScroll):
    """Always-visible statistics panel."""

    can_focus = False  # read, not typed into: focused, it dropped the keys typed next (ChatLog's reason)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.profile: "ModelProfile | None" = None
        self.profile_name: str | None = None
        self.info: EngineInfo | None = None
        self.stats: ReplyStats | None = None
        self.live = False
        self.speculation_on = True
        self.notice: str | None = None
        self.loading_stage: str | None = None
        self.loading_fraction: float | None = None
        self.error: str | None = None
        self.seen_sources: frozenset[str] = frozenset()
        """Token sources in the chat on screen (a reopened chat may hold colours this profile never makes)."""
        self.round_accepted: deque[float] = deque(maxlen=SPARK_ROUNDS)
        self._last_counts = (0, 0)
        self._dirty = True
        self._shown: dict[str, tuple[str, tuple[object, ...]]] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="hud-line")  # the one-line HUD (shown instead of the rest below HUD_MIN_WIDTH)
        yield Static(id="hud-engine")
        yield Static(legend(), id="hud-legend")
        yield Static(id="hud-loading")
        yield ProgressBar(id="hud-progress", show_eta=False)
        yield Static(id="hud-stats")
        yield Label("accepted per round (0–1)", classes="hud-caption")
        yield Static(id="hud-spark")
        yield Static(id="hud-positions")
        yield Static(id="hud-memory")

    def on_mount(self) -> None:
        self.flush(force=True)

    # -- state setters (cheap; rendering happens in flush) ---------------------

    def set_loading(self, profile_name: str | None, stage: str | None, fraction: float | None) -> None:
        """Show (stage not None) or hide loading progress."""
        self.profile_name = profile_name or self.profile_name
        self.loading_stage = stage
        self.loading_fraction = fraction
        if stage is not None:
            self.error = None
        self._dirty = True

    def set_engine(self, info: EngineInfo | None, profile: "ModelProfile | None") -> None:
        """A backend is loaded (or None: nothing loaded)."""
        self.info = info
        self.profile = profile
        if profile is not None:
            self.profile_name = profile.name
        self.loading_stage = None
        self._dirty = True

    def set_seen_sources(self, sources: Iterable[str]) -> None:
        """The token sources the transcript's replies hold; the legend names them too."""
        self.seen_sources = frozenset(sources)
        self._dirty = True

    def set_error(self, error: str | None) -> None:
        """Loading failed with ``error`` (shown until the next load)."""
        self.error = error
        self.loading_stage = None
        self._dirty = True

    def set_notice(self, notice: str | None) -> None:
        """The notice the engine sent with the last reply (a drop, a switch-off, a server that went
        past its budget), shown until the next reply starts: what lasts (a drop, a switch-off) is
        the engine's state too (:attr:`info`)."""
        self.notice = notice
        self._dirty = True

    def start_reply(self) -> None:
        """A new reply begins: per-reply counters restart."""
        self._last_counts = (0, 0)
        self.round_accepted.clear()  # the sparkline shows this reply's rounds (none in a plain reply)
        self.notice = None  # the last reply's: "the server went on past the 512-token limit" stayed for good
        self.live = True
        self._dirty = True

    def set_stats(self, stats: ReplyStats, *, live: bool) -> None:
        """Latest statistics; also records this round's acceptance for the sparkline."""
        proposed, accepted = self._last_counts
        if stats.proposed > proposed and not getattr(stats, "server", ""):  # a server's come whole, not by round
            self.round_accepted.append((stats.accepted - accepted) / (stats.proposed - proposed))
        self._last_counts = (stats.proposed, stats.accepted)
        self.stats = stats
        self.live = live
        self._dirty = True

    def set_speculation(self, on: bool) -> None:
        self.speculation_on = on
        self._dirty = True

    # -- the engine's state, shown at once ------------------------------------------

    def show_loading(self, profile: "ModelProfile", replacing: str | None) -> None:
        """``profile`` starts loading, beside the profile ``replacing`` (None: nothing loaded). The
        last reply's figures go: they were another profile's, shown under this one's name."""
        if profile.name != replacing:
            self.clear_reply()
        self.set_engine(None, profile)
        self.set_loading(profile.name, f"{replacing} stays until it is ready" if replacing else "starting",
                         None)
        self.flush()

    def show_engine(self, info: EngineInfo, profile: "ModelProfile", *, fresh: bool = False) -> None:
        """``profile`` is loaded; ``fresh``: just loaded (speculation on, no engine notice yet, and
        no figures: the last reply's were another profile's, shown under this one's name)."""
        if fresh:
            self.set_speculation(True)
            self.set_notice(None)
            self.clear_reply()
        self.set_engine(info, profile)
        self.flush()

    def clear_reply(self) -> None:
        """No last reply's figures (a new or another chat is shown: they were the chat left's), and
        none live: left while a reply streamed, the HUD said "live" with every figure "—" until
        the next reply."""
        self.stats = None
        self.live = False
        self.round_accepted.clear()
        self._last_counts = (0, 0)
        self._dirty = True

    def show_failed(self, error: str) -> None:
        """Loading failed and nothing is loaded."""
        self.set_error(error)
        self.flush()

    # -- rendering ---------------------------------------------------------------

    def flush(self, force: bool = False) -> None:
        """Re-render if anything changed since the last flush."""
        if not (self._dirty or force):
            return
        self._dirty = False
        line = status_line(self)
        if self.has_class("-legend"):  # the colour view (F4): its legend first, where the line is never cut
            line = Content.assemble(self._legend(one_line=True), "  ", line)
        self._show("#hud-line", line)
        self._show("#hud-engine", self._engine_content())
        self._show("#hud-legend", self._legend())
        loading = self.loading_stage is not None
        self.set_class(loading, "-loading")
        self._show("#hud-loading", Content(f"Loading {self.profile_name or ''}: {self.loading_stage}")
                   if loading else Content(""))
        progress = self.query_one("#hud-progress", ProgressBar)
        if loading:
            if self.loading_fraction is None:
                progress.update(total=None)
            else:
                progress.update(total=1.0, progress=self.loading_fraction)
        self._show("#hud-stats", self._stats_content())
        self._show("#hud-spark", sparkline(self.round_accepted, SPARK_ROUNDS - 12))
        self._show("#hud-positions", self._positions_content())
        self._show("#hud-memory", self._memory_content())

    def _show(self, selector: str, content: Content) -> None:
        """Update one part only when its text changed: every update lays the whole screen
        out again, and while a reply streams most parts stay the same. Names and errors
        come from models files and servers: a part holding a control character is shown
        plain, made :func:`~engine.text_safety.inert` (its colours dropped, never obeyed)."""
        if not is_inert(content.plain):
            content = Content(inert(content.plain))
        key = (content.plain, tuple(content.spans))  # Content's == compares the text alone
        if self._shown.get(selector) != key:
            self._shown[selector] = key
            part = self.query_one(selector, Static)
            part.update(content, layout=self._height_changes(part, content))

    def _height_changes(self, part: Static, content: Content) -> bool:
        """Whether showing ``content`` in ``part`` changes its height. Most updates while a reply
        streams are figures of the same width: then only the part is painted again, not the
        whole screen laid out (a layout re-renders every widget shown: the chat's too). A hidden
        part, or one not laid out yet, is laid out when it is shown."""
        width = part.content_region.width
        if not part.display or not width:
            return False  # hidden (the one-line HUD's parts, or its line): laid out when shown
        return content.get_height(part.styles, width) != part.content_region.height

    def _mode(self) -> tuple[str, str | None]:
        """The mode shown and why speculation is off, if it is."""
        live = self.live and self.stats is not None
        mode = self.stats.mode if live and self.stats else (self.info.mode if self.info else None)
        reason = None
        if live and self.stats and self.stats.speculation_off_reason:
            reason = self.stats.speculation_off_reason
        elif self.info and (self.info.fallback_reason or self.info.off_reason):
            reason = self.info.fallback_reason or self.info.off_reason
        elif not self.speculation_on:
            reason = OFF_BY_YOU
        elif self.notice:
            reason = self.notice
        return mode_label(mode) if mode else DASH, (OFF_BY_YOU if reason == OFF_BY_USER else reason)

    def _drafted(self) -> tuple[str, ...]:
        """The sources the loaded drafter produces: the profile's, unless the engine runs
        without its draft model (dropped for memory or a tokenizer mismatch: the n-gram
        drafter copies instead)."""
        if self.profile is None or hud_server.is_server(self.profile):
            return ("draft", "target")
        drafter = self.profile.drafter
        if self._draft_dropped():
            drafter = "none" if self._all_dropped() else "ngram"
        return drafted_sources(drafter, self.profile.lookup and drafter == "model")

    def _draft_dropped(self) -> bool:
        """The engine runs without the drafter its profile names (:func:`~app.ui.labels.dropped_drafter`)."""
        return dropped_drafter(self.profile, self.info) is not None

    def _all_dropped(self) -> bool:
        """The engine has no drafter at all where its profile names one: it decodes plainly."""
        return dropped_drafter(self.profile, self.info) == "none"

    def _legend(self, one_line: bool = False) -> Content:
        """The colour view's legend: what the loaded drafter produces and what the chat on
        screen holds, in the colours' order (``one_line``: for the one-line HUD, whose second
        line would not show: a suffix profile's three entries left only the first there)."""
        shown = set(self._drafted()) | self.seen_sources
        return legend((s for s in PIECE_SOURCES if s in shown), one_line=one_line)

    def _engine_content(self) -> Content:
        if hud_server.is_server(self.profile):
            return hud_server.engine_content(self.profile, self.info, name=self.profile_name, error=self.error,
                                             loading=self.loading_stage is not None, notice=self.notice)
        rows = [row("profile", self.profile_name or DASH, "bold")]
        if self.profile is not None:
            rows.append(row("target", spec_label(self.profile.target)))
            if self._all_dropped():
                rows.append(row("draft", "none (dropped: plain decoding)", "$text-warning"))
            elif self._draft_dropped():
                rows.append(row("draft", "n-gram lookup (draft model dropped)", "$text-warning"))
            elif self.profile.drafter == "model" and self.profile.draft is not None:
                rows.append(row("draft", spec_label(self.profile.draft)))
            else:
                rows.append(row("draft", {"ngram": "n-gram lookup", "suffix": "suffix lookup"}.get(self.profile.drafter, "none")))
        if self.error:
            rows.append(row("error", self.error, "$text-error"))
        if self.info is None:
            rows.append(row("mode", "loading…" if self.loading_stage else "not loaded", "$text-warning"))
            return lines(*rows)
        mode, reason = self._mode()
        rows.append(row("mode", mode, "bold $text-success" if mode.startswith("spec") else "bold $text-warning"))
        if reason:
            rows.append(row("why", spoken_reason(reason), "$text-warning"))
        rows.append(row("drafter", (self.stats.drafter if self.live and self.stats else None) or self.info.drafter))
        rows.append(row("device", self.info.device))
        return lines(*rows)

    def _stats_content(self) -> Content:
        s = self.stats
        if hud_server.is_server(self.profile, s):
            return hud_server.stats_content(s, live=self.live)
        title = "live" if self.live else ("last reply" if s else "no new reply yet")  # a resumed chat's replies are older
        k = DASH if s is None else (f"{s.k} adaptive" if s.adaptive else str(s.k))
        return lines(
            Content.assemble((f"─ {title} ", "$text-muted"), ("─" * 20, "$text-muted")),
            row("K", k),
            # Two different acceptance figures, named apart (engine.decode.tally explains both).
            row("accepted", DASH if s is None or s.alpha is None else f"{fmt_percent(s.alpha)} of proposed"),
            row("α/token", fmt_float(s.alpha_per_token if s else None)),
            row("τ", fmt_float(s.tau if s else None)),
            *self._origin_rows(s),
            row("tok/s", fmt_rate(s.tokens_per_s if s else None)),
            row("ITL", DASH if s is None or s.itl_ms is None else f"{s.itl_ms:.1f} ms"),
            row("speedup", speedup_text(s, self.live), "bold"),
            row("plain", plain_text(s)),
            *([row("modes", modes_label(s.to_dict()))] if s is not None and len(s.mode_tokens) > 1 else []),
            row("tokens", str(s.tokens) if s else DASH),
        )

    def _origin_rows(self, s: ReplyStats | None) -> list[Content]:
        """Acceptance and τ per drafter, in its colour in the colour view, for a profile with
        more than one (the suffix drafter: this chat and earlier chats; a model that copies first)."""
        if s is None or len(self._drafted()) < 3:
            return []
        out = []
        for o in s.by_origin:
            source = drafted_source(o.origin)
            value = f"{fmt_percent(o.alpha)} τ {fmt_float(o.tau)} ({o.rounds} round{'' if o.rounds == 1 else 's'}) "
            out.append(row(ORIGIN_LABELS[source], Content.styled(value, SOURCE_STYLES[source])))
        return out

    def _positions_content(self) -> Content:
        per_position: Sequence[float] = self.stats.per_position if self.stats else ()
        if not per_position:
            return Content.styled("acceptance by draft position: —", "$text-muted")
        rows = [Content.styled("acceptance by draft position", "$text-muted")]
        for i, frac in enumerate(per_position[:8], start=1):
            rows.append(Content.assemble(f"{i:>2} ", (bar(frac, 16), "$text-success"), f" {frac:4.2f}"))
        return lines(*rows)

    def _memory_content(self) -> Content:
        if hud_server.is_server(self.profile):
            return hud_server.server_content(self.info)
        if self.info is None:
            return Content("")
        info = self.info
        rows = [
            Content.assemble(("─ memory ", "$text-muted"), ("─" * 18, "$text-muted")),
            row("target", fmt_bytes(info.target_bytes)),
            row("draft", fmt_bytes(info.draft_bytes)),
            row("free", fmt_bytes(info.free_bytes)),
        ]
        plan = plan_lines(info.plan)
        if plan:
            rows.append(Content.styled("plan", "$text-muted"))
            rows.extend(Content(f" {line}") for line in plan[:6])
        return lines(*rows)
