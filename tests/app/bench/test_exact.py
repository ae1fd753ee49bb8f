"""The bench's identical-output check per device: exact on the CPU, up to near-ties on CUDA."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from app.bench.run import Run
from app.bench.exact import CPU_NEAR_TIE_LOGITS, NEAR_TIE_LOGITS, counted, flips, judge_difference, near_tie_judge
from app.bench.probes import ForwardLog
from app.bench.stats import mismatches, reference_outputs, summarise
from engine.model.device import Device
from engine.quant.int4 import quantize_model
from engine.decode.runner import ModelRunner
from tests.tiny import tiny_llama


def logits(values: dict[int, float], vocab: int = 10) -> torch.Tensor:
    out = torch.full((vocab,), -5.0)
    for token, value in values.items():
        out[token] = value
    return out


def test_a_near_tie_flip_on_cuda_is_not_a_mismatch() -> None:
    tied = logits({4: 20.0, 7: 19.8})  # margin 0.2 <= 0.5
    verdict = judge_difference(tied, expected=4, got=7, tolerant=True)
    assert verdict["near_tie"] is True
    assert verdict["margin"] == pytest.approx(0.2, abs=1e-5) and verdict["gap"] == pytest.approx(0.2, abs=1e-5)
    # Either order: the run may have taken the (slightly) higher one.
    assert judge_difference(tied, expected=7, got=4, tolerant=True)["near_tie"] is True


def test_the_cpu_stays_exact() -> None:
    tied = logits({4: 20.0, 7: 19.99})
    assert judge_difference(tied, expected=4, got=7, tolerant=False)["near_tie"] is False


@pytest.mark.parametrize(
    ("values", "expected", "got", "near"),
    [
        ({4: 20.0, 7: 19.0}, 4, 7, False),           # margin 1.0 > 0.5: a real mismatch
        ({4: 20.0, 7: 19.9, 2: 15.0}, 4, 2, False),  # the top two are tied, but the run took a far-off token
        ({4: 20.0, 7: 19.9, 2: 19.8}, 7, 2, True),   # three within 0.2: a flip among them is floating point
        ({4: 20.0, 7: 19.5}, 4, 7, True),            # exactly at the tolerance: still a tie
    ],
)
def test_what_counts_on_cuda(values: dict[int, float], expected: int, got: int, near: bool) -> None:
    assert judge_difference(logits(values), expected, got, tolerant=True)["near_tie"] is near


def test_the_tolerance_is_stated_and_adjustable() -> None:
    verdict = judge_difference(logits({4: 20.0, 7: 19.0}), 4, 7, tolerant=True, tolerance=1.0)
    assert verdict["near_tie"] is True and NEAR_TIE_LOGITS == 0.5


def test_a_reply_that_ended_early_is_a_mismatch() -> None:
    assert judge_difference(logits({4: 20.0, 7: 19.9}), 4, None, tolerant=True)["near_tie"] is False


def run(method: str, tokens: tuple[int, ...], prompt: str = "p") -> Run:
    return Run(method=method, k=2 if method == "spec" else None, prompt=prompt, prompt_class="chat", repeat=0,
               prompt_tokens=5, tokens=tokens, total_s=1.0, first_s=0.1, first_tokens=1, target=ForwardLog(),
               draft=ForwardLog(), target_passes=len(tokens), proposed=None, accepted=None)


def test_the_judge_reads_the_targets_logits_after_the_shared_prefix() -> None:
    """On a (stand-in) CUDA device the judge runs the target over prompt + shared tokens."""
    target = tiny_llama(seed=4, sharpness=0.05)  # soft logits: near ties are common
    prompt = (3, 5, 7, 11)
    cuda_like = SimpleNamespace(is_cuda=True, torch_device=torch.device("cpu"), attention_kernels=contextlib.nullcontext,
                                uses_static_cache=lambda: False)  # a card's static cache: tests/engine/model/test_static_kv.py
    judge = near_tie_judge(target, cuda_like, {"p": prompt})
    assert judge is not None
    reference = ModelRunner(target, Device(torch.device("cpu"))).forward([*prompt, 20, 21], logits_to_keep=1)[-1]
    top2 = torch.topk(reference, 2).indices.tolist()
    plain = (20, 21, top2[0], 23)
    flipped = (20, 21, top2[1], 9)
    verdict = judge("p", plain, flipped, 2)
    expected = judge_difference(reference, top2[0], top2[1], tolerant=True)
    assert verdict["margin"] == pytest.approx(expected["margin"], abs=1e-4)
    assert verdict["near_tie"] is expected["near_tie"]
    # CPU: a float target's BLAS matmuls pick kernels by row count, so near ties are judged
    # (with the CPU tolerance); an int4 target is batch-invariant, so every difference counts.
    cpu_judge = near_tie_judge(target, Device(torch.device("cpu")), {"p": prompt})
    assert cpu_judge is not None and cpu_judge.tolerance == CPU_NEAR_TIE_LOGITS  # type: ignore[attr-defined]
    quantize_model(target, group_size=32)
    assert near_tie_judge(target, Device(torch.device("cpu")), {"p": prompt}) is None


def test_mismatches_and_summaries_leave_near_tie_flips_out() -> None:
    runs = [run("plain", (1, 2, 3, 4)), run("spec", (1, 2, 9, 9)), run("ngram", (1, 5, 5, 5))]

    def judge(prompt: str, expected: tuple[int, ...], got: tuple[int, ...], at: int) -> dict[str, object]:
        return {"near_tie": at == 2, "margin": 0.1 if at == 2 else 3.0, "gap": 0.1}

    found = mismatches(runs, reference_outputs(runs), judge)
    assert [(m["method"], m["first_difference"], m["near_tie"]) for m in found] == [("spec", 2, True), ("ngram", 1, False)]
    assert [m["method"] for m in counted(found)] == ["ngram"] and [m["method"] for m in flips(found)] == ["spec"]
    results = {r["method"]: r for r in summarise(runs, judge) if r["prompt_class"] == "all"}
    assert results["spec"]["identical"] is True and results["spec"]["near_tie_flips"] == 1
    assert results["ngram"]["identical"] is False and results["ngram"]["near_tie_flips"] == 0
    # Without a judge (the CPU), every difference counts.
    exact = {r["method"]: r for r in summarise(runs) if r["prompt_class"] == "all"}
    assert exact["spec"]["identical"] is False and exact["spec"]["near_tie_flips"] == 0
