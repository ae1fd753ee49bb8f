"""The formatters behind the HUD, the footers and the export: never "None", always the units people read."""
from __future__ import annotations

from app.ui.formatting import bar, fmt_bytes, fmt_speedup, plan_lines, reply_summary


def test_formatters_never_show_none() -> None:
    assert fmt_speedup(None) == "—" and fmt_speedup(2.314) == "2.31×"
    assert fmt_bytes(None) == "—" and fmt_bytes(512) == "512 B" and fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(3 * 2**30) == "3.0 GiB"
    assert bar(1.0, 4) == "████" and bar(0.0, 4) == "    " and bar(0.5, 4) == "██  "
    assert "speedup" not in reply_summary({"mode": "plain", "tokens_per_s": 10.0, "tokens": 3})
    assert reply_summary(None) == ""


def test_plan_lines_read_as_people_read_them() -> None:
    assert plan_lines({}) == []
    lines = plan_lines({"summary": "both fit", "budget_bytes": 2**30, "layers": [1, 2], "choice_note": "x"})
    assert lines == ["both fit", "budget 1.0 GiB"]
    # The engine's own plan (engine.model.memory.Plan.to_dict): no raw field names, no None.
    engine_plan = {"choice": "target+draft", "reason": "both fit", "free_bytes": 6 * 2**30, "budget_bytes": None,
                   "reserve_bytes": 2**29, "available_bytes": 5 * 2**30, "context_length": 8192,
                   "target": {"weights_bytes": 1}, "draft": None, "planned_bytes": 3 * 2**29,
                   "headroom_bytes": 7 * 2**29}
    assert plan_lines(engine_plan) == ["target + draft model", "needs 1.5 GiB of 5.0 GiB", "headroom 3.5 GiB",
                                       "context 8,192 tokens"]
