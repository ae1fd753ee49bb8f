"""K-quant and wider GGUF blocks on the int4 kernels: Q4_K code for code, Q5_0 and Q8_0 as two
exact int4 planes, Q6_K as two exact planes in groups of 16 (6-bit codes on specchat's kernel,
tests/engine/quant/test_six_bit.py), other types requantized to 8 bits; each against gguf's own
(llama.cpp's reference) dequantization, and a mixed-type model end to end."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.model.lean import lean_forward
from engine.quant import Int4Linear, apply_int4, cpu_kernel, cpu_pack, quantize_weight
from engine.quant.gguf_blocks import GgufCarrier, carry_over, decode_8bit_rows, decode_q4_rows
from engine.quant.int4 import Int4Weights, quantize_weight8, two_planes

CPU = torch.device("cpu")
RNG = np.random.default_rng(11)


def raw_blocks(kind: str, rows: int, cols: int, d_max: float = 0.01, rng: np.random.Generator | None = None) -> np.ndarray:
    """Random but valid raw rows of a K-quant (gguf-py cannot quantize to these): random codes
    and scales, finite fp16 super-block scales up to ``d_max`` (from ``rng``, else the module's)."""
    RNG = rng if rng is not None else globals()["RNG"]
    qtype = GGMLQuantizationType[kind]
    block, size = quants.GGML_QUANT_SIZES[qtype]
    raw = RNG.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    d = RNG.uniform(d_max / 10, d_max, (rows, cols // block)).astype(np.float16).view(np.uint8).reshape(rows, -1, 2)
    if kind == "Q4_K":  # d, dmin first
        raw[..., 0:2] = d
        raw[..., 2:4] = (RNG.uniform(d_max / 10, d_max, (rows, cols // block)).astype(np.float16)
                         .view(np.uint8).reshape(rows, -1, 2))
    else:  # Q6_K: d last
        raw[..., -2:] = d
    return raw.reshape(rows, -1)


def reference(raw: np.ndarray, kind: str, shape: tuple[int, int]) -> torch.Tensor:
    return torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[kind]).reshape(shape).astype(np.float32))


def test_q4_k_codes_scales_and_mins_map_exactly() -> None:
    raw = raw_blocks("Q4_K", 32, 512)
    codes, scale, zero = decode_q4_rows(raw, "Q4_K")
    assert codes.shape == (32, 512) and scale.shape == zero.shape == (32, 16)
    assert codes.max() <= 15
    weights = Int4Weights(torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(zero), 32)
    expected = reference(raw, "Q4_K", (32, 512))
    assert torch.allclose(weights.dequantize(), expected, rtol=0, atol=1e-6 * float(expected.abs().max()))
    # The only loss left is the kernel's bf16 scale and zero: half a bf16 step of each, per weight.
    rounded = Int4Weights(weights.codes, weights.scale.bfloat16().float(), weights.zero.bfloat16().float(), 32)
    bound = (8 * weights.scale.abs() + weights.zero.abs()) * 2.0**-8 + 1e-9
    err = (rounded.dequantize() - expected).abs().view(32, 16, 32).amax(dim=-1)
    assert bool((err <= bound).all())


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_0"])
def test_q8_0_and_q5_0_become_two_exact_planes(kind: str) -> None:
    qtype = GGMLQuantizationType[kind]
    raw = quants.quantize(RNG.standard_normal((32, 128)).astype(np.float32), qtype)
    u, scale, zero_lo, zero_hi = decode_8bit_rows(raw, kind)
    weights = two_planes(*(torch.from_numpy(a) for a in (u, scale, zero_lo, zero_hi)), group_size=32)
    assert weights.planes == 2 and weights.shape == (32, 128) and weights.codes.shape == (32, 256)
    expected = reference(raw, kind, (32, 128))
    assert torch.equal(weights.dequantize(), expected)
    # Each plane's zero is d times a power of two, so bf16 rounds it no worse than d itself.
    rounded = Int4Weights(weights.codes, weights.scale.bfloat16().float(), weights.zero.bfloat16().float(), 32, 2)
    d = torch.from_numpy(scale).abs().repeat_interleave(32, dim=1)
    assert bool(((rounded.dequantize() - expected).abs() <= 256 * 2.0**-8 * d + 1e-7).all())


def test_8_bit_requantization_stays_within_half_a_step() -> None:
    raw = raw_blocks("Q6_K", 16, 256)
    w = reference(raw, "Q6_K", (16, 256))
    weights = quantize_weight8(w, 32)
    err = (weights.dequantize() - w).abs().view(16, 8, 32).amax(dim=-1)
    step = weights.scale[:, :8]
    zero_rounding = weights.zero[:, :8].abs() * 2.0**-9
    assert bool((err <= step / 2 + zero_rounding + 1e-7).all())
    q6_step = w.abs().amax() / 31  # the coarsest Q6_K step these rows can have
    assert float(err.max()) < float(q6_step) / 2


@pytest.mark.parametrize("m", [1, 3, 5])
def test_a_two_plane_layer_matches_its_weights_and_is_batch_invariant(m: int) -> None:
    gen = torch.Generator().manual_seed(m)
    w = torch.randn(48, 256, generator=gen)
    weights = quantize_weight8(w, 32)
    layer = Int4Linear(weights, torch.randn(48, generator=gen), CPU)
    assert layer.in_features == 256 and layer.planes == 2
    x = torch.randn(m, 256, generator=gen)
    y = layer(x)
    rounded = Int4Weights(weights.codes, weights.scale.bfloat16().float(), weights.zero.bfloat16().float(), 32, 2)
    ref = x.bfloat16().float() @ rounded.dequantize().T + layer.bias
    assert float((y - ref).abs().max()) <= 2e-2 * float(ref.abs().max())
    rows = torch.cat([layer(x[i : i + 1]) for i in range(m)])
    assert torch.equal(y, rows)  # a verify pass gives each row exactly a one-token step's numbers


def test_layers_of_one_or_two_planes_are_never_fused() -> None:
    two = Int4Linear(quantize_weight8(torch.randn(64, 64), 32), None, CPU)
    one = Int4Linear(quantize_weight(torch.randn(64, 64), 32), None, CPU)
    assert not Int4Linear.can_fuse([two, one]) and Int4Linear.can_fuse([two, two])


# ----------------------------------------------------------------------------- a mixed model end to end

TYPES = {"attn_q": "Q4_K", "attn_k": "Q5_0", "attn_v": "Q6_K", "attn_output": "Q8_0",
         "ffn_gate": "Q4_K", "ffn_up": "Q5_0", "ffn_down": "Q6_K"}
HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
      "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
      "ffn_down": "mlp.down_proj"}


def mixed_gguf(tmp_path: Path, seed: int = 5) -> tuple[Path, Qwen2ForCausalLM]:
    """A 2-layer Qwen2-shaped model (q/k/v biases) whose linears a GGUF stores in Q4_K, Q5_0,
    Q6_K and Q8_0, and the same model holding that GGUF's dequantized weights. Its K-quant
    blocks come from a generator of its own: drawn from the module's, they depended on which
    tests ran before in the same process (a CI run drew blocks whose error passed the bound)."""
    rng = np.random.default_rng(seed)
    config = Qwen2Config(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         max_position_embeddings=256)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    path = tmp_path / "mixed.gguf"
    writer = GGUFWriter(str(path), "qwen2")
    for i, layer in enumerate(model.model.layers):
        for gg, kind in TYPES.items():
            linear = layer.get_submodule(HF[gg])
            n, k = linear.weight.shape
            qtype = GGMLQuantizationType[kind]
            raw = (raw_blocks(kind, n, k, d_max=1e-4, rng=rng) if kind.endswith("_K")  # weights of a trained model's size
                   else quants.quantize(linear.weight.detach().numpy(), qtype))
            writer.add_tensor(f"blk.{i}.{gg}.weight", raw, raw_dtype=qtype)
            with torch.no_grad():  # the converted copy holds exactly the GGUF's weights
                linear.weight.copy_(reference(raw, kind, (n, k)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, model


def w_k(weights: Int4Weights) -> int:
    return weights.shape[1]


def test_every_type_of_a_mixed_gguf_is_carried_and_decodes_as_before(tmp_path: Path) -> None:
    path, model = mixed_gguf(tmp_path)
    carried = carry_over(path, model)
    assert len(carried) == 2 * 7
    for name, weights in carried.items():
        kind = TYPES[next(gg for gg, hf in HF.items() if name.endswith(hf))]
        assert weights.planes == (1 if kind == "Q4_K" else 2)
        assert weights.group_size == (16 if kind == "Q6_K" else 32)  # Q6_K's sub-blocks of 16, code for code
        assert (weights.headers is not None) is (kind in ("Q4_K", "Q6_K"))  # a K-quant keeps its super-blocks' scales
        if kind == "Q4_K":
            assert torch.equal(cpu_pack.header_scales(weights.headers)[0], weights.scale)
        if kind == "Q6_K":
            assert torch.equal(cpu_pack.six_header_scales(weights.headers), weights.scale[:, : w_k(weights) // 16])
        w = model.get_submodule(name).weight.detach()
        assert torch.allclose(weights.dequantize(), w, rtol=0, atol=1e-6 * float(w.abs().max()))
    only_four = carry_over(path, model, wide_planes=False)
    assert sorted(only_four) == sorted(n for n in carried if n.endswith(("q_proj", "gate_proj")))

    ids = torch.tensor([[1, 5, 9, 14, 20, 33, 2, 7]])
    with torch.no_grad():
        full = model(ids).logits
    report = apply_int4(model, location=str(tmp_path / "nowhere"), gguf=path, quantize_head=False, wide_planes=True)
    assert sorted(report.carried_over) == sorted(carried)
    with torch.no_grad():
        quantized = model(ids).logits
    assert float((quantized - full).abs().max()) <= 2e-2 * float(full.abs().max())

    # The lean forward runs the mixed layers (8-bit v and down beside 4-bit q/k and gate/up). On
    # specchat's kernel they fold their norms in as the others do, so the activations' 8-bit
    # rounding meets inputs that differ from transformers' in the last bits: a rounding step
    # may go the other way, and the attention step keeps its keys and values in fp16 (hence the
    # looser bound there).
    lean = lean_forward(model)
    assert lean is not None
    folded = cpu_kernel.matmul() is not None
    assert all(layer.folded is folded for layer in lean.layers)
    with torch.no_grad():
        mine = lean(ids, lean.new_cache(), 0, logits_to_keep=ids.shape[1])
    assert float((mine - quantized).abs().max()) <= (1e-2 if folded else 1e-4) * float(quantized.abs().max())


def test_k_quant_scales_carried_in_row_pieces_are_the_whole_tensors(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.quant import gguf_blocks

    path, model = mixed_gguf(tmp_path)
    whole = carry_over(path, model)
    monkeypatch.setattr(gguf_blocks, "CARRY_ROWS", 24)  # every layer has more rows than that
    pieces = carry_over(path, model)
    kept = [name for name, w in whole.items() if w.headers is not None]
    assert len(kept) == 8  # q, gate (Q4_K) and v, down (Q6_K) in each of two layers
    for name in kept:
        assert torch.equal(pieces[name].headers, whole[name].headers), name


def test_the_int4_cache_keeps_planes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    path, model = mixed_gguf(tmp_path)
    src = tmp_path / "src"
    model.save_pretrained(src)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    logits = []
    for _ in range(2):  # the first run writes the cache, the second reads it
        fresh = type(model).from_pretrained(src).eval()
        report = apply_int4(fresh, location=str(src), gguf=path, wide_planes=True)
        assert len(report.carried_over) == 14
        with torch.no_grad():
            logits.append(fresh(ids).logits)
    cached = list((tmp_path / "cache" / "int4").glob("*.safetensors"))
    assert len(cached) == 1 and "-g32-planes" in cached[0].name
    assert torch.equal(logits[0], logits[1])



@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_tall_tensor_is_carried_in_row_pieces_to_the_same_groups(tmp_path: Path, arch: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of rows where the row processor keeps rows in place (an output layer); whole where
    it reorders them (llama's Q and K): the same groups either way."""
    from transformers import AutoModelForCausalLM

    from engine.fetch.convert import convert_gguf
    from engine.quant import gguf_blocks
    from tests.gguf_tiny import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", arch=arch, kind="Q4_1", wide="Q8_0")
    model = AutoModelForCausalLM.from_pretrained(str(convert_gguf(gguf, tmp_path / "copy")))
    whole = carry_over(gguf, model)
    monkeypatch.setattr(gguf_blocks, "CARRY_ROWS", 24)  # every layer has more rows than that
    carrier = GgufCarrier(gguf, model)
    kept = {name: carrier._keeps_rows(f"{name}.weight", 64) for name in whole}
    assert kept["lm_head"] and kept["model.layers.0.mlp.gate_proj"]
    assert kept["model.layers.0.self_attn.q_proj"] is (arch == "qwen2")  # llama's rope permutation moves rows
    pieces = carry_over(gguf, model)
    assert sorted(pieces) == sorted(whole)
    for name, weights in whole.items():
        for field in ("codes", "scale", "zero"):
            assert torch.equal(getattr(pieces[name], field), getattr(weights, field)), (name, field)
