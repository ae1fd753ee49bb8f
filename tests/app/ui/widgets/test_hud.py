"""The HUD's small renderers: the acceptance sparkline on a fixed scale, the speedup and plain-speed rows."""
from __future__ import annotations

from app.ui.widgets.hud import plain_text, sparkline, speedup_text


def test_sparkline_uses_absolute_scale() -> None:
    assert str(sparkline([0.0, 1.0, 0.5], 10)) == "▁█▅"
    assert str(sparkline([1.0] * 20, 5)) == "█████"


def test_speedup_says_measuring_until_the_plain_estimate_is_sound() -> None:
    from dataclasses import replace

    from engine.events import Stats

    base = Stats(mode="ngram", tokens=10, speedup=None)  # type: ignore[call-arg]
    assert speedup_text(base) == "measuring…"
    assert speedup_text(replace(base, speedup=1.5)) == "1.50×"
    assert speedup_text(None) == "—" and plain_text(None) == "—"
