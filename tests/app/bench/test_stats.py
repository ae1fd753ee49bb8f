"""The bench's figures from hand-made runs: references, mismatches, per-class groups, the engine's
own speedup beside the bench's, the time split and the cost model's prediction."""
from __future__ import annotations

from typing import Any

import pytest

from app.bench.probes import ForwardLog
from app.bench.run import Run
from app.bench.stats import alpha_from_tau, mismatches, reference_outputs, run_record, summarise


def run(method: str = "plain", tokens: tuple[int, ...] = (1, 2, 3, 4), *, k: int | None = None, prompt: str = "p",
        cls: str = "chat", repeat: int = 0, total_s: float = 1.0, **kw: Any) -> Run:
    fields: dict[str, Any] = dict(prompt_tokens=5, first_s=0.1, first_tokens=1, target=ForwardLog(),
                                  draft=ForwardLog(), target_passes=len(tokens), proposed=None, accepted=None)
    return Run(method, k, prompt, cls, repeat, tokens=tokens, total_s=total_s, **{**fields, **kw})


def by(results: list[dict[str, Any]], method: str, cls: str = "all") -> dict[str, Any]:
    return next(r for r in results if r["method"] == method and r["prompt_class"] == cls)


def test_alpha_is_zero_without_a_draft_to_accept() -> None:
    assert alpha_from_tau(3.0, 0) == 0.0 and alpha_from_tau(0.5, 4) == 0.0 and alpha_from_tau(9.0, 4) == 1.0


def test_the_reference_is_plains_first_repeat_of_each_prompt() -> None:
    runs = [run(repeat=1, tokens=(9,)), run(repeat=0, tokens=(1,)), run(prompt="q", tokens=(2,)),
            run("hf-plain", tokens=(3,))]
    assert reference_outputs(runs) == {"p": (1,), "q": (2,)}
    assert reference_outputs(runs, "hf-plain") == {"p": (3,)}


def test_each_engine_is_checked_against_its_own_plain_decoding_and_llama_cpp_not_at_all() -> None:
    runs = [run(tokens=(1, 2, 3, 4, 5, 6, 7)), run("spec", (1, 2, 9, 4, 5, 6, 7, 8), k=2),
            run("hf-plain", (1, 2, 3, 5)), run("hf-assisted", (1, 2, 3, 5)), run("hf-prompt-lookup", (1, 2, 3)),
            run("llama.cpp-spec", (7, 7, 7))]
    found = mismatches(runs, reference_outputs(runs))
    assert [(m["method"], m["first_difference"]) for m in found] == [("spec", 2), ("hf-plain", 3),
                                                                       ("hf-prompt-lookup", 3)]
    spec = found[0]
    assert (spec["k"], spec["expected"], spec["got"]) == (2, [3, 4, 5, 6, 7], [9, 4, 5, 6, 7])
    assert (spec["expected_tokens"], spec["got_tokens"]) == (7, 8)
    assert mismatches([run("hf-assisted", (5,))], {"p": (1,)}) == []  # no hf-plain ran: unchecked


def test_a_judges_verdict_joins_each_difference() -> None:
    runs = [run(tokens=(1, 2)), run("ngram", (1, 3))]
    seen: list[tuple[Any, ...]] = []

    def judge(prompt: str, expected: Any, got: Any, at: int) -> dict[str, Any]:
        seen.append((prompt, tuple(expected), tuple(got), at))
        return {"near_tie": True, "margin": 0.1}

    (found,) = mismatches(runs, reference_outputs(runs), judge)
    assert seen == [("p", (1, 2), (1, 3), 1)] and found["near_tie"] is True and found["margin"] == 0.1
    result = by(summarise(runs, judge), "ngram")
    assert result["identical"] is True and result["near_tie_flips"] == 1 and result["mismatches"] == []


def test_a_group_per_class_and_one_for_all_plain_first() -> None:
    runs = [run("ngram", prompt="a", cls="chat"), run(prompt="a", cls="chat"), run(prompt="b", cls="code"),
            run("ngram", prompt="b", cls="code", tokens=(1, 2, 3, 5))]
    results = summarise(runs)
    assert [(r["method"], r["prompt_class"]) for r in results] == [
        ("ngram", "chat"), ("ngram", "code"), ("ngram", "all"), ("plain", "chat"), ("plain", "code"), ("plain", "all")]
    assert by(results, "ngram", "chat")["identical"] is True and by(results, "ngram", "code")["identical"] is False
    assert len(by(results, "ngram")["mismatches"]) == 1 and by(results, "ngram")["prompts"] == 2
    assert by(results, "plain")["k"] is None


def test_the_engines_own_speedup_is_combined_over_a_repeats_prompts() -> None:
    runs = [run(prompt="a"), run(prompt="b"),
            run("ngram", prompt="a", total_s=0.5, engine_stats={"tokens": 30, "speedup": 3.0}),
            run("ngram", prompt="b", total_s=0.5, engine_stats={"tokens": 10, "speedup": 1.0})]
    ngram = by(summarise(runs), "ngram")
    assert ngram["engine_speedup"] == pytest.approx(40 / (10 + 10))  # tokens / sum(tokens / speedup)
    assert ngram["speedup"] == pytest.approx(0.9 / 0.4)  # decode rates: the first emission left out
    assert ngram["engine_over_bench"] == pytest.approx(2.0 / 2.25)
    runs[3] = run("ngram", prompt="b", total_s=0.5, engine_stats={"tokens": 10, "speedup": None})
    assert by(summarise(runs), "ngram")["engine_speedup"] is None  # a reply without one: that repeat is left out


def test_acceptance_time_split_and_per_position() -> None:
    runs = [run(), run("spec", k=2, target_passes=2, proposed=4, accepted=3, total_s=2.0, per_position=(1.0, 0.5),
                    draft=ForwardLog(((1, 0.5),)), target=ForwardLog(((5, 0.5), (3, 0.5)))),
            run("spec", k=2, prompt="q", target_passes=2, proposed=4, accepted=1, per_position=(0.5,), total_s=2.0)]
    spec = by(summarise(runs), "spec")
    assert spec["alpha"] == pytest.approx(4 / 8) and spec["tau"] == pytest.approx(2.0)
    assert spec["drafted_per_pass"] == pytest.approx(2.0) and spec["target_passes_per_token"] == pytest.approx(0.5)
    assert spec["alpha_per_position"] == pytest.approx([0.75, 0.5])
    assert spec["alpha_source"] == "engine: accepted / proposed draft tokens"
    assert spec["time_split"] == pytest.approx({"draft": 0.125, "verify": 0.25, "other": 0.625})
    assert spec["ms_per_token"] == pytest.approx({"draft": 62.5, "verify": 125.0, "other": 312.5})
    plain = by(summarise(runs), "plain")
    assert plain["alpha"] is None and plain["alpha_source"] is None and plain["alpha_per_position"] is None


def test_the_prediction_needs_a_fixed_k_and_timed_passes() -> None:
    plain = [run(target=ForwardLog(((5, 0.1), (1, 0.01), (1, 0.01))))]
    spec = run("spec", k=2, draft=ForwardLog(((5, 0.1), (1, 0.002), (1, 0.002))),
               target=ForwardLog(((5, 0.1), (3, 0.012))))
    result = by(summarise([*plain, spec]), "spec")["prediction"]
    assert result["c"] == pytest.approx(0.2) and result["v"] == pytest.approx(1.2)
    assert result["target_step_s"] == pytest.approx(0.01) and result["predicted_speedup"] > 0
    assert by(summarise([*plain, run("ngram")]), "ngram")["prediction"] == {
        "predicted_speedup": None, "note": "defined for a fixed K with a model draft only"}
    untimed = by(summarise([run(), run("spec", k=2)]), "spec")["prediction"]
    assert untimed == {"predicted_speedup": None, "note": "not enough forward passes were timed"}


def test_a_run_record_keeps_every_raw_figure() -> None:
    record = run_record(run("spec", (4, 5, 6), k=3, proposed=6, accepted=2, peak_memory=1024,
                            target=ForwardLog(((5, 0.25), (3, 0.25))), engine_stats={"tokens": 3},
                            extra={"server_tokens_per_s": 9.0}))
    assert record["new_tokens"] == 3 and record["decode_tokens"] == 2 and record["decode_s"] == pytest.approx(0.9)
    assert record["target_forward_s"] == pytest.approx(0.5) and record["target_forward_calls"] == 2
    assert record["draft_forward_calls"] == 0 and record["token_ids"] == [4, 5, 6]
    assert record["llama_cpp"] == {"server_tokens_per_s": 9.0} and record["peak_memory_bytes"] == 1024
