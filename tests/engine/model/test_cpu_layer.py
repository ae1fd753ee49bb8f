"""A layer's kernel calls made from C in one (engine/model/cpu_layer.py) give the bits the
same calls made from Python give: logits and every layer's cache, in prefill, steps and verify-sized
passes, with q/k/v joined in one product or split in two of different kinds."""
from __future__ import annotations

import pytest
import torch

from engine.model.lean import lean_forward
from engine.quant.int4 import Int4Linear, quantize_model, quantize_weight8
from tests.engine.model.test_lean import LOCKSTEP_PASSES, _model, lockstep


@pytest.mark.parametrize("split_v", [False, True])
def test_one_call_a_layer_gives_the_python_calls_bits(split_v: bool, int4_kernel: str) -> None:
    if int4_kernel != "specchat":
        pytest.skip("the layer call runs on specchat's CPU kernels")
    model = _model("qwen2")  # q/k/v biases
    if split_v:  # an 8-bit v_proj beside int4 q and k: two products write the q/k/v columns
        for layer in model.model.layers:
            v = layer.self_attn.v_proj
            layer.self_attn.v_proj = Int4Linear(quantize_weight8(v.weight.detach()), v.bias, torch.device("cpu"))
    quantize_model(model, group_size=32)
    one, calls = lean_forward(model), lean_forward(model)
    assert one is not None and calls is not None and one.native_layers is not None
    assert [layer.n_qkv for layer in one.native_layers] == [2 if split_v else 1] * 2
    calls.native_layers = None

    def equal(got: torch.Tensor, want: torch.Tensor) -> None:
        assert torch.equal(got, want)

    caches = lockstep(one, calls, seed=7, check=equal)
    start = sum(LOCKSTEP_PASSES)
    for ours, theirs in zip(caches[0].layers, caches[1].layers, strict=True):
        assert ours.length == theirs.length == start
        assert torch.equal(ours.k[:, :, :start], theirs.k[:, :, :start])
        assert torch.equal(ours.v[:, :, :start], theirs.v[:, :, :start])
