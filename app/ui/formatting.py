"""Small formatters shared by the HUD, the chat view and exports.

Every function accepts None and answers "—", so the HUD never shows "None".
"""
from __future__ import annotations

from typing import Any

DASH = "—"


def fmt_float(value: float | None, digits: int = 2) -> str:
    """``0.7234 -> "0.72"``; None -> "—"."""
    return DASH if value is None else f"{value:.{digits}f}"


def fmt_percent(value: float | None) -> str:
    """A fraction as a whole percentage: ``0.538 -> "54%"``."""
    return DASH if value is None else f"{100 * value:.0f}%"


def fmt_rate(value: float | None) -> str:
    """Tokens per second with one decimal."""
    return DASH if value is None else f"{value:.1f}"


def fmt_speedup(value: float | None) -> str:
    """``2.314 -> "2.31×"``; None (not yet measured) -> "—"."""
    return DASH if value is None else f"{value:.2f}×"


def _field(stats: Any, key: str) -> Any:
    """``key`` of a reply's statistics, a dict (saved) or a ReplyStats (live)."""
    return stats.get(key) if isinstance(stats, dict) else getattr(stats, key, None)


def speedup_figure(stats: Any, *, live: bool = False) -> str | None:
    """The one speedup every view shows (HUD, folded line, reply footer, export, ``generate``):
    ``"1.18× ± 0.04"``; ``"measuring…"`` while a reply below the evidence floor streams,
    ``"too short to measure"`` once it ended; None for a reply decoded plainly (nothing
    drafted: no speedup to show, also for replies saved before the engine said so).
    Statistics saved before the error existed show their figure without one."""
    from engine.events import PLAIN_REPLY

    if stats is None or _field(stats, "speedup_note") == PLAIN_REPLY:
        return None
    if _field(stats, "mode") == "plain" and not _field(stats, "proposed"):
        return None
    value = _field(stats, "speedup")
    if value is not None:
        se = _field(stats, "speedup_se")
        return f"{value:.2f}×" + (f" ± {se:.2f}" if se is not None else "")
    if not _field(stats, "tokens"):
        return None
    if live:
        return "measuring…"
    if _field(stats, "server"):  # a server's reply: no plain reply to compare with (engine.remote)
        return "unknown"
    return _field(stats, "speedup_note") or "too short to measure"


def spoken_reason(reason: str) -> str:
    """Why decoding is plain, as the views say it: an automatic switch-off (the engine's
    ``NOT_PAYING``) reads "speculation off: not paying here"."""
    from engine.events import NOT_PAYING

    return f"speculation off: {NOT_PAYING}" if reason == NOT_PAYING else reason


def fmt_bytes(value: int | None) -> str:
    """Bytes in binary units: ``1536 -> "1.5 KiB"``."""
    if value is None:
        return DASH
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


MODE_LABELS = {
    "spec": "speculative · model draft",
    "ngram": "speculative · lookup",  # the n-gram or the suffix drafter: the drafter row says which
    "plain": "plain decoding",
}


def mode_label(mode: str | None) -> str:
    """A human name for an engine mode."""
    return MODE_LABELS.get(mode or "", mode or DASH)


SHORT_MODE_LABELS = {"spec": "model draft", "ngram": "lookup", "plain": "plain"}


def modes_label(stats: dict[str, Any]) -> str:
    """The modes a reply ran in with their share of its tokens, ``"lookup on 72% · plain 28%"``
    (drafting on for 72% of its tokens: "lookup 72%" read as 72% of the tokens drafted); a reply
    that ran in one mode only gets that mode's full name."""
    shares = {m: n for m, n in (stats.get("mode_tokens") or {}).items() if n}
    if len(shares) < 2:
        return mode_label(next(iter(shares), None) or stats.get("mode"))
    total = sum(shares.values())
    return " · ".join(f"{SHORT_MODE_LABELS.get(m, m)}{'' if m == 'plain' else ' on'} {round(100 * n / total)}%"
                      for m, n in shares.items())


def bar(fraction: float | None, width: int = 10) -> str:
    """A horizontal bar of ``width`` cells using eighth blocks."""
    if fraction is None:
        return " " * width
    fraction = max(0.0, min(1.0, fraction))
    eighths = round(fraction * width * 8)
    full, rest = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[rest] if rest else ""
    return ("█" * full + partial).ljust(width)


PLAN_CHOICES = {
    "target+draft": "target + draft model",
    "target+ngram": "target + n-gram lookup",
    "target": "target alone",
}


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """What a memory plan says, as a person would read it: what was chosen, the
    memory it needs of what is available, the budget, headroom and context.

    Only the fields named here are shown (a raw ``budget bytes: None`` says nothing);
    a ``summary`` (or ``description``) given by the plan comes first.
    """
    if not plan:
        return []
    lines: list[str] = []
    summary = plan.get("summary") or plan.get("description")
    choice = plan.get("choice")
    if summary:
        lines.append(str(summary))
    elif choice == "target+ngram" and plan.get("lookup"):  # the drafter by its HUD name ("suffix lookup")
        lines.append(f"target + {plan['lookup']}")
    elif choice:
        lines.append(PLAN_CHOICES.get(str(choice), str(choice).replace("+", " + ")))
    planned, available = plan.get("planned_bytes"), plan.get("available_bytes")
    if isinstance(planned, int) and isinstance(available, int):
        lines.append(f"needs {fmt_bytes(planned)} of {fmt_bytes(available)}")
    if isinstance(plan.get("budget_bytes"), int):
        lines.append(f"budget {fmt_bytes(plan['budget_bytes'])}")
    if isinstance(plan.get("headroom_bytes"), int):
        lines.append(f"headroom {fmt_bytes(plan['headroom_bytes'])}")
    if isinstance(plan.get("context_length"), int):
        lines.append(f"context {plan['context_length']:,} tokens")
    return lines


ERROR_KEY = "error"
"""Where a failed reply's figures (saved with it) keep why it failed: the reason was shown only in
a toast, gone once it faded or the chat was reopened, the reply reading "✗ failed" alone."""
FAILURE_CHARS = 160
"""The most of a failure's reason a reply's footer shows (the export keeps it whole)."""


def with_failure(stats: dict[str, Any] | None, error: str | None) -> dict[str, Any] | None:
    """``stats`` with ``error`` kept under :data:`ERROR_KEY` (``stats`` itself when there is none)."""
    return stats if not error else {**(stats or {}), ERROR_KEY: error}


def split_failure(stats: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str | None]:
    """A saved reply's figures (None when it has none) and why it failed (None for one that did not)."""
    if not stats or ERROR_KEY not in stats:
        return stats, None
    figures = {key: value for key, value in stats.items() if key != ERROR_KEY}
    return figures or None, str(stats[ERROR_KEY])


def reply_summary(stats: dict[str, Any] | None) -> str:
    """A reply's final figures on one short line (shown under the reply)."""
    if not stats:
        return ""
    if stats.get("server"):  # engine.remote.figures.ServerStats: the server's own figures
        return server_reply_summary(stats)
    parts = [modes_label(stats)]
    if stats.get("proposed"):
        parts += [f"accepted {fmt_percent(stats.get('alpha'))}", f"α/token {fmt_float(stats.get('alpha_per_token'))}",
                  f"τ {fmt_float(stats.get('tau'))}"]
    parts.append(f"{fmt_rate(stats.get('tokens_per_s'))} tok/s")
    speedup = speedup_figure(stats)
    if speedup is not None:
        parts.append(f"{speedup} vs plain" if stats.get("speedup") is not None else f"speedup {speedup}")
    parts.append(tokens_text(stats.get("tokens", 0)))
    return " · ".join(parts)


def tokens_text(n: int) -> str:
    """``"1 token"``, ``"12 tokens"``."""
    return f"{n} token" if n == 1 else f"{n} tokens"


def server_reply_summary(stats: dict[str, Any]) -> str:
    """The footer of a reply a server decoded: its α and τ, or that it reported none; the speedup or "unknown"."""
    parts = [f"{stats['server']} server" + (" · plain" if stats.get("mode") == "plain" else "")]
    if stats.get("alpha") is not None:
        parts += [f"α {fmt_float(stats.get('alpha'))}", f"τ {fmt_float(stats.get('tau'))}"]
    elif stats.get("mode") != "plain":
        parts.append("no speculative figures")
    parts.append(f"{fmt_rate(stats.get('tokens_per_s'))} tok/s")
    speedup = stats.get("speedup")
    parts.append(f"{fmt_speedup(speedup)} vs plain" if speedup is not None else "speedup unknown")
    parts.append(tokens_text(stats.get("tokens", 0)))
    return " · ".join(parts)
