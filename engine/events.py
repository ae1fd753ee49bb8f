"""Plain data crossing the engine's boundary: requests in, events and statistics out.

Everything here is a frozen dataclass of Python scalars and tuples, so the UI,
the CLI's JSON and the history database can hold on to them without touching
tensors.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

Mode = Literal["spec", "ngram", "plain"]
TokenSource = Literal["draft", "target"]
DraftOrigin = Literal["model", "chat", "history"]
"""Who proposed a round's draft: a draft ``model``; a copy of this ``chat``'s earlier text
(the n-gram lookup, also a model drafter's lookup-first copy); or ``history``, an earlier
chat's continuation (the suffix drafter's global index)."""
FinishReason = Literal["eos", "stop", "length", "context", "cancelled", "error"]
"""``context``: the context window (prompt + reply) is full."""

TOO_SHORT = "too short to measure"
"""``ReplyStats.speedup_note`` when the reply holds less evidence than the floor
(:data:`engine.decode.tally.SPEEDUP_FLOOR` says what the floor is)."""
TOO_NOISY = "too uncertain to measure"
"""``ReplyStats.speedup_note`` when the reply is past the floor but its speedup's standard error
is more than :data:`engine.decode.tally.SPEEDUP_MAX_RELATIVE_SE` of the figure (a busy
machine's timings): "1.07× ± 3.22" says nothing a reader can use."""
PLAIN_REPLY = "decoded plainly"
"""``ReplyStats.speedup_note`` when nothing was drafted in the reply: there is no speedup to show."""
NOT_PAYING = "not paying here"
"""``ReplyStats.speculation_off_reason`` after an automatic switch-off (the HUD shows
"speculation off: not paying here"); the evidence is in ``speculation_off_detail``."""
OFF_BY_USER = "speculation switched off by the user"
"""``ReplyStats.speculation_off_reason`` while the user keeps speculation off (F5, ``--mode plain``)."""


MIN_TEMPERATURE = 0.001
"""The least temperature above 0 (greedy): below it sampling is greedy decoding in all but name,
and a temperature of 1e-300 divided the logits into infinities (every reply failed, blaming the
model's float16)."""


SEED_LIMIT = 2**63
"""Seeds are 0 ≤ seed < 2**63, in the app's F10 and on the command line alike (they travel as JSON
and through the engine's hash; ``generate --seed -1`` ran where F10 refused it)."""


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen.

    ``temperature == 0`` means greedy (argmax). ``top_k == 0`` and ``top_p == 1``
    disable truncation. ``seed`` makes a sampled reply reproducible.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 and finite, got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {self.temperature:g}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < SEED_LIMIT):
            raise ValueError(f"seed must be a whole number from 0 to {SEED_LIMIT - 1} or None, got {self.seed!r}")


MAX_K = 32
"""The most tokens a round may draft (K): a verify pass of K + 1 tokens costs more than a third of
a step a token on a CPU (docs/performance.md) and a card's fused attention takes passes of up to
32, so more drafts nothing that pays, while the schedule's tables grow with K (a K of a billion
ran the machine out of memory)."""


@dataclass(frozen=True)
class GenerationParams:
    """One reply's request: sampling, stop conditions and the speculation schedule.

    ``k`` fixes K for every round; ``None`` lets the engine choose K each round
    within ``[k_min, k_max]`` from measured acceptance and costs.
    """

    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    k: int | None = None
    k_min: int = 1
    k_max: int = 8
    private: bool = False
    """A private chat's reply: drafters that learn from earlier chats
    (:class:`~engine.decode.suffix.SuffixDrafter`) do not keep it."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.k is not None and not 0 <= self.k <= MAX_K:
            raise ValueError(f"k must be from 0 to {MAX_K}, got {self.k}")
        if not 0 <= self.k_min <= self.k_max <= MAX_K:
            raise ValueError(f"need 0 <= k_min <= k_max <= {MAX_K}, got {self.k_min}, {self.k_max}")

    def cut(self, emitted: list[int], remaining: int) -> "tuple[list[int], FinishReason | None]":
        """Cut a round's tokens at the first stop token (kept) or after ``remaining`` tokens,
        whichever comes first: a stop token past the budget is never reached (plain decoding,
        one token a round, would have ended at the budget)."""
        for i, token in enumerate(emitted[:max(remaining, 0)]):
            if token in self.stop_token_ids:
                return emitted[: i + 1], "eos"
        if len(emitted) >= remaining:
            return emitted[:remaining], "length"
        return emitted, None


class ReplySettings(Protocol):
    """A profile's sampling and K settings (``engine.config.profiles.ModelProfile`` has them)."""

    @property
    def temperature(self) -> float: ...

    @property
    def top_p(self) -> float: ...

    @property
    def top_k(self) -> int: ...

    @property
    def k(self) -> int | None: ...

    @property
    def k_min(self) -> int: ...

    @property
    def k_max(self) -> int: ...


def generation_params(profile: ReplySettings, max_new_tokens: int, *, temperature: float | None = None,
                      top_p: float | None = None, top_k: int | None = None, seed: int | None = None,
                      k: int | None = None) -> GenerationParams:
    """A reply's settings: each override given, else the profile's (``k`` None: the profile's,
    which may be adaptive). Raises ValueError on a bad value, before any model reads a token."""
    sampling = SamplingParams(
        temperature=profile.temperature if temperature is None else temperature,
        top_p=profile.top_p if top_p is None else top_p,
        top_k=profile.top_k if top_k is None else top_k,
        seed=seed,
    )
    return GenerationParams(sampling=sampling, max_new_tokens=max_new_tokens, k=profile.k if k is None else k,
                            k_min=profile.k_min, k_max=profile.k_max)


@dataclass(frozen=True)
class OriginFigures:
    """One draft origin's share of a reply: the rounds it drafted, its proposed and accepted
    tokens and the tokens those rounds emitted (accepted plus the target's own one)."""

    origin: DraftOrigin
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    tokens: int = 0

    @property
    def alpha(self) -> float | None:
        """Acceptance rate of this origin's drafts (accepted ÷ proposed)."""
        return self.accepted / self.proposed if self.proposed else None

    @property
    def tau(self) -> float | None:
        """Tokens per target pass in the rounds this origin drafted."""
        return self.tokens / self.rounds if self.rounds else None


@dataclass(frozen=True)
class ReplyStats:
    """Running statistics of one reply (all times in seconds, wall clock).

    ``speedup`` is measured, not assumed: ``tokens_per_s`` divided by
    ``plain_tokens_per_s``, the speed plain decoding would have had over the
    same stretch of time on this machine, estimated from every round of the
    session (``engine.decode.pass_costs`` gives the estimator), with its standard
    error ``speedup_se``. It is the one figure every view shows (HUD, reply footer,
    export, ``generate --json`` and its timing line). ``None`` below the evidence
    floor (:data:`engine.decode.tally.SPEEDUP_FLOOR`) or when nothing was
    drafted; ``speedup_note`` then says which (:data:`TOO_SHORT`,
    :data:`PLAIN_REPLY`). ``plain_rounds`` counts this reply's rounds
    with K = 0 and ``plain_measured_tokens_per_s`` is their own speed: a
    cross-check of the estimate.

    ``alpha`` is the **acceptance rate**, accepted ÷ proposed draft tokens (it
    falls as K grows); ``alpha_per_token`` is the paper's per-token α of
    τ = (1 - α^(K+1)) / (1 - α), from per-position acceptance: accepted ÷
    positions reached. A per-token α of 0.8 at K = 5 shows as an acceptance
    rate of 0.54. ``mode_tokens`` gives the tokens produced in each mode, as
    ``(mode, tokens)`` pairs in the order the modes first ran (a reply that
    speculated until an automatic switch-off has two). ``by_origin`` splits the
    drafted rounds by who proposed them (:data:`DraftOrigin`), in the order each first drafted.
    """

    mode: Mode = "plain"
    drafter: str = "none"
    k: int = 0
    adaptive: bool = False
    rounds: int = 0
    target_passes: int = 0
    proposed: int = 0
    accepted: int = 0
    tokens: int = 0
    alpha: float | None = None
    alpha_per_token: float | None = None
    tau: float | None = None
    per_position: tuple[float, ...] = ()
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    prefill_s: float = 0.0
    elapsed_s: float = 0.0
    tokens_per_s: float | None = None
    itl_ms: float | None = None
    plain_tokens_per_s: float | None = None
    speedup: float | None = None
    speedup_se: float | None = None
    speedup_note: str | None = None
    plain_rounds: int = 0
    plain_measured_tokens_per_s: float | None = None
    mode_tokens: tuple[tuple[Mode, int], ...] = ()
    speculation_off_reason: str | None = None
    speculation_off_detail: str | None = None
    """The evidence behind an automatic switch-off (for logs and ``--json``; the views say
    :data:`NOT_PAYING`)."""
    truncated_turns: int = 0
    """Earlier messages left out so the conversation fits the context window."""
    by_origin: tuple[OriginFigures, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_position"] = list(self.per_position)
        d["mode_tokens"] = dict(self.mode_tokens)
        d["by_origin"] = list(d["by_origin"])
        return d


@dataclass(frozen=True)
class RoundEvent:
    """What one round of the decoder produced.

    ``token_ids`` are the newly emitted ids in order; ``sources[i]`` says whether
    ``token_ids[i]`` was a draft token the target accepted or a token the target
    chose itself (a correction after a rejection, or the bonus after all K were
    accepted, or a plain step); ``origin`` says who proposed the round's draft (None:
    nothing was proposed). ``finish_reason`` is set on the last event only.
    ``notice`` carries a one-line message for the user (fallback, switch-off).
    """

    token_ids: tuple[int, ...]
    sources: tuple[TokenSource, ...]
    stats: ReplyStats
    finish_reason: FinishReason | None = None
    notice: str | None = None
    origin: DraftOrigin | None = None


@dataclass(frozen=True)
class TextPiece:
    """A piece of reply text and where its token came from (``origin``: who drafted an
    accepted draft token; None for the target's own tokens)."""

    text: str
    source: TokenSource
    origin: DraftOrigin | None = None


@dataclass(frozen=True)
class ChatEvent:
    """A :class:`RoundEvent` with the text it adds to the reply."""

    text: str
    pieces: tuple[TextPiece, ...]
    token_ids: tuple[int, ...]
    stats: ReplyStats
    finish_reason: FinishReason | None = None
    notice: str | None = None


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    content: str
