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
    # The engine's own plan (engine.model.plan.Plan.to_dict): no raw field names, no None.
    engine_plan = {"choice": "target+draft", "reason": "both fit", "free_bytes": 6 * 2**30, "budget_bytes": None,
                   "reserve_bytes": 2**29, "available_bytes": 5 * 2**30, "context_length": 8192,
                   "target": {"weights_bytes": 1}, "draft": None, "planned_bytes": 3 * 2**29,
                   "headroom_bytes": 7 * 2**29}
    assert plan_lines(engine_plan) == ["target + draft model", "needs 1.5 GiB of 5.0 GiB", "headroom 3.5 GiB",
                                       "context 8,192 tokens"]


def test_one_speedup_in_the_footer_and_the_export_with_its_error_or_why_not() -> None:
    from app.ui.export import stats_line

    measured = {"mode": "ngram", "proposed": 40, "tokens": 60, "tokens_per_s": 90.0, "speedup": 1.234,
                "speedup_se": 0.041}
    assert "1.23× ± 0.04 vs plain" in reply_summary(measured)
    assert "speedup 1.23× ± 0.04" in stats_line(measured)
    short = {"mode": "ngram", "proposed": 6, "tokens": 8, "tokens_per_s": 90.0, "speedup": None,
             "speedup_note": "too short to measure"}
    assert "speedup too short to measure" in reply_summary(short) and "vs plain" not in reply_summary(short)
    assert "speedup too short to measure" in stats_line(short)
    # A reply decoded plainly shows no "× vs plain", even one saved with a figure before the floor existed.
    plain = {"mode": "plain", "proposed": 0, "tokens": 60, "tokens_per_s": 90.0, "speedup": 0.98}
    assert "×" not in reply_summary(plain) and "0.98" not in stats_line(plain)


def test_a_server_reply_without_a_figure_says_unknown_not_too_short() -> None:
    from app.ui.export import stats_line

    server = {"server": "llama.cpp", "mode": "spec", "proposed": 30, "tokens": 200, "speedup": None}
    assert "speedup unknown" in stats_line(server)


def test_one_token_is_one_token_not_one_tokens() -> None:
    """The footer and generate's timing line said "1 tokens" (a tester)."""
    from app.ui.formatting import reply_summary, server_reply_summary, tokens_text

    assert tokens_text(1) == "1 token" and tokens_text(0) == "0 tokens" and tokens_text(12) == "12 tokens"
    assert reply_summary({"mode": "plain", "tokens": 1, "tokens_per_s": 3.0}).endswith(" · 1 token")
    assert server_reply_summary({"server": "vLLM", "mode": "plain", "tokens": 1}).endswith(" · 1 token")
