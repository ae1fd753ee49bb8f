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
reads 1.0 up to the spread of its bookkeeping time. The figure is *sound*
(not None) once p is sound and every size fed in the stretch has a typical
cost (its own median, or the sound line).
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

    def add(self, n: int, pass_s: float, round_s: float, draft_s: float = 0.0, plain_sample: bool = True) -> None:
        """One round: a target pass over ``n`` tokens took ``pass_s``, the whole round ``round_s``,
        of which ``draft_s`` went to drafting (for ``n = 1``: a lookup that found nothing).
        ``plain_sample``: for ``n = 1``, whether the round is a sample of the plain step (if
        not, its pass is measured under :data:`SYNCED_STEP`, so t(1) stays the plain step's)."""
        self.passes += 1
        size = self._sizes.setdefault(size_key(n, plain_sample), _Size())
        size.samples.append(pass_s)
        size.last_pass = self.passes
        size.median = statistics.median(size.samples) if len(size.samples) >= MIN_SAMPLES else None
        if n == 1 and plain_sample:  # plain decoding would not have looked for a draft
            self._plain_rounds.append(round_s - draft_s)
            self._plain = statistics.median(self._plain_rounds) if len(self._plain_rounds) >= MIN_PLAIN else None
        for stale in [m for m, s in self._sizes.items() if self.passes - s.last_pass > STALE_PASSES]:
            del self._sizes[stale]
        if n >= 2:
            self._line = self._fit()

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
        """The plain step's standard error over its value: a median's, ``sqrt(pi / 2)`` times
        a mean's (0 while fewer than two samples or no sound step)."""
        samples = self._plain_rounds
        if self._plain is None or self._plain <= 0 or len(samples) < 2:
            return 0.0
        n = len(samples)
        mean = sum(samples) / n
        stdev = math.sqrt(max(sum((x - mean) ** 2 for x in samples) / (n - 1), 0.0))  # floats: statistics' is exact, 0.1 ms
        return math.sqrt(math.pi / 2) * stdev / math.sqrt(n) / self._plain

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
        """``c = round_s / (p * L)``: the plain tokens this round's time would have bought at
        its own load ``L = pass_s / t(n)``; None while p or t(n) is not sound."""
        p, t = self._plain, self.typical(n)
        if p is None or t is None:
            return None
        load = pass_s / t if pass_s > 0 else 1.0
        return round_s / (p * load)


@dataclass
class _SizeSums:
    rounds: int = 0
    ratio: float = 0.0  # sum of w_i / v_i (rounds with a timed pass)
    untimed: float = 0.0  # sum of w_i where v_i was 0
    wall: float = 0.0  # sum of w_i
    passes: float = 0.0  # sum of v_i


@dataclass
class Stretch:
    """Rounds of one reply, summed per pass size, so the speedup can be valued with
    the newest estimates at any time: ``sum(c_i) = sum over sizes of t(n) / p *
    sum(w_i / v_i)``. A size without a typical cost yet (a short pass at the end
    of a reply) is valued at the stretch's mean load instead; at least half the
    rounds must be at sizes with a typical cost."""

    sizes: dict[int, _SizeSums] = field(default_factory=dict)

    def add(self, n: int, pass_s: float, round_s: float) -> None:
        sums = self.sizes.setdefault(n, _SizeSums())
        sums.rounds += 1
        sums.wall += round_s
        sums.passes += pass_s
        if pass_s > 0:
            sums.ratio += round_s / pass_s
        else:
            sums.untimed += round_s

    def plain_tokens(self, costs: PassCosts) -> float | None:
        """Sum of ``c_i`` over the stretch; None while not sound."""
        p = costs.plain_step_s
        if p is None:
            return None
        total, known_rounds, known_pass, known_typical, unknown_wall = 0.0, 0, 0.0, 0.0, 0.0
        for n, sums in self.sizes.items():
            t = costs.typical(n)
            if t is None:
                unknown_wall += sums.wall
                continue
            total += (t * sums.ratio + sums.untimed) / p
            known_rounds += sums.rounds
            known_pass += sums.passes
            known_typical += t * sums.rounds
        if 2 * known_rounds < sum(s.rounds for s in self.sizes.values()):
            return None
        if unknown_wall:
            load = known_pass / known_typical if known_pass > 0 else 1.0
            total += unknown_wall / (p * load)
        return total


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
