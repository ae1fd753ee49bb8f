"""How much each round speculates: K, the plain rounds that measure the plain step, and
the automatic switch-off.

K (tokens drafted per round) is fixed by the request, or chosen every round from
the measured costs (:class:`~engine.decode.cost_model.CostModel`). While speculating, a plain
round (K = 0) runs now and then so that the plain step is measured, never
extrapolated (:mod:`engine.decode.pass_costs`); those rounds feed the speedup on which
:class:`~engine.decode.auto_switch.AutoSwitch` decides to switch speculation off, and on.
No knowledge of models: the decoder asks, and does what the answer says.
"""
from __future__ import annotations

from engine.decode.tally import SPEEDUP_FLOOR
from engine.decode.drafters import Drafter
from engine.events import GenerationParams, Mode
from engine.decode.cost_model import REFRESH_EVERY, CostModel
from engine.decode.auto_switch import AutoSwitch


LOOKUP_K_START = 4
"""K of a lookup's first chain, before any was read (:meth:`Schedule.chain_k`)."""


class Schedule:
    """The round-by-round policy of one decoder (see :class:`~engine.decode.decoder.SpecDecoder`'s
    arguments for ``calibrate_every``, ``auto_off_window`` and ``reprobe_after``)."""

    def __init__(self, costs: CostModel, calibrate_every: int, auto_off_window: int, reprobe_after: int) -> None:
        self.costs = costs
        self.calibrate_every = calibrate_every
        self.switch = AutoSwitch(auto_off_window, reprobe_after)
        self.lookup_k = LOOKUP_K_START
        """K of a lookup's next chain of rounds (:meth:`chain_k`)."""

    def policy_k(self, drafter: Drafter | None, enabled: bool, params: GenerationParams) -> int:
        """K for a drafting round: fixed, or chosen from the measured costs.

        A drafter whose proposals are free is asked for ``k_max`` and trimmed
        once its match is known (:meth:`free_k`). Calibration rounds are decided
        by :meth:`calibrating`.
        """
        if drafter is None or not enabled:
            return 0
        if params.k is not None:
            return params.k
        if drafter.free_proposals:
            return params.k_max
        return self.costs.choose_k(params.k_min, params.k_max, explore=self.explore(), refresh=self.refresh())

    def chain_k(self, drafter: Drafter | None, k: int, params: GenerationParams) -> int:
        """K for a chain of rounds whose drafter is ``drafter``, ``k`` the policy's (:meth:`policy_k`).

        A lookup's proposals are free, but in a chain on the device each of its rounds verifies
        K + 1 tokens whatever the lookup found to fill them with: at ``k_max`` (16) a chain over
        text that repeats nothing paid a 17-token pass a token (pocket on an H200: 616 tok/s
        against plain decoding's 1,000, docs/gpu.md). So with adaptive K a lookup's chain takes
        :attr:`lookup_k`, what its last chain showed it can use (:meth:`chain_read`)."""
        if k == 0 or params.k is not None or drafter is None or not drafter.free_proposals:
            return k
        return max(1, params.k_min, min(k, self.lookup_k))

    def chain_read(self, params: GenerationParams, most_accepted: int) -> None:
        """A lookup's chain was read, its best round accepting ``most_accepted`` drafts:
        the next chain's K is twice that (room to grow where every draft was taken), 1 where
        nothing was (a 2-token pass: about a plain step's cost), within ``[k_min, k_max]``."""
        if params.k is None:
            self.lookup_k = max(1, params.k_min, min(params.k_max, 2 * most_accepted))

    def free_k(self, params: GenerationParams, proposed: int, key: object) -> int:
        """K for a free draft of ``proposed`` tokens: the match and the fitted verification
        cost are the limit, not caution."""
        return self.costs.choose_k(min(params.k_min, proposed), proposed, key, draft_step_s=0.0,
                                   explore=self.explore())

    def lookup_pays(self, params: GenerationParams, proposed: int, key: int) -> bool:
        """Whether a lookup draft of ``proposed`` tokens (match kind ``key``) should stand in for
        the draft model this round (adaptive K only)."""
        return params.k is None and self.costs.lookup_pays(params.k_min, params.k_max, proposed, key)

    def explore(self) -> bool:
        """Every third decision (a round, or a chain of rounds: :attr:`CostModel.decisions`) may try a
        K not measured yet (:meth:`CostModel.choose_k`)."""
        return self.costs.decisions % 3 == 2

    def refresh(self) -> bool:
        """Every :data:`~engine.decode.cost_model.REFRESH_EVERY` decisions, once the pass line is
        sound, try a neighbour of the best K again."""
        return self.costs.passes.line_sound and self.costs.decisions % REFRESH_EVERY == REFRESH_EVERY - 1

    def calibrating(self, mode: Mode) -> bool:
        """Whether this speculative round runs as a plain step to measure the plain step: one round
        in three until the session has the plain steps a speedup needs (``SPEEDUP_FLOOR``; with
        fewer, a 155-token reply read "too short to measure"), then every ``calibrate_every``."""
        if self.calibrate_every <= 0 or mode == "plain":
            return False
        since = self.costs.rounds_since_plain
        wanted = SPEEDUP_FLOOR["plain_samples"]
        return since >= (2 if self.costs.passes.plain_samples < wanted else self.calibrate_every)

    def verdict(self, params: GenerationParams, round_mode: Mode, emitted: int,
                plain_equivalent: float | None) -> tuple[bool, str] | None:
        """After a round: ``(on, notice)`` when speculation should switch, else None.

        Off on strong evidence that it does not pay (adaptive K only); back on for
        a re-probe after enough plain rounds of an automatic switch-off.
        """
        if self.switch.off:
            waited = self.switch.plain_round() if round_mode == "plain" else None
            if waited is None:
                return None
            return True, f"speculation back on: trying again after {waited} plain rounds"
        if params.k is not None or round_mode == "plain":
            return None
        reason = self.switch.observe(emitted, plain_equivalent)
        return None if reason is None else (False, reason)
