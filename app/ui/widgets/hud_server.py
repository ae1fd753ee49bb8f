"""The HUD's panels for a server backend: what the server measured, and why a figure is unknown.

A server reports α and τ only when a reply ends (llama-server's ``timings``,
vLLM's counters), and a speedup only where a plain reply could be had from the
same server; each missing figure shows "—" or "unknown" with the reason, never 0.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from textual.content import Content

from app.ui.formatting import DASH, fmt_float, fmt_rate, fmt_speedup
from app.ui.widgets.hud_rows import lines, row
from engine.api import EngineInfo
from engine.events import ReplyStats
from engine.remote.figures import ServerStats

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile

def is_server(profile: "ModelProfile | None", stats: ReplyStats | None = None) -> bool:
    """Whether the HUD shows a server backend."""
    return isinstance(stats, ServerStats) or getattr(profile, "backend", "local") == "server"


def engine_content(profile: "ModelProfile | None", info: EngineInfo | None, *, name: str | None,
                   error: str | None, loading: bool, notice: str | None) -> Content:
    """Profile, server, model and mode (the mode is the backend's own: it reports speculation
    back on when the server ignored "off", so the app's toggle is not read here)."""
    server = getattr(profile, "server", None)
    rows = [row("profile", name or DASH, "bold")]
    if server is not None:
        rows.append(row("server", server.root))
    if error:
        rows.append(row("error", error, "$text-error"))
    if info is None:
        rows.append(row("mode", "connecting…" if loading else "not connected", "$text-warning"))
        return lines(*rows)
    rows.append(row("model", info.target.rsplit("/", 1)[-1]))  # a GGUF path or org/name: its last part
    rows.append(row("kind", info.device))
    if info.mode == "spec":  # the backend's own state: it turns speculation back on when the server ignored "off"
        rows.append(row("mode", "speculative · on the server", "bold $text-success"))
    else:
        rows.append(row("mode", "plain (asked with speculative.n_max = 0)", "bold $text-warning"))
    rows.append(row("drafter", "chosen by the server"))
    if notice:
        rows.append(row("why", notice, "$text-warning"))
    return lines(*rows)


def stats_content(stats: ReplyStats | None, *, live: bool) -> Content:
    """α, τ, tokens/s and the speedup as the server measured them."""
    s = stats if isinstance(stats, ServerStats) else None
    title = "live" if live else ("last reply" if stats else "no new reply yet")
    rows = [Content.assemble((f"─ {title} ", "$text-muted"), ("─" * 20, "$text-muted"))]
    if s is None:
        rows += [row("α", DASH), row("τ", DASH), row("tok/s", DASH), row("speedup", DASH)]
        return lines(*rows)
    if s.alpha is not None:
        rows.append(row("α", f"{fmt_float(s.alpha)}  ({s.accepted}/{s.proposed} drafted)"))
        tau = fmt_float(s.tau)
        if s.mean_accepted_len is not None:
            tau += f"  (per draft {fmt_float(s.mean_accepted_len)})"
        rows.append(row("τ", tau))
        rows.append(row("from", f"the server's {s.figures_from}", "$text-muted"))
    else:
        rows += [row("α", DASH), row("τ", DASH)]
        if s.figures_reason:
            rows.append(row("why", s.figures_reason, "$text-warning"))
    rate = fmt_rate(s.tokens_per_s)
    if s.client_tokens_per_s is not None and s.tokens_per_s != s.client_tokens_per_s:
        rate += f" server · {fmt_rate(s.client_tokens_per_s)} here"
    rows.append(row("tok/s", rate))
    if s.speedup is not None:
        rows.append(row("speedup", f"{fmt_speedup(s.speedup)} vs plain {fmt_rate(s.plain_tokens_per_s)} tok/s", "bold"))
    elif live:
        rows.append(row("speedup", "measuring…" if s.speedup_reason else "after the reply", "$text-muted"))
        if s.speedup_reason:
            rows.append(row("why", s.speedup_reason.removeprefix("measuring: "), "$text-muted"))
    else:
        rows.append(row("speedup", "unknown", "bold $text-warning"))
        if s.speedup_reason:
            rows.append(row("why", s.speedup_reason.removeprefix("speedup unknown: "), "$text-warning"))
    rows.append(row("tokens", str(s.tokens)))
    return lines(*rows)


def server_content(info: EngineInfo | None) -> Content:
    """The connection's facts where a local backend shows its memory."""
    if info is None:
        return Content("")
    rows = [Content.assemble(("─ server ", "$text-muted"), ("─" * 18, "$text-muted"))]
    for key, value in info.plan.items():
        if value is not None and key != "model" and not isinstance(value, (dict, list, tuple)):
            rows.append(Content(f" {value}") if key == "summary" else row(f" {key}", str(value)))
    return lines(*rows)
