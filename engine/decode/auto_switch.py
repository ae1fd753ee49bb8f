"""When speculation switches itself off, and when it tries again.

Speculation that does not pay is switched off only on strong evidence: a full
window of rounds of the current reply whose speedup (tokens emitted ÷ the
plain tokens the same time would have bought, :mod:`engine.decode.pass_costs`) is below
``1 - margin`` *and* whose upper confidence bound (``z`` standard errors) is
below 1.0. A single slow stretch, or a window still holding the previous
reply's rounds, cannot do it: the window starts empty with every reply.

After a switch-off, speculation is tried again (re-probed) after
``reprobe_after`` plain rounds, counted across replies (a new reply does not
lift it: re-probing at every reply cost each reply a window of losing rounds,
and in the app a notice); each further switch-off in the session doubles the
wait, up to ``max_reprobe_after`` rounds. A switch by hand (F5) ends the
automatic state: the user's choice stands. Switched on by hand *while* an
automatic switch-off was in force, speculation is forced on: no evidence
switches it off again until the next switch by hand.

The step aside is quiet: the decoder sends no notice for it, and the views say
:data:`engine.events.NOT_PAYING` where they show why decoding is plain.
"""
from __future__ import annotations

from collections import deque

from engine.decode.pass_costs import speedup_upper_bound


class AutoSwitch:
    """The evidence window and the re-probe schedule (no knowledge of models)."""

    def __init__(
        self, window: int, reprobe_after: int = 64, max_reprobe_after: int = 1024,
        margin: float = 0.05, z: float = 2.0,
    ) -> None:
        self.window = window
        self.base_reprobe_after = reprobe_after
        self.reprobe_after = reprobe_after
        self.max_reprobe_after = max_reprobe_after
        self.margin = margin
        self.z = z
        self.off = False  # an automatic switch-off is in force
        self.forced = False  # switched on by hand over an automatic switch-off: never off on evidence
        self.plain_rounds = 0  # plain rounds since it began
        self._rounds: deque[tuple[int, float]] = deque(maxlen=max(window, 2))

    def new_reply(self) -> None:
        """A reply starts: the window empties (an automatic switch-off stays until its re-probe)."""
        self._rounds.clear()

    def reset(self, forced: bool = False) -> None:
        """Speculation switched by hand: forget the automatic state and the backoff; ``forced``:
        switched on over an automatic switch-off, so evidence no longer switches it off."""
        self._rounds.clear()
        self.off = False
        self.forced = forced
        self.reprobe_after = self.base_reprobe_after

    def observe(self, emitted: int, plain_equivalent: float | None) -> str | None:
        """One speculative round; returns the reason when the evidence says switch off."""
        if self.window <= 0 or plain_equivalent is None or self.forced:
            return None
        self._rounds.append((emitted, plain_equivalent))
        if len(self._rounds) < self.window:
            return None
        speedup, upper = speedup_upper_bound(self._rounds, self.z)
        if upper >= 1.0 or speedup > 1.0 - self.margin:
            return None
        rounds = len(self._rounds)
        self._rounds.clear()
        self.off, self.plain_rounds = True, 0
        return (
            f"speculation switched off: {speedup:.2f}× over the last {rounds} rounds "
            f"(at most {upper:.2f}× within {self.z:g} standard errors); trying again after "
            f"{self.reprobe_after} plain rounds"
        )

    def plain_round(self) -> int | None:
        """A plain round while switched off; returns the rounds waited when it is time to re-probe."""
        if not self.off:
            return None
        self.plain_rounds += 1
        if self.plain_rounds < self.reprobe_after:
            return None
        waited = self.plain_rounds
        self.off, self.plain_rounds = False, 0
        self._rounds.clear()
        self.reprobe_after = min(2 * self.reprobe_after, self.max_reprobe_after)
        return waited
