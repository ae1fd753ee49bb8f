"""How often a streaming reply is painted: as often as the UI's CPU budget allows.

Every paint lays the whole screen out again and composes it (Textual), and on a
machine with few cores the UI's CPU is taken from the engine's. A paint's cost
depends on the terminal's size, the reply's blocks and the machine, so it is
measured, not assumed: the UI thread's CPU time from one paint to the next
(everything it did in between: the layout the paint caused, keys, timers) sets
the next interval so that painting stays near :data:`UI_BUDGET` of one core, up to
:data:`PAINT_MAX_S` between paints. Past that the slowest interval wins: a paint of a
growing reply in a 120x40 tmux pane cost 40-130 ms of the UI thread on the 2-core
machine measured, so the UI spent 14-17% of a core while it streamed
(``scripts/ui_stream_cost.py --tmux``; docs/performance.md).
"""
from __future__ import annotations

import time
from collections.abc import Callable

PAINT_EVERY_S = 0.25
"""The shortest time between two paints (at most 4 a second): a line or two of a reply at a time."""

PAINT_MAX_S = 0.5
"""The longest: however costly a paint is, a reply visibly moves twice a second. Painting less often
buys little for what it costs the eye: app ÷ headless 0.887 at 0.5 s, 0.899 at 0.75 s, 0.922 at 1 s
(``scripts/app_speed.py --interleaved 16``, pocket, plain, 120x40 tmux, 2-core Zen 4, 2026-11-28;
docs/performance.md, "Painting less often")."""

UI_BUDGET = 0.05
"""The share of one core the UI thread may use while a reply streams.

On 2 cores the engine's two threads take both, and every millisecond the UI runs
stalls one of them (the other waits at the step's end): the UI's CPU comes out of
the reply's speed almost one for one. Measured (``scripts/app_speed.py --repeats 4``,
pocket, plain, 120×40 tmux pane, 2-core Zen 4, alternating, medians of app ÷ headless
``generate``): 0.1 s fastest and 15% of a core: 0.80×; 0.25 s and 15%: 0.87×; 0.25 s and
5%: 0.99×. A paint costs 10-30 ms of the UI thread (a layout of the screen), so a reply
moves 2-4 times a second."""


PAINT_YIELD_S = 0.05
"""Before each paint the engine's child runs on one thread fewer for this long, and the paint
waits :data:`PAINT_LEAD_S` for it to switch (at its next round): on a machine where the engine's
threads take every core, the paint then has a core of its own instead of stalling both of the
engine's threads (an OpenMP step waits for the one the paint displaced). Measured with
``scripts/paint_cost.py`` (pocket, plain, 2048-token replies, 1 s windows, 120x40 tmux, 2-core
Zen 4, runs alternating, each run the median of ~35 windows): the engine's speed while the app
paints, over its speed in the windows beside it without paints, median 0.944 of fourteen runs
(0.917-0.972) without the lent core, 0.956 of thirteen (0.910-0.980) with it (this code against
the code before, alternating: 4 of 6 runs won). A small gain against the spread from run to run:
a paint costs the engine about 5% of its speed without, about 4% with (docs/performance.md). Where
the engine has fewer threads than there are cores, the child keeps them all
(:func:`engine.child.serve.threads_now`). 0: no core is asked for (``scripts/paint_cost.py --lend-s 0``).
In the aim's own measure (``scripts/app_speed.py --interleaved 20``, 2026-11-28) no lend, this lend and
a lend given back once the paint's frame is drawn all read the same (0.926, 0.928, 0.932 of headless):
what a paint costs matters there, not how it is scheduled."""

PAINT_LEAD_S = 0.01
"""How long a paint waits after asking for a core: about one of pocket's rounds here."""


class PaintPacer:
    """Decides when the next paint of a streaming reply may start.

    ``interval = cost / budget``, clamped to [``fastest``, ``slowest``], where
    ``cost`` is the UI thread's CPU seconds over the last paint-to-paint span,
    averaged with the interval before (one slow paint does not stall the stream).
    """

    def __init__(
        self,
        budget: float | None = None,
        fastest: float | None = None,
        slowest: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        # None: the module's constant as it is when the pacer is made (a measurement may set them)
        self.budget = UI_BUDGET if budget is None else budget
        self.fastest = PAINT_EVERY_S if fastest is None else fastest
        self.slowest = PAINT_MAX_S if slowest is None else slowest
        self._clock = clock
        self._cpu_clock = cpu_clock
        self.interval = self.fastest
        """Seconds from one paint's start to the next one's."""
        self._last: tuple[float, float] | None = None  # (wall, UI thread CPU) at the last paint

    def start(self) -> None:
        """A new reply: paint its first rounds at once, at the fastest pace."""
        self.interval = self.fastest
        self._last = None

    def wait(self) -> float:
        """Seconds until the next paint may start (≤ 0: now)."""
        if self._last is None:
            return 0.0
        return self._last[0] + self.interval - self._clock()

    def painting(self) -> None:
        """A paint starts now (call from the UI thread): measure the span since the last."""
        now, cpu = self._clock(), self._cpu_clock()
        if self._last is not None:
            cost = cpu - self._last[1]
            wanted = min(max(cost / self.budget, self.fastest), self.slowest)
            self.interval = min(max((self.interval + wanted) / 2, self.fastest), self.slowest)
        self._last = (now, cpu)
