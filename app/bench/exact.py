"""What "identical to plain decoding" means on each device, for ``specchat bench``.

On the CPU with an int4 target (torch's int4 kernel and row-exact attention,
:func:`engine.model.lean.batch_invariant`) a verify pass computes every row bit for
bit as a one-token step does, so a greedy reply must equal plain decoding
token for token: any difference is a mismatch. An fp32 target's BLAS matmuls
pick their kernels by row count (one row: a matrix-vector product), so its
logits can differ in the last bits (~1e-5); there a difference is a near-tie
flip when the top-2 margin is under :data:`CPU_NEAR_TIE_LOGITS`.

On CUDA a verify pass over K+1 tokens runs other kernels than a one-token step
(bitsandbytes' ``gemm_4bit`` picks its kernel by row count; SDPA takes a masked
path over a non-empty cache), so the same logits can come out a few rounding
steps apart, and where the target's two best tokens are nearly tied the argmax
can flip. That is floating point, not the algorithm (vLLM says the same of its
own speculative decoding). So on CUDA a difference counts as a mismatch only
when, at the first differing token, the target's top-2 logit margin exceeds
:data:`NEAR_TIE_LOGITS` or either token is not among the near-top ones; the
others are reported as near-tie flips and do not fail the bench.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import torch

NEAR_TIE_LOGITS = 0.5
"""The tolerance, in logits: four bf16 rounding steps at a logit of 16-32 (the
bf16 spacing there is 0.125), which is the size of the differences two kernel
orders leave in half-precision logits. A wrong acceptance rule shows up at
ordinary positions, where the margin is several logits."""

CPU_NEAR_TIE_LOGITS = 1e-3
"""The CPU tolerance for float targets: a hundred times fp32 matmul-order noise at these logit sizes."""

Judge = Callable[[str, Sequence[int], Sequence[int], int], dict[str, Any]]
"""(prompt name, plain's tokens, the run's tokens, first differing index) -> the verdict."""


def judge_difference(
    logits: torch.Tensor, expected: int | None, got: int | None, *, tolerant: bool,
    tolerance: float = NEAR_TIE_LOGITS,
) -> dict[str, Any]:
    """Whether a differing token is a near-tie flip.

    Args:
        logits: ``[V]`` the target's logits at the first differing position
            (after the prompt and the tokens both replies share).
        expected: plain decoding's token there; got: the run's (None: that
            reply had already ended).
        tolerant: whether near ties are allowed at all (CUDA, or a CPU target
            whose matmuls are not batch-invariant); otherwise nothing is a near tie.

    Returns:
        ``near_tie`` (True: not counted as a mismatch), ``margin`` (top-1 minus
        top-2 logit) and ``gap`` (top-1 minus the lower of the two tokens' logits).
    """
    top = torch.topk(logits.float(), 2).values
    margin = float(top[0] - top[1])
    if expected is None or got is None:
        return {"near_tie": False, "margin": margin, "gap": None}
    gap = float(top[0] - torch.minimum(logits[expected], logits[got]).float())
    near = tolerant and margin <= tolerance and gap <= tolerance
    return {"near_tie": bool(near), "margin": margin, "gap": gap}


def near_tie_judge(target: Any, device: Any, prompts: Mapping[str, Sequence[int]]) -> Judge | None:
    """A :data:`Judge` that reads the target's logits at the differing position with
    one pass of its own; None where the target is batch-invariant (exact: every
    difference counts)."""
    from engine.model.lean import batch_invariant

    if not device.is_cuda and batch_invariant(target):
        return None
    tolerance = NEAR_TIE_LOGITS if device.is_cuda else CPU_NEAR_TIE_LOGITS
    from engine.decode.runner import ModelRunner

    @lru_cache(maxsize=256)
    def logits_after(prompt: str, shared: tuple[int, ...]) -> torch.Tensor:
        ids = [*prompts[prompt], *shared]
        runner = ModelRunner(target, device, window=len(ids))  # a card's static cache: this pass's tokens only
        try:
            return runner.forward(ids, logits_to_keep=1)[-1].cpu()
        finally:
            runner.release()

    def judge(prompt: str, expected: Sequence[int], got: Sequence[int], at: int) -> dict[str, Any]:
        logits = logits_after(prompt, tuple(expected[:at]))
        pick = lambda seq: int(seq[at]) if at < len(seq) else None  # noqa: E731
        return judge_difference(logits, pick(expected), pick(got), tolerant=True, tolerance=tolerance)

    judge.tolerance = tolerance  # type: ignore[attr-defined]  # stated in the JSON
    return judge


def split_by_engine(found: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(counted, transformers')`` differences: transformers' speculative methods against its own
    plain decoding are information (its forward is not batch-invariant: docs/exactness.md); every
    other difference counts, ``hf-plain`` against specchat's plain among them (an outside check of
    specchat's plain decoding)."""
    theirs = [m for m in found if str(m["method"]).startswith("hf-") and m["method"] != "hf-plain"]
    return [m for m in found if m not in theirs], theirs


def counted(found: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The differences that count as mismatches (near-tie flips left out)."""
    return [m for m in found if not m.get("near_tie")]


def flips(found: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The near-tie flips (CUDA only)."""
    return [m for m in found if m.get("near_tie")]


def exactness(tolerant: bool, tolerance: float = NEAR_TIE_LOGITS) -> str:
    """The JSON's statement of what ``identical`` was checked against on this device."""
    if not tolerant:
        return "token for token equal to plain decoding (a batch-invariant target: every difference is a mismatch)"
    return (f"equal to plain decoding up to floating-point near-ties: a difference counts only when the "
            f"target's top-2 logit margin at the first differing token exceeds {tolerance} (near_tie_flips lists the rest)")


def format_flips(found: Sequence[dict[str, Any]]) -> str:
    """The note on near-tie flips (they do not fail the bench)."""
    lines = [f"note: {len(found)} greedy output(s) differ from plain decoding at a near tie "
             f"(top-2 margin <= {NEAR_TIE_LOGITS} logits; floating point, not counted):"]
    for m in found:
        k = f" K={m['k']}" if m.get("k") is not None else ""
        lines.append(f"  {m['method']}{k} on {m['prompt']} (repeat {m['repeat']}): token {m['first_difference']}, "
                     f"margin {m['margin']:.3f}")
    return "\n".join(lines)
