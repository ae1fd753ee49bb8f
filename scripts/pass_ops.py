"""How many torch ops one static pass dispatches, per layer and in all: the CPU's stand-in for a
card's kernels a token (issue 35: 316 kernels a token for the random pair, 1,228 for pocket on
an H200, where a captured pass replays every one of them and each costs 2-3 µs).

    .venv/bin/python scripts/pass_ops.py [--layers 30 --hidden 576 --heads 9 --kv-heads 3 --vocab 49152]
                                         [--untied] [--dtype bfloat16] [--int4] [--tokens 1]

Builds a random Llama of that shape (default: SmolLM2-135M's, pocket), in ``--dtype`` as a card
holds it, with ``--int4`` its linear layers on torch's int4 kernel (the card's path: the CPU's
``_weight_int4pack_mm_for_cpu`` stands in for ``_weight_int4pack_mm``), fills a static cache with
a 40-token prompt, and counts the aten ops of one ``LeanForward.static_pass`` of ``--tokens``
tokens under a dispatch mode: each op that is not a view is one kernel on a card (a rough
count: a few ops launch two kernels, a few copies none). Prints the ops by name and the totals.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VIEWS = {"view", "_unsafe_view", "reshape", "expand", "transpose", "t", "permute", "unsqueeze", "squeeze",
         "slice", "select", "split", "split_with_sizes", "as_strided", "alias", "detach", "unbind", "chunk",
         "narrow", "_reshape_alias", "lift_fresh", "to (no-op)"}
"""Ops that make a view (no kernel)."""


class Count(TorchDispatchMode):
    """Counts every aten op dispatched inside it, by name (overload dropped)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name == "to" and args and out is args[0]:
            name = "to (no-op)"  # already of that dtype and device: no kernel
        self.ops[name] += 1
        return out


def build(a: argparse.Namespace) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.inter or int(a.hidden * 8 / 3) // 64 * 64,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                         max_position_embeddings=2048, tie_word_embeddings=not a.untied)
    model = LlamaForCausalLM(config).eval().to(getattr(torch, a.dtype))
    if a.int4:
        os.environ["SPECCHAT_CPU_KERNEL"] = "torch"  # the card's op sequence, not specchat's CPU kernel
        from engine.quant.int4 import quantize_model

        quantize_model(model, group_size=32)
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--inter", type=int, default=1536)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--untied", action="store_true", help="an output layer of its own (the random pair's)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--int4", action="store_true")
    ap.add_argument("--tokens", type=int, default=1)
    a = ap.parse_args()

    from engine.model.capture import attention_span
    from engine.model.kv import StaticKV
    from engine.model.lean import lean_forward

    model = build(a)
    lean = lean_forward(model)
    assert lean is not None
    cache = lean.new_cache(512, static=True)
    assert isinstance(cache, StaticKV)
    with torch.inference_mode():
        lean(torch.arange(3, 43).unsqueeze(0), cache, 0, 1)
        ids = torch.arange(5, 5 + a.tokens).unsqueeze(0)
        positions = torch.arange(40, 40 + a.tokens)
        span = attention_span(40 + a.tokens, cache.window)
        lean.static_pass(ids, cache, positions, a.tokens, span)  # tables made once, outside the count
        with Count() as count:
            lean.static_pass(ids, cache, positions, a.tokens, span)
    kernels = {k: v for k, v in count.ops.items() if k not in VIEWS}
    for name, n in sorted(kernels.items(), key=lambda kv: -kv[1]):
        print(f"{n:6d}  {name}")
    total = sum(kernels.values())
    print(f"ops that launch a kernel: {total} a pass of {a.tokens} token(s), {total / a.layers:.1f} a layer "
          f"({sum(count.ops.values()) - total} views besides)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
