"""What a server measures about speculation, turned into specchat's figures.

Two sources, per reply:

* llama-server puts ``timings`` in its last stream chunk: ``predicted_n``,
  ``predicted_per_second`` and, when it drafted anything, ``draft_n`` and
  ``draft_n_accepted``.
* vLLM (and llama-server started with ``--metrics``) count drafting in
  Prometheus counters at ``/metrics``: ``*:spec_decode_num_drafts``,
  ``*:spec_decode_num_draft_tokens``, ``*:spec_decode_num_accepted_tokens``
  and ``*:spec_decode_num_accepted_tokens_per_pos{position="i"}`` (with or
  without the ``_total`` suffix). A reply's figures are the counters' deltas
  across it; other clients' requests in the same window mix in.

The figures, named as in the paper:

* α, the acceptance rate: accepted ÷ drafted tokens.
* τ, tokens per target forward pass: every pass emits one token of the target's
  own plus the drafts it accepted, so passes = tokens − accepted and
  τ = tokens ÷ (tokens − accepted). (llama-server's log prints "mean len" =
  1 + accepted ÷ verification steps: the same where every step drafted.)

A server that reports nothing gets ``None`` and a reason, never zeros.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from engine.events import ReplyStats

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d{1,3})"')
"""A draft position label; a longer number (a hostile server's 5,000 digits ended the connect in
a ValueError) is no position any drafter reaches, and its sample is left out."""


@dataclass(frozen=True)
class ServerStats(ReplyStats):
    """:class:`~engine.events.ReplyStats` of a reply decoded by a server.

    ``figures_from`` names where α and τ came from (``"timings"``,
    ``"metrics"``, or both joined by ``+``); ``figures_reason`` says why they
    are None when they are. ``speedup_reason`` says how the speedup was
    measured or why it is unknown. ``tokens_per_s`` is the server's own decode
    rate where it reports one, else the rate seen by specchat;
    ``client_tokens_per_s`` is always the latter (network included).
    ``mean_accepted_len`` is 1 + accepted ÷ verification steps (counters only).
    """

    server: str = ""
    figures_from: str | None = None
    figures_reason: str | None = None
    speedup_reason: str | None = None
    client_tokens_per_s: float | None = None
    mean_accepted_len: float | None = None
    prompt_tokens: int | None = None

    LOCAL_ONLY = ("k", "rounds", "draft_s", "verify_s", "other_s")
    """Fields of a local engine's rounds: a server shows none of them (its ``k`` 0 read as plain
    decoding), so its dict says null."""

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), **dict.fromkeys(self.LOCAL_ONLY)}


@dataclass(frozen=True)
class SpecCounters:
    """Speculative-decoding counters read from one ``/metrics`` scrape."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        """The counts between ``before`` and this scrape."""
        return SpecCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted=self.accepted - before.accepted,
            per_position={i: v - before.per_position.get(i, 0.0) for i, v in self.per_position.items()},
        )


def parse_spec_counters(text: str) -> SpecCounters | None:
    """The spec-decode counters in a Prometheus text exposition (any prefix,
    summed over label sets), or None when it has none or when any of them is not a finite
    count (``NaN``, ``+Inf``, negative)."""
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1).rsplit(":", 1)[-1]
        if name.endswith("_total"):
            name = name[: -len("_total")]
        if not name.startswith("spec_decode_num_"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if not math.isfinite(value) or value < 0:
            # A counter is a finite count. Skipping just this sample would make the next
            # scrape's difference wrong, so the whole scrape counts as telling nothing.
            return None
        if name == "spec_decode_num_accepted_tokens_per_pos":
            pos = _POSITION.search(m.group(2) or "")
            if pos:
                i = int(pos.group(1))
                per_pos[i] = per_pos.get(i, 0.0) + value
            continue
        sums[name] = sums.get(name, 0.0) + value
    if not sums and not per_pos:
        return None
    return SpecCounters(
        drafts=sums.get("spec_decode_num_drafts", 0.0),
        draft_tokens=sums.get("spec_decode_num_draft_tokens", 0.0),
        accepted=sums.get("spec_decode_num_accepted_tokens", 0.0),
        per_position=per_pos,
    )


@dataclass(frozen=True)
class Figures:
    """One reply's speculation figures (None where the server told nothing)."""

    proposed: int = 0
    accepted: int = 0
    alpha: float | None = None
    tau: float | None = None
    per_position: tuple[float, ...] = ()
    mean_accepted_len: float | None = None
    source: str | None = None
    reason: str | None = None


def tau_of(tokens: int, accepted: int) -> float | None:
    """Tokens per target pass: ``tokens / (tokens - accepted)``."""
    passes = tokens - accepted
    return tokens / passes if tokens > 0 and passes > 0 else None


def conditional_rates(per_pos: dict[int, float], drafts: float) -> tuple[float, ...]:
    """Acceptance at each draft position given the ones before it were accepted.

    Position 0 is reached by every draft, position ``i`` by the drafts whose
    position ``i - 1`` was accepted (drafts shorter than K make the deeper
    rates slightly low)."""
    rates: list[float] = []
    reached = drafts
    for i in sorted(per_pos):
        if reached <= 0:
            break
        rates.append(max(0.0, min(1.0, per_pos[i] / reached)))
        reached = per_pos[i]
    return tuple(rates)


_COUNTS = ("predicted_n", "prompt_n", "cache_n", "draft_n", "draft_n_accepted")
MAX_COUNT = 10**9
"""The most tokens a count from a server may hold (a reply, a prompt, the drafts of one reply)."""
RATE_RANGE = (1e-3, 1e6)
"""Tokens a second a server could have decoded at: a rate outside it is no measurement (one of
1e308 filled the HUD with a 309-digit figure, one of 5e-324 made the speedup infinite)."""
MAX_MS = 1e10
"""The longest time (milliseconds) a server's timings may report: about four months."""


def _number(value: Any) -> int | float | None:
    """``value`` if it is a finite number (not a bool; an int too big for a float is no measurement)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return value if abs(value) <= 2**63 else None
    return value if math.isfinite(value) else None


def clean_count(value: Any) -> int | None:
    """``value`` as a count a server could have made (a whole number from 0 to :data:`MAX_COUNT`), or None."""
    number = _number(value)
    if number is None or number != int(number) or not 0 <= number <= MAX_COUNT:
        return None
    return int(number)


def clean_usage(raw: dict[str, Any]) -> dict[str, int]:
    """A reply's OpenAI ``usage`` with only counts a server could have made (:func:`clean_count`):
    a negative, fractional, 400-digit or non-numeric count is left out, never shown or divided by."""
    counts = {key: clean_count(value) for key, value in raw.items()
              if key in ("completion_tokens", "prompt_tokens", "total_tokens")}
    return {key: value for key, value in counts.items() if value is not None}


def clean_timings(raw: dict[str, Any]) -> dict[str, Any]:
    """A server's ``timings`` with only the values a server could have measured: counts as
    whole numbers from 0 to :data:`MAX_COUNT`, rates (``*_per_second``) within :data:`RATE_RANGE`,
    other times as finite numbers from 0 to :data:`MAX_MS` (a string, NaN, a list or an infinity
    is left out), and ``draft_n_accepted`` with ``draft_n`` only when it is at most that (else
    both left out: an acceptance rate over 1 is no figure)."""
    out: dict[str, Any] = {}
    for key, raw_value in raw.items():
        value = _number(raw_value)
        if value is None or value < 0:
            continue
        if key in _COUNTS:
            value = clean_count(value)
            if value is None:
                continue
        elif key.endswith("_per_second"):
            if not RATE_RANGE[0] <= value <= RATE_RANGE[1]:
                continue
        elif value > MAX_MS:
            continue
        out[key] = value
    if "draft_n_accepted" in out and out["draft_n_accepted"] > out.get("draft_n", -1):
        out.pop("draft_n_accepted")
        out.pop("draft_n", None)
    return out


def reply_figures(timings: dict[str, Any] | None, delta: SpecCounters | None, tokens: int,
                  *, metrics_known: bool, server: str) -> Figures:
    """α, τ and per-position acceptance of one reply from whichever source has them.

    ``timings`` is the reply's llama-server ``timings`` object, ``delta`` the
    counters' change across the reply (None when unscraped), ``tokens`` the
    reply's length, ``metrics_known`` whether the server exposes spec-decode
    counters at all.
    """
    sources: list[str] = []
    proposed = accepted = 0
    if timings and int(timings.get("draft_n") or 0) > 0 and int(timings.get("draft_n_accepted") or 0) <= tokens:
        proposed, accepted = int(timings["draft_n"]), int(timings.get("draft_n_accepted") or 0)
        sources.append("timings")
    per_position: tuple[float, ...] = ()
    mean_len = None
    if delta is not None and delta.draft_tokens > 0 and 0 <= delta.accepted <= delta.draft_tokens \
            and delta.drafts >= 0 and (sources or delta.accepted <= tokens):
        # (an acceptance over 1, or more accepted than the reply has tokens, is no figure)
        if not sources:
            proposed, accepted = int(round(delta.draft_tokens)), int(round(delta.accepted))
        if delta.drafts > 0:
            per_position = conditional_rates(delta.per_position, delta.drafts)
            mean_len = 1.0 + delta.accepted / delta.drafts
        sources.append("metrics")
    if proposed > 0:
        return Figures(proposed, accepted, accepted / proposed, tau_of(tokens, accepted), per_position,
                       mean_len, "+".join(sources))
    return Figures(reason=no_figures_reason(timings, delta, metrics_known, server))


def no_figures_reason(timings: dict[str, Any] | None, delta: SpecCounters | None,
                      metrics_known: bool, server: str) -> str:
    """Why a reply has no α/τ, in words the user can act on."""
    if timings is not None or (delta is not None and metrics_known):
        return (f"{server} drafted no tokens in this reply: speculation is off on the server "
                "(llama-server without -md/--spec-type, vLLM without --speculative-config), "
                "or no n-gram matched")
    if metrics_known:
        return f"{server}: the reply ended before its spec-decode counters could be read"
    return (f"{server} reports no speculative figures: no `timings.draft_n` in its replies and no "
            "spec_decode counters at /metrics")
