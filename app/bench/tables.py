"""The bench's tables as text: the summary per method, the speedups per prompt class, the
column legend, the loud mismatch report, and the optional PNG chart.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.text_safety import inert


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _x(speedup: float | None) -> str:
    return "-" if speedup is None else f"{speedup:.2f}x"


def _split(r: dict[str, Any]) -> str:
    s = r["time_split"]
    return "/".join(_fmt(s[p] * 100 if s[p] is not None else None, ".0f") for p in ("draft", "verify", "other"))


def _label(r: dict[str, Any]) -> str:
    return r["method"] if r["k"] is None else f"{r['method']} K={r['k']}"


def format_table(results: Sequence[dict[str, Any]], prompt_class: str = "all") -> str:
    """The summary of every method over the prompts of ``prompt_class``."""
    from app.bench.llamacpp import TABLE_FOOTNOTE, same_cell  # imports torch: not at the chat app's start
    head = (f"{'method':<26}{'tok/s':>7}{'min-max':>17}{'speedup':>9}{'min-max':>12}{'self':>7}{'e2e':>6}{'acc':>6}{'τ':>6}"
            f"{'pass/tok':>9}{'d/v/o %':>11}{'pred':>6}{'meas/pred':>10}{'peak MB':>9}  same")
    lines = [head, "-" * len(head)]
    for r in (x for x in results if x["prompt_class"] == prompt_class):
        pred = r["prediction"]
        spread = f"{_fmt(r['tokens_per_s_min'], '.1f')}-{_fmt(r['tokens_per_s_max'], '.1f')}"
        sp_spread = (f"{_fmt(r.get('speedup_min'), '.2f')}-{_fmt(r.get('speedup_max'), '.2f')}"
                     if r.get("speedup_min") is not None else "-")  # a median from 0.51x-3.23x read as solid
        peak = r["peak_memory_bytes"] / 2**20 if r["peak_memory_bytes"] else None
        lines.append(
            f"{_label(r):<26}{_fmt(r['tokens_per_s'], '7.1f'):>7}{spread:>17}{_x(r['speedup']):>9}{sp_spread:>12}"
            f"{_x(r.get('engine_speedup')):>7}"
            f"{_fmt(r['speedup_e2e'], '.2f'):>6}{_fmt(r['alpha'], '.2f'):>6}{_fmt(r['tau'], '.2f'):>6}"
            f"{_fmt(r['target_passes_per_token'], '.2f'):>9}{_split(r):>11}{_fmt(pred['predicted_speedup'], '.2f'):>6}"
            f"{_fmt(pred.get('measured_over_predicted'), '.2f'):>10}{_fmt(peak, '.0f'):>9}  {same_cell(r)}"
        )
    if any(r.get("agreement") for r in results):
        lines.append(TABLE_FOOTNOTE)
    return "\n".join(lines)


TABLE_LEGEND = """\
tok/s      new tokens after each reply's first ÷ their seconds, median over repeats (min-max: the repeats')
speedup    this method's tok/s ÷ plain's in the same repeat, median over repeats (so not tok/s ÷ tok/s);
           min-max beside it: the repeats' (a wide one says the figure is not settled)
self       the engine's own estimate, the figure the app's HUD shows
e2e        speedup counting every reply's whole time, prompt reading included
acc        drafted tokens accepted ÷ drafted (README's "accepted"; α per position is in the JSON)
τ          new tokens per target pass;  pass/tok: target passes per new token (1/τ)
d/v/o %    share of the time spent drafting / in the target's passes / elsewhere
pred       the cost model's speedup (fixed K, model drafts); meas/pred: speedup ÷ pred
peak MB    the most memory one reply held: the card's allocations, or the process's peak resident
           set on a CPU (settings.peak_memory in the JSON says which)
same       output token for token the same as plain decoding (greedy); transformers' speculative rows
           against hf-plain, for information (a NO there does not fail the bench)"""
"""What each column of :func:`format_table` means, printed under the tables."""

SHORT_CELL_TOKENS = 128
"""A class's figure from one run (one prompt, one repeat) or from fewer new tokens than this
is marked: a single 32-token run printed "grounded 15.52x"."""


def _thin(r: dict[str, Any]) -> bool:
    """The figure rests on one short run (see :data:`SHORT_CELL_TOKENS`)."""
    return r.get("method") != "plain" and r["speedup"] is not None and (
        r.get("prompts", 0) * r.get("repeats", 0) <= 1 or r.get("new_tokens", 0) < SHORT_CELL_TOKENS)


def format_class_speedups(results: Sequence[dict[str, Any]]) -> str:
    """Speedup over plain per method (rows) and prompt class (columns); a figure from a single
    run or a few tokens is marked ``*`` and a footnote says why."""
    classes = list(dict.fromkeys(r["prompt_class"] for r in results))
    rows = list(dict.fromkeys(_label(r) for r in results))
    cell = {(_label(r), r["prompt_class"]): _x(r["speedup"]) + ("*" if _thin(r) else "") for r in results}
    lines = [f"{'speedup by class':<26}" + "".join(f"{c:>12}" for c in classes)]
    for row in rows:
        lines.append(f"{row:<26}" + "".join(f"{cell.get((row, c), '-'):>12}" for c in classes))
    if any(_thin(r) for r in results):
        lines.append(f"* from a single run or fewer than {SHORT_CELL_TOKENS} new tokens: too short to rely on "
                     "(more prompts or --repeats)")
    return "\n".join(lines)


def format_mismatches(found: Sequence[dict[str, Any]]) -> str:
    """The loud report of outputs that differ from plain decoding."""
    lines = [f"!!! {len(found)} greedy output(s) differ from plain decoding:"]
    for m in found:
        k = f" K={m['k']}" if m["k"] else ""
        lines.append(
            f"!!!   {m['method']}{k} on {m['prompt']} (repeat {m['repeat']}): first difference at token "
            f"{m['first_difference']}: plain {m['expected']} vs {m['got']}"
            + (f" (target's top-2 margin there {m['margin']:.3f} logits: not a near tie)" if "margin" in m else "")
        )
    return "\n".join(lines)


def format_transformers(found: Sequence[dict[str, Any]]) -> str:
    """The note on transformers' runs that part from their plain decoding (they do not fail the bench:
    transformers' forward reads a verify pass's attention in one masked call, not row by row as
    specchat's does, and an int4 target's 8-bit activations can turn its last bits into another token)."""
    lines = [f"note: {len(found)} transformers output(s) differ from its plain decoding (hf-plain): transformers' "
             "forward is not batch-invariant; information, not counted:"]
    for m in found:
        k = f" K={m['k']}" if m["k"] else ""
        lines.append(f"note:   {m['method']}{k} on {m['prompt']} (repeat {m['repeat']}): first difference at token "
                     f"{m['first_difference']}")
    return "\n".join(lines)


def write_chart(results: Sequence[dict[str, Any]], path: Path) -> str:
    """A bar chart of the speedup of every method over plain (all prompts); returns a note."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart skipped: matplotlib is not installed (pip install 'specchat[chart]')"
    rows = [r for r in results if r["prompt_class"] == "all" and r["speedup"] is not None]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(rows) + 2), 4.5))
    ax.bar([_label(r) for r in rows], [r["speedup"] for r in rows],
           yerr=[[r["speedup"] - r["speedup_min"] for r in rows], [r["speedup_max"] - r["speedup"] for r in rows]],
           color=["tab:gray" if r["method"] == "plain" else "tab:blue" if not r["method"].startswith("hf-") else "tab:orange" for r in rows])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("speedup over plain")
    ax.set_title("decode speedup, all prompts (median; whiskers: min-max over repeats)", fontsize=10)
    plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        return inert(f"the chart could not be written to {path}: {exc}")
    finally:
        plt.close(fig)
    return f"chart written to {path}"


def kernel_line(machine: dict[str, Any]) -> str | None:
    """Which CPU kernel ran and the CPU's features (None off the CPU): figures from two machines are
    not comparable without them (an AVX2-only kernel ran coder at half llama.cpp's speed on AVX-512)."""
    if machine.get("device_type", "cpu") != "cpu" or "cpu_kernel" not in machine:
        return None
    flags = " ".join(machine.get("cpu_features") or ()) or "none of those the kernel looks for"
    return f"CPU kernel {machine['cpu_kernel']}; CPU flags: {flags}"
