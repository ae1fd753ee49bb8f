"""The paint pacer: paints as often as the UI's CPU budget allows, within bounds."""
from __future__ import annotations

import pytest

from app.ui.pacing import PaintPacer


class Clocks:
    """A wall clock and a UI-thread CPU clock the test moves by hand."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 5.0

    def pacer(self, **kwargs: float) -> PaintPacer:
        return PaintPacer(clock=lambda: self.wall, cpu_clock=lambda: self.cpu, **kwargs)


def run(clocks: Clocks, pacer: PaintPacer, paint_cost: float, paints: int) -> list[float]:
    """Paint as soon as allowed, each paint (and what follows it) costing ``paint_cost`` CPU s."""
    intervals = []
    for _ in range(paints):
        clocks.wall += max(pacer.wait(), 0.0)
        pacer.painting()
        clocks.cpu += paint_cost
        intervals.append(pacer.interval)
    return intervals


def test_the_first_paint_of_a_reply_is_at_once() -> None:
    clocks = Clocks()
    pacer = clocks.pacer()
    pacer.start()
    assert pacer.wait() == 0.0


def test_cheap_paints_go_at_the_fastest_pace() -> None:
    clocks = Clocks()
    pacer = clocks.pacer(budget=0.15, fastest=0.1, slowest=0.5)
    assert run(clocks, pacer, 0.005, 20)[-1] == pytest.approx(0.1)
    assert pacer.wait() == pytest.approx(0.1)


def test_costly_paints_are_spaced_to_keep_the_ui_within_its_budget() -> None:
    clocks = Clocks()
    pacer = clocks.pacer(budget=0.15, fastest=0.1, slowest=0.5)
    intervals = run(clocks, pacer, 0.045, 30)
    assert intervals[-1] == pytest.approx(0.3, rel=1e-3)  # 45 ms / 0.15 of a core
    assert intervals == sorted(intervals)  # eased in, no jump from one paint


def test_the_pace_is_bounded_however_costly_a_paint() -> None:
    clocks = Clocks()
    pacer = clocks.pacer(budget=0.15, fastest=0.1, slowest=0.5)
    intervals = run(clocks, pacer, 2.0, 20)
    assert max(intervals) <= 0.5 and intervals[-1] == pytest.approx(0.5, rel=1e-3)


def test_a_new_reply_starts_fast_again() -> None:
    clocks = Clocks()
    pacer = clocks.pacer(budget=0.15, fastest=0.1, slowest=0.5)
    run(clocks, pacer, 2.0, 10)
    pacer.start()
    assert pacer.interval == 0.1 and pacer.wait() == 0.0


def test_a_pacer_made_with_the_defaults_uses_the_modules_bounds_before_its_first_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its bounds are pacing's constants as they are when it is made (a measurement may set them),
    and its interval is the fastest from the start, not only once a reply begins."""
    import app.ui.pacing as pacing

    monkeypatch.setattr(pacing, "PAINT_EVERY_S", 0.3)
    monkeypatch.setattr(pacing, "PAINT_MAX_S", 0.9)
    clocks = Clocks()
    pacer = clocks.pacer()
    assert (pacer.fastest, pacer.slowest, pacer.interval) == (0.3, 0.9, 0.3)
    intervals = run(clocks, pacer, paint_cost=1.0, paints=8)  # costly paints: the slowest bound holds
    assert all(0.3 <= i <= 0.9 for i in intervals) and intervals[-1] > 0.85
