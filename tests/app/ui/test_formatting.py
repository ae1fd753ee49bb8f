"""The formatters behind the HUD, the footers and the export: never "None", always the units people read."""
from __future__ import annotations

from app.ui.formatting import bar, fmt_bytes, fmt_speedup, plan_lines, reply_summary
from app.store.pieces import extend_pieces, merge_pieces
from app.ui.widgets.hud import sparkline


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


def test_pieces_merge_by_source() -> None:
    pieces = merge_pieces([("a", "draft"), ("b", "draft"), ("", "target"), ("c", "target")])
    assert pieces == [("ab", "draft"), ("c", "target")]
    extend_pieces(pieces, [("d", "target"), ("e", "draft")])
    assert pieces == [("ab", "draft"), ("cd", "target"), ("e", "draft")]


def test_sparkline_uses_absolute_scale() -> None:
    assert str(sparkline([0.0, 1.0, 0.5], 10)) == "▁█▅"
    assert str(sparkline([1.0] * 20, 5)) == "█████"


def test_export_stats_line_says_speculation_off_once_and_uses_times_sign() -> None:
    from app.ui.export import stats_line

    line = stats_line({"mode": "plain", "tokens": 3, "speedup": 0.05,
                       "speculation_off_reason": "speculation switched off: 0.05× over the last 32 rounds"})
    assert line.count("speculation") == 1 and "0.05×" in line and "0.05x" not in line
    assert "speculation off: switched off by you" in stats_line({"speculation_off_reason": "switched off by you"})


def test_colour_view_reads_markdown_and_keeps_each_tokens_colour() -> None:
    from app.ui.widgets.chat_view import SOURCE_STYLES, pieces_content

    pieces = [("## Plan\n", "draft"), ("Run:\n\n```sh\n", "target"), ("ls -l\n", "draft"), ("```\n", "target"),
              ("done", "draft")]
    content = pieces_content(pieces)
    assert content.plain == "Plan\nRun:\n\n  ls -l\ndone"

    def style_at(i: int) -> str:
        return next(str(s.style) for s in content.spans if s.start <= i < s.end)

    plain = content.plain
    assert style_at(plain.index("ls")) == SOURCE_STYLES["draft"]
    assert style_at(plain.index("Run")) == SOURCE_STYLES["target"]
    assert style_at(plain.index("Plan")) == SOURCE_STYLES["draft"] + " bold"
    assert SOURCE_STYLES["draft"] != SOURCE_STYLES["target"]
