"""``specchat bench``'s figures: per-method summaries, the cost model's prediction, the output check.

Everything here works on :class:`app.bench.Run` records and returns plain
JSON-ready data. Speeds are aggregated per repeat (tokens over seconds across a
class's prompts) and then the median over repeats is taken; speedups are the
median of per-repeat ratios to ``plain`` in the same repeat, so slow drift of
the machine cancels out.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.bench.run import Run, first_difference
from app.bench.exact import Judge, counted, flips
from app.bench.llamacpp import llama_figures
from app.bench.methods import LLAMA_METHODS

from engine.decode.cost_model import expected_tokens

ALL_CLASSES = "all"


def alpha_from_tau(tau: float, k: int) -> float:
    """Per-token acceptance α that gives ``tau`` = (1 - α^(K+1)) / (1 - α) tokens per round at K.

    The right side rises monotonically from 1 (α = 0) to K + 1 (α = 1); solved by bisection.
    """
    if k <= 0 or tau <= 1.0:
        return 0.0
    if tau >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _expected_tokens(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _expected_tokens(alpha: float, k: int) -> float:
    """With one α at every position: the engine's own formula (:func:`engine.decode.cost_model.expected_tokens`)."""
    return expected_tokens([alpha] * k, k)


def predicted_speedup(alpha: float, k: int, c: float, v: float) -> float:
    """(1 - α^(K+1)) / ((1 - α)(K·c + v)): ``c`` a draft step and ``v`` a verify pass, both in target steps."""
    return _expected_tokens(alpha, k) / (k * c + v)


def reference_outputs(runs: Sequence[Run], method: str = "plain") -> dict[str, tuple[int, ...]]:
    """Plain decoding's output per prompt (its first measured repeat); ``method``
    names whose plain decoding (``hf-plain``: transformers')."""
    refs: dict[str, tuple[int, ...]] = {}
    for run in sorted((r for r in runs if r.method == method), key=lambda r: r.repeat):
        refs.setdefault(run.prompt, run.tokens)
    return refs


def mismatches(runs: Sequence[Run], refs: dict[str, tuple[int, ...]], judge: Judge | None = None) -> list[dict[str, Any]]:
    """Every run whose output differs from plain's on the same prompt, with the first differing position.

    With a ``judge`` (CUDA: :func:`app.bench.exact.near_tie_judge`) each carries its
    verdict: ``near_tie`` differences are floating-point flips, not mismatches.

    transformers' speculative runs are checked against transformers' own plain
    decoding (``hf-plain``; unchecked when it did not run): its forward pass is
    not specchat's lean one, so the two engines' greedy texts may part at a near
    tie, and ``hf-plain`` against ``plain`` shows whether they did. llama.cpp's
    runs are not checked: its numerics differ (see :func:`app.bench.llamacpp.agreement`)."""
    found = []
    hf_refs = reference_outputs(runs, "hf-plain")
    for run in runs:
        if run.method in LLAMA_METHODS:
            continue
        speculative_hf = run.method.startswith("hf-") and run.method != "hf-plain"
        expected = (hf_refs if speculative_hf else refs).get(run.prompt)
        at = first_difference(expected, run.tokens) if expected is not None else None
        if at is not None and expected is not None:
            found.append({
                "method": run.method, "k": run.k, "prompt": run.prompt, "prompt_class": run.prompt_class,
                "repeat": run.repeat, "first_difference": at,
                "expected": list(expected[at : at + 5]), "got": list(run.tokens[at : at + 5]),
                "expected_tokens": len(expected), "got_tokens": len(run.tokens),
                **(judge(run.prompt, expected, run.tokens, at) if judge is not None else {}),
            })
    return found


@dataclass(frozen=True)
class _Group:
    """The runs of one method (and K) on one class of prompts."""

    method: str
    k: int | None
    prompt_class: str
    runs: tuple[Run, ...]

    def by_repeat(self) -> dict[int, list[Run]]:
        out: dict[int, list[Run]] = {}
        for run in self.runs:
            out.setdefault(run.repeat, []).append(run)
        return out


def _rate(runs: Sequence[Run], decode: bool) -> float | None:
    tokens = sum(r.decode_tokens if decode else len(r.tokens) for r in runs)
    seconds = sum(r.decode_s if decode else r.total_s for r in runs)
    return tokens / seconds if seconds > 0 and tokens > 0 else None


def _per_repeat(group: _Group, decode: bool) -> dict[int, float]:
    rates = {rep: _rate(rs, decode) for rep, rs in group.by_repeat().items()}
    return {rep: rate for rep, rate in rates.items() if rate is not None}


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _speedups(group: _Group, plain: _Group | None, decode: bool) -> list[float]:
    if plain is None:
        return []
    mine, ref = _per_repeat(group, decode), _per_repeat(plain, decode)
    return [mine[r] / ref[r] for r in sorted(mine) if r in ref and ref[r] > 0]


def _engine_speedups(group: _Group) -> list[float]:
    """The engine's own speedup per repeat (its ``ReplyStats.speedup``, combined over the class's
    prompts as tokens / sum(tokens / speedup)); a repeat where any reply had none is left out."""
    out = []
    for _, runs in sorted(group.by_repeat().items()):
        figures = [(r.engine_stats.get("tokens") or 0, r.engine_stats.get("speedup")) for r in runs if r.engine_stats]
        if len(figures) != len(runs) or any(not s for _, s in figures):
            continue
        tokens = sum(t for t, _ in figures)
        plain = sum(t / s for t, s in figures)
        if tokens and plain > 0:
            out.append(tokens / plain)
    return out


def _mean_call(calls: Sequence[tuple[int, float]]) -> float | None:
    return sum(s for _, s in calls) / len(calls) if calls else None


def _decode_calls(runs: Sequence[Run], model: str) -> list[tuple[int, float]]:
    return [c for r in runs for c in (r.target if model == "target" else r.draft).decode_calls]


def _acceptance(runs: Sequence[Run]) -> dict[str, Any]:
    tokens = sum(len(r.tokens) for r in runs)
    passes = sum(r.target_passes for r in runs)
    proposed = [r.proposed for r in runs if r.proposed is not None]
    accepted = [r.accepted for r in runs if r.accepted is not None]
    has_alpha = bool(proposed) and sum(proposed) > 0
    return {
        "alpha": sum(accepted) / sum(proposed) if has_alpha else None,
        "tau": tokens / passes if passes else None,
        "target_passes_per_token": passes / tokens if tokens else None,
        "drafted_per_pass": sum(proposed) / passes if proposed and passes else None,
    }


def _time_split(runs: Sequence[Run]) -> dict[str, Any]:
    total = sum(r.total_s for r in runs)
    tokens = sum(len(r.tokens) for r in runs)
    draft = sum(r.draft.seconds for r in runs)
    verify = sum(r.target.seconds for r in runs)
    parts = {"draft": draft, "verify": verify, "other": max(total - draft - verify, 0.0)}
    return {
        "time_split": {k: v / total if total else None for k, v in parts.items()},
        "ms_per_token": {k: 1000 * v / tokens if tokens else None for k, v in parts.items()},
    }


def _per_position(runs: Sequence[Run]) -> list[float] | None:
    """Per-position acceptance (specchat only), averaged over runs weighted equally."""
    rows = [r.per_position for r in runs if r.per_position]
    if not rows:
        return None
    depth = max(len(row) for row in rows)
    return [statistics.fmean(row[i] for row in rows if len(row) > i) for i in range(depth)]


def prediction(group: _Group, plain: _Group | None, measured: float | None, tau: float | None) -> dict[str, Any]:
    """The cost model's speedup beside the measured one (fixed K with a model draft only).

    α per token is inverted from the measured τ at this K; a target step is the
    mean decode pass of ``plain`` on the same prompts; ``c`` is the mean draft
    forward pass and ``v`` this method's mean verify pass, both in target steps.
    """
    if group.method not in ("spec", "hf-assisted-constant") or not group.k or plain is None or tau is None:
        return {"predicted_speedup": None, "note": "defined for a fixed K with a model draft only"}
    step = _mean_call(_decode_calls(plain.runs, "target"))
    draft = _mean_call(_decode_calls(group.runs, "draft"))
    verify = _mean_call(_decode_calls(group.runs, "target"))
    if not step or draft is None or verify is None:
        return {"predicted_speedup": None, "note": "not enough forward passes were timed"}
    alpha = alpha_from_tau(tau, group.k)
    c, v = draft / step, verify / step
    predicted = predicted_speedup(alpha, group.k, c, v)
    return {
        "alpha_per_token": alpha,
        "alpha_per_token_source": "inverted from the measured tau: tau = (1 - a^(K+1)) / (1 - a)",
        "c": c, "v": v, "target_step_s": step,
        "predicted_speedup": predicted,
        "measured_over_predicted": measured / predicted if measured is not None and predicted else None,
    }


def summarise_group(group: _Group, plain: _Group | None, bad: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every figure for one method (and K) on one class of prompts."""
    rates = list(_per_repeat(group, decode=True).values())
    e2e = list(_per_repeat(group, decode=False).values())
    speedups = _speedups(group, plain, decode=True)
    speedup = _median(speedups)
    acceptance = _acceptance(group.runs)
    peaks = [r.peak_memory for r in group.runs if r.peak_memory is not None]
    return {
        "method": group.method,
        "k": group.k if group.method != "plain" else None,
        "prompt_class": group.prompt_class,
        "prompts": len({r.prompt for r in group.runs}),
        "repeats": len(group.by_repeat()),
        "new_tokens": sum(len(r.tokens) for r in group.runs),
        "tokens_per_s": _median(rates),
        "tokens_per_s_min": min(rates) if rates else None,
        "tokens_per_s_max": max(rates) if rates else None,
        "tokens_per_s_e2e": _median(e2e),
        "ttft_s": _median([r.first_s for r in group.runs]),
        "speedup": speedup,
        "speedup_min": min(speedups) if speedups else None,
        "speedup_max": max(speedups) if speedups else None,
        "speedup_e2e": _median(_speedups(group, plain, decode=False)),
        "engine_speedup": (engine := _median(_engine_speedups(group))),
        "engine_over_bench": engine / speedup if engine is not None and speedup else None,
        **acceptance,
        "alpha_source": _alpha_source(group.method) if acceptance["alpha"] is not None else None,
        "alpha_per_position": _per_position(group.runs),
        **_time_split(group.runs),
        "peak_memory_bytes": max(peaks) if peaks else None,
        "identical": not counted(bad),
        "mismatches": counted(bad),
        "near_tie_flips": len(flips(bad)),
        "prediction": prediction(group, plain, speedup, acceptance["tau"]),
    }


def _alpha_source(method: str) -> str:
    if method.startswith("hf-"):
        return "(new tokens - target passes) / draft forward passes, counted by hooks"
    return "engine: accepted / proposed draft tokens"


def _groups(runs: Sequence[Run]) -> list[_Group]:
    keys = list(dict.fromkeys((r.method, r.k) for r in runs))
    classes = list(dict.fromkeys(r.prompt_class for r in runs))
    groups = []
    for method, k in keys:
        mine = [r for r in runs if (r.method, r.k) == (method, k)]
        for cls in [*classes, ALL_CLASSES]:
            chosen = tuple(r for r in mine if cls == ALL_CLASSES or r.prompt_class == cls)
            if chosen:
                groups.append(_Group(method, k, cls, chosen))
    return groups


def summarise(runs: Sequence[Run], judge: Judge | None = None) -> list[dict[str, Any]]:
    """One result per method (and K) and prompt class, plus class ``all``; plain first."""
    refs = reference_outputs(runs)
    bad = mismatches(runs, refs, judge)
    groups = _groups(runs)
    plain = {g.prompt_class: g for g in groups if g.method == "plain"}
    results = []
    for group in groups:
        mine = [m for m in bad if (m["method"], m["k"]) == (group.method, group.k)
                and (group.prompt_class == ALL_CLASSES or m["prompt_class"] == group.prompt_class)]
        results.append(summarise_group(group, plain.get(group.prompt_class), mine))
        if group.method in LLAMA_METHODS:
            results[-1].update(llama_figures(group.runs, refs))
    return results


def run_record(run: Run) -> dict[str, Any]:
    """One reply's raw figures for the JSON's ``runs``."""
    return {
        "method": run.method, "k": run.k, "prompt": run.prompt, "prompt_class": run.prompt_class,
        "repeat": run.repeat, "prompt_tokens": run.prompt_tokens, "new_tokens": len(run.tokens),
        "total_s": run.total_s, "first_s": run.first_s, "first_tokens": run.first_tokens,
        "decode_tokens": run.decode_tokens, "decode_s": run.decode_s,
        "target_passes": run.target_passes, "target_forward_s": run.target.seconds,
        "target_forward_calls": len(run.target.calls), "draft_forward_s": run.draft.seconds,
        "draft_forward_calls": len(run.draft.calls), "proposed": run.proposed, "accepted": run.accepted,
        "peak_memory_bytes": run.peak_memory, "token_ids": list(run.tokens), "engine_stats": run.engine_stats,
        "llama_cpp": run.extra,
    }
