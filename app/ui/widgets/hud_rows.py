"""The HUD's rows as text: a label and its value, the α sparkline, the speedup and plain-speed figures.

Shared by the local HUD (:mod:`app.ui.widgets.hud`) and the server's panels
(:mod:`app.ui.widgets.hud_server`), so a row reads the same in both.
"""
from __future__ import annotations

from collections.abc import Sequence

from textual.content import Content

from app.ui.formatting import DASH, fmt_rate, speedup_figure
from engine.events import ReplyStats

LABEL_WIDTH = 9
SPARK_ROUNDS = 48


def row(label: str, value: str | Content, style: str = "") -> Content:
    """``label   value`` with a muted, fixed-width label."""
    return Content.assemble((label.ljust(LABEL_WIDTH), "$text-muted"), (value, style) if isinstance(value, str) else value)


def lines(*rows: Content) -> Content:
    """Join rows with newlines."""
    return Content("\n").join(rows)


SPARK_CHARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int) -> Content:
    """The last ``width`` values in [0, 1] as eighth-block columns, on an absolute scale.

    Textual's Sparkline rescales to the data's own min..max, which makes a steady
    α = 0.9 look like noise; acceptance reads better against the fixed 0..1 range.
    """
    if not values:
        return Content.styled("no rounds yet", "$text-muted")
    recent = list(values)[-width:]
    cells = "".join(SPARK_CHARS[min(7, max(0, round(v * 7)))] for v in recent)
    return Content.styled(cells, "$text-success")


def speedup_text(stats: ReplyStats | None, live: bool = True) -> str:
    """The reply's one speedup with its standard error (:func:`speedup_figure`): "measuring…"
    while a reply below the evidence floor streams, "too short to measure" after; "—" for a
    reply that drafted nothing."""
    return speedup_figure(stats, live=live) or DASH


def plain_text(stats: ReplyStats | None) -> str:
    """The estimated plain speed, and the K = 0 rounds that cross-check it; nothing where the
    speedup is not shown (below its evidence floor, the estimate is what it is not shown for: a
    new user read "plain 4.8 est · 89.0 in 1 K=0" beside "too uncertain to measure")."""
    if stats is None or stats.plain_tokens_per_s is None or stats.speedup is None:
        return DASH
    text = f"{fmt_rate(stats.plain_tokens_per_s)} est"
    if stats.plain_rounds:
        text += f" · {fmt_rate(stats.plain_measured_tokens_per_s)} in {stats.plain_rounds} K=0"
    return text
