"""The HUD folded to one status line, for terminals too narrow for the side panel.

Below :data:`HUD_MIN_WIDTH` columns the HUD docks under the chat as one line
(the chat keeps the whole width); a key toggles the full panel at any width.
"""
from __future__ import annotations

from typing import Protocol

from textual.content import Content

from app.ui.formatting import (
    DASH, fmt_float, fmt_percent, fmt_rate, fmt_speedup, mode_label, speedup_figure, spoken_reason,
)
from engine.api import EngineInfo
from engine.events import NOT_PAYING, ReplyStats


class HudState(Protocol):
    """What the status line shows (the HUD's state, :class:`app.ui.widgets.hud.Hud`)."""

    profile_name: str | None
    error: str | None
    loading_stage: str | None
    loading_fraction: float | None
    info: EngineInfo | None
    stats: ReplyStats | None
    live: bool

HUD_MIN_WIDTH = 110
"""Narrower terminals get the one-line HUD (the side panel takes 40 columns)."""

SEP = (" · ", "$text-muted")
SHORT_MODES = {"spec": "spec", "ngram": "lookup", "plain": "plain"}


def status_line(hud: HudState, toggle_key: str = "F6") -> Content:
    """Profile, mode and the live figures on one line; loading and errors take its place."""
    name = hud.profile_name or DASH
    hint = (f"  {toggle_key}: full HUD", "$text-muted")
    if hud.error:
        return Content.assemble((name, "bold"), SEP, (f"✗ {hud.error}", "$text-error"), hint)
    if hud.loading_stage is not None:
        return Content.assemble((name, "bold"), SEP, (loading_text(hud.loading_stage, hud.loading_fraction),
                                                      "$text-warning"), hint)
    if hud.info is None:
        return Content.assemble((name, "bold"), SEP, ("not loaded", "$text-warning"), hint)
    s = hud.stats
    mode = (s.mode if (hud.live and s) else hud.info.mode) or ""
    label = SHORT_MODES.get(mode, mode_label(mode))
    reason = (s.speculation_off_reason if hud.live and s else None) or hud.info.fallback_reason or hud.info.off_reason
    if mode == "plain" and reason == NOT_PAYING:
        label = spoken_reason(reason)  # stepped aside on the evidence: say so in words
    parts: list[tuple[str, str] | str] = [(name, "bold"), SEP, (label,
                                          "$text-success" if mode in ("spec", "ngram") else "$text-warning")]
    if s is not None:
        if s.proposed:
            parts += [SEP, f"accepted {fmt_percent(s.alpha)}", SEP, f"τ {fmt_float(s.tau)}"]
        parts += [SEP, f"{fmt_rate(s.tokens_per_s)} tok/s"]
        if getattr(s, "server", ""):  # a server reply: its own figures (engine.remote.figures)
            if s.speedup is not None:
                parts += [SEP, (fmt_speedup(s.speedup), "bold")]
            elif not hud.live:  # no plain reply to compare with
                parts += [SEP, "speedup unknown"]
            elif s.tokens and mode != "plain":
                parts += [SEP, "speedup measuring…"]
        else:
            speedup = speedup_figure(s, live=hud.live)  # the same figure as the HUD's and the footer's
            if speedup is not None:  # a note is named as the speedup's, as every other view names it
                parts += [SEP, (speedup, "bold") if s.speedup is not None else f"speedup {speedup}"]
    parts.append(("  live" if hud.live else "", "$text-success"))
    parts.append(hint)
    return Content.assemble(*parts)


def loading_text(stage: str, fraction: float | None) -> str:
    """The loading stage on one line, its figures first: ``"loading: 25% · 12.3 of 93.0 MB, 9.8 MB/s,
    8 s left · downloading SmolLM2-135M-Instruct"``. An 80-column terminal cuts the line's end, so the
    name goes last and the percentage, the sizes, the speed and the time (left or elapsed) stay."""
    what, _, figures = stage.partition(": ")
    pct = f"{fraction * 100:.0f}%" if fraction is not None else ""
    return "loading: " + " · ".join(part for part in (pct, figures, what) if part)
