"""What a target pass costs on this machine, and the plain-decoding speed a speedup is measured against.

Every decoding round feeds the target one pass of ``n = K + 1`` tokens (the
pending token and K drafted ones; ``n = 1`` is a plain decoding step).
:class:`PassCosts` learns from every round of the session:

* **Typical cost of a pass of n tokens, t(n).** The last :data:`WINDOW` pass
  times of each size are kept; once a size has :data:`MIN_SAMPLES`, its median
  is its typical cost. Sizes ``n >= 2`` also feed a line ``t(n) = a + b n``
  (least squares through the per-size medians, each weighted by its number of
  samples; slope at least 0), which gives sizes not measured yet and is what
  K is chosen from. The line is *sound* once two sizes ``>= 2`` have
  :data:`MIN_SAMPLES` each. A median ignores a slow pass (a page fault, another
  process taking the core) however slow it was; a mean or a least-squares fit
  through raw samples does not.
* **The plain step, p.** The median wall time of whole rounds that fed one
  token (target pass plus bookkeeping), less the time such a round spent
  looking for a draft: plain decoding does not look. Such rounds are plain mode,
  n-gram rounds that found no match, and rare forced calibration rounds
  (``SpecDecoder.calibrate_every``). Counting a miss's lookup in p made plain
  decoding look slower than it is, and the speedup larger. One-token passes are never read off the
  line: on a CPU they take another kernel (matrix-vector), and SmolLM2-135M
  fp32 on one thread measured 42 ms for one token against 72 ms predicted by a
  line through 2..9 tokens. :data:`MIN_PLAIN` such rounds make p sound.
* **Forgetting.** Each size keeps its newest :data:`WINDOW` samples; a size
  not fed for :data:`STALE_PASSES` passes is forgotten, so the estimate
  follows a growing context slowly and a burst of load does not stay.

**Speedup over a stretch of rounds** (one reply, or the switch-off window).
Round ``i`` took ``w_i`` seconds of wall time, of which its target pass of
``n_i`` tokens took ``v_i``. The pass ran ``L_i = v_i / t(n_i)`` times slower
than typical: that is the machine's load at that moment, and a plain step at
that moment would have cost ``p * L_i``. The round's time would have bought
``c_i = w_i / (p * L_i)`` plain tokens, so::

    plain tok/s over the stretch = sum(c_i) / sum(w_i)
    speedup = measured tok/s / plain tok/s = tokens emitted / sum(c_i)

Load that slows every pass alike cancels out; a single slow pass cancels too
(its ``w_i`` and ``v_i`` grow together), while a slow draft counts in full,
because it is a real cost of speculating. Plain decoding measured this way
reads 1.0 up to the spread of its bookkeeping time. Each ``c_i`` is valued as
round ``i`` ends, with the estimates of that moment (p and t(n) then drawn from
the same stretch of load): valued later, with a p measured after the machine
grew quieter against a t(n) measured before, one reply read 0.69× where its
rounds said 1.29×. A round is left out while p or its t(n) is not sound yet.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

WINDOW = 32
"""Samples kept per pass size (and of one-token rounds' wall time)."""
MIN_SAMPLES = 3
"""Samples a pass size needs before its median counts."""
MIN_PLAIN = 4
"""One-token rounds needed before the plain step counts."""
STALE_PASSES = 512
"""A pass size not fed for this many passes is forgotten."""
PAIR_WITHIN = 8
"""A pass and a plain round this many passes apart or fewer were timed under the same load: their
ratio is a sample of what the pass costs in plain steps (:meth:`PassCosts.cost_ratio`)."""
PRIOR_SLOPE = 0.1
"""Before the line is sound: each extra token fed costs this fraction of the nearest measured pass."""


@dataclass
class _Size:
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    last_pass: int = 0
    median: float | None = None


SYNCED_STEP = 0
"""The size key of a one-token pass that is not a step of plain decoding as it runs (a lookup's
miss on a card, where plain decoding runs in bursts): its own typical cost, apart from t(1)."""


def size_key(n: int, plain_sample: bool = True) -> int:
    """The key a pass over ``n`` tokens is measured under (:data:`SYNCED_STEP` for a one-token
    pass that is not a sample of the plain step)."""
    return SYNCED_STEP if n == 1 and not plain_sample else n


class PassCosts:
    """Robust estimates of t(n) and of the plain step (seconds); see the module docstring."""

    def __init__(self) -> None:
        self._sizes: dict[int, _Size] = {}
        self._plain_rounds: deque[float] = deque(maxlen=WINDOW)
        self._plain: float | None = None
        self._line: tuple[float, float] | None = None  # (a, b): t(n) = a + b n for n >= 2
        self.passes = 0
        self._ratios: dict[int, deque[tuple[int, list[float]]]] = {}
        """Per size, per plain round (its number): the ratios of the passes paired with it (a pass's
        time over the plain round's), each pass paired once, with a plain round within
        :data:`PAIR_WITHIN` passes (size 1: a plain round's own pass over its own time). The newest
        :data:`WINDOW` plain rounds are kept; each gets one vote (:meth:`cost_ratio`)."""
        self._ratio_cache: dict[int, float | None] = {}
        self._unpaired: deque[tuple[int, int, float]] = deque(maxlen=PAIR_WITHIN)
        """(pass number, size, pass time) of the newest passes not paired yet: the next plain round's."""
        self._last_plain: tuple[int, float] | None = None

    def add(self, n: int, pass_s: float, round_s: float, draft_s: float = 0.0, plain_sample: bool = True) -> None:
        """One round: a target pass over ``n`` tokens took ``pass_s``, the whole round ``round_s``,
        of which ``draft_s`` went to drafting (for ``n = 1``: a lookup that found nothing).
        ``plain_sample``: for ``n = 1``, whether the round is a sample of the plain step (if
        not, its pass is measured under :data:`SYNCED_STEP`, so t(1) stays the plain step's)."""
        self.passes += 1
        key = size_key(n, plain_sample)
        size = self._sizes.setdefault(key, _Size())
        size.samples.append(pass_s)
        size.last_pass = self.passes
        size.median = statistics.median(size.samples) if len(size.samples) >= MIN_SAMPLES else None
        if n == 1 and plain_sample:  # plain decoding would not have looked for a draft
            step = round_s - draft_s
            self._plain_rounds.append(step)
            self._plain = statistics.median(self._plain_rounds) if len(self._plain_rounds) >= MIN_PLAIN else None
            if step > 0:
                self._pair(1, pass_s / step, self.passes)
                for when, size_n, took in self._unpaired:
                    if self.passes - when <= PAIR_WITHIN:
                        self._pair(size_n, took / step, self.passes)
                self._unpaired.clear()
                self._last_plain = (self.passes, step)
        elif self._last_plain is not None and self.passes - self._last_plain[0] <= PAIR_WITHIN:
            self._pair(key, pass_s / self._last_plain[1], self._last_plain[0])
        else:
            self._unpaired.append((self.passes, key, pass_s))
        for stale in [m for m, sz in self._sizes.items() if self.passes - sz.last_pass > STALE_PASSES]:
            del self._sizes[stale]
            self._ratios.pop(stale, None)
            self._ratio_cache.pop(stale, None)
        if n >= 2:
            self._line = self._fit()

    def _pair(self, key: int, ratio: float, partner: int) -> None:
        groups = self._ratios.setdefault(key, deque(maxlen=WINDOW))
        if groups and groups[-1][0] == partner:
            groups[-1][1].append(ratio)
        else:
            groups.append((partner, [ratio]))
        self._ratio_cache.pop(key, None)

    def cost_ratio(self, n: int) -> float | None:
        """t(n) ÷ p, what a pass of ``n`` tokens costs in plain steps: over the newest plain rounds
        with passes of ``n`` tokens timed close to them (load cancels in each pair), the median of
        each round's own median, so each plain round has one vote (one stalled round, however many
        passes it paired with, is one vote of many); once :data:`MIN_SAMPLES` rounds have voted.
        Before that, t(n) ÷ p from the two medians; None while neither is known."""
        if n not in self._ratio_cache:
            groups = self._ratios.get(n) or ()
            votes = [statistics.median(ratios) for _, ratios in groups]
            self._ratio_cache[n] = statistics.median(votes) if len(votes) >= MIN_SAMPLES else None
        ratio = self._ratio_cache[n]
        if ratio is not None:
            return ratio
        t = self.typical(n)
        return t / self._plain if t is not None and self._plain else None

    def _fit(self) -> tuple[float, float] | None:
        points = [(n, s.median, len(s.samples)) for n, s in self._sizes.items() if n >= 2 and s.median is not None]
        if len(points) < 2:
            return None
        w = sum(c for _, _, c in points)
        mean_n = sum(n * c for n, _, c in points) / w
        mean_t = sum(t * c for _, t, c in points) / w
        var = sum(c * (n - mean_n) ** 2 for n, _, c in points)
        slope = max(sum(c * (n - mean_n) * (t - mean_t) for n, t, c in points) / var, 0.0)
        return mean_t - slope * mean_n, slope

    @property
    def plain_step_s(self) -> float | None:
        """Median wall time of a one-token round (None until :data:`MIN_PLAIN` were seen)."""
        return self._plain

    @property
    def plain_samples(self) -> int:
        return len(self._plain_rounds)

    def plain_step_relative_se(self) -> float:
        """The plain step's standard error over its value: a median's, ``sqrt(pi / 2)`` times a
        mean's, with the spread read robustly (1.4826 times the median absolute deviation), so one
        stalled step (another process took the core for two seconds) widens it no more than it
        moves the median itself (0 while fewer than two samples or no sound step)."""
        samples = self._plain_rounds
        if self._plain is None or self._plain <= 0 or len(samples) < 2:
            return 0.0
        spread = 1.4826 * statistics.median(abs(x - self._plain) for x in samples)
        return math.sqrt(math.pi / 2) * spread / math.sqrt(len(samples)) / self._plain

    @property
    def line_sound(self) -> bool:
        return self._line is not None

    def typical(self, n: int) -> float | None:
        """t(n) for the speedup: the size's own median, else the sound line (n >= 2), else None."""
        size = self._sizes.get(n)
        if size is not None and size.median is not None:
            return size.median
        if n >= 2 and self._line is not None:
            return max(self._line[0] + self._line[1] * n, 1e-9)
        return None

    def predict(self, n: int) -> float | None:
        """t(n) for choosing K: the sound line (n >= 2); before it, the median of the
        nearest size measured so far (sizes >= 2 first), :data:`PRIOR_SLOPE` of it
        added per extra token; None before any pass."""
        if n >= 2 and self._line is not None:
            return max(self._line[0] + self._line[1] * n, 1e-9)
        measured = [m for m, s in self._sizes.items() if s.samples and m != SYNCED_STEP]
        if not measured:
            return None
        pool = [m for m in measured if m >= 2] if n >= 2 else []
        m = min(pool or measured, key=lambda size: (abs(size - n), -size))
        base = statistics.median(self._sizes[m].samples)
        return base * (1 + PRIOR_SLOPE * (n - m)) if n >= m else base / (1 + PRIOR_SLOPE * (m - n))

    def plain_equivalent(self, n: int, pass_s: float, round_s: float) -> float | None:
        """``c = round_s / (p * L)`` with ``L = pass_s / t(n)``, the round's own load: the plain
        tokens its time would have bought, ``(round_s / pass_s) * t(n) / p``, with t(n) ÷ p from
        :meth:`cost_ratio`; None while p or the ratio is not known."""
        if self._plain is None:
            return None
        if pass_s <= 0:
            return round_s / self._plain
        ratio = self.cost_ratio(n)
        return round_s / pass_s * ratio if ratio is not None else None


def speedup_upper_bound(rounds: Iterable[tuple[int, float]], z: float = 2.0) -> tuple[float, float]:
    """Speedup ``sum(e) / sum(c)`` over ``(tokens emitted, plain equivalent)`` rounds and
    its upper confidence bound, ``+ z`` standard errors of a ratio estimator
    (delta method: residuals ``e_i - S c_i``). Needs two rounds or more."""
    pairs = list(rounds)
    count = len(pairs)
    emitted = sum(e for e, _ in pairs)
    plain = sum(c for _, c in pairs)
    if count < 2 or plain <= 0:
        raise ValueError("need at least two rounds with a plain equivalent")
    ratio = emitted / plain
    spread = sum((e - ratio * c) ** 2 for e, c in pairs) / (count - 1)
    error = math.sqrt(spread / count) / (plain / count)
    return ratio, ratio + z * error
