"""The round-by-round policy (engine.decode.schedule): K, calibration rounds, switching off and on."""
from __future__ import annotations

from engine.decode.tally import SPEEDUP_FLOOR
from engine.decode.drafters import NgramDrafter
from engine.events import GenerationParams
from engine.decode.schedule import Schedule
from engine.decode.cost_model import CostModel


def schedule(calibrate_every: int = 8, window: int = 4, reprobe_after: int = 3) -> Schedule:
    return Schedule(CostModel(), calibrate_every, window, reprobe_after)


def test_k_is_fixed_by_the_request_zero_without_a_drafter_and_k_max_for_free_drafts() -> None:
    s = schedule()
    assert s.policy_k(None, True, GenerationParams(k=3)) == 0
    assert s.policy_k(NgramDrafter(), False, GenerationParams(k=3)) == 0
    assert s.policy_k(NgramDrafter(), True, GenerationParams(k=3)) == 3
    assert s.policy_k(NgramDrafter(), True, GenerationParams(k_max=12)) == 12


def test_plain_rounds_come_every_third_round_until_measured_then_after_calibrate_every() -> None:
    s = schedule(calibrate_every=5)
    assert s.calibrating("ngram")  # nothing measured yet
    assert not s.calibrating("plain")  # plain rounds measure themselves
    seen = []
    wanted = SPEEDUP_FLOOR["plain_samples"]  # as many as a speedup needs: with 4, a 155-token reply was "too short"
    for _ in range(3 * wanted + 12):
        plain = s.calibrating("ngram")
        seen.append(int(plain))
        s.costs.observe(0 if plain else 2, 1, 0.001, 0.01, 0.0001)
    assert seen[:3 * wanted] == [1, 0, 0] * wanted  # until the floor's plain steps were measured
    assert seen[3 * wanted:] == [0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0]  # then 5 speculative rounds between
    assert not schedule(calibrate_every=0).calibrating("ngram")


def test_a_window_of_slow_rounds_switches_off_and_plain_rounds_switch_back_on() -> None:
    s = schedule(window=4, reprobe_after=3)
    params = GenerationParams()
    verdicts = [s.verdict(params, "ngram", 1, 2.0) for _ in range(4)]  # 1 token where plain makes 2
    assert verdicts[:3] == [None] * 3 and verdicts[3] is not None and verdicts[3][0] is False
    assert s.verdict(params, "plain", 1, None) is None
    assert s.verdict(params, "plain", 1, None) is None
    on, notice = s.verdict(params, "plain", 1, None)  # type: ignore[misc]
    assert on is True and "after 3 plain rounds" in notice


def test_a_fixed_k_never_switches_itself_off() -> None:
    s = schedule(window=2)
    assert all(s.verdict(GenerationParams(k=4), "ngram", 1, 5.0) is None for _ in range(10))
