"""int4 through torch's kernels: the layer, the shape rules, GGUF blocks carried
over code for code, the memory figures, and lossless decoding with int4 models."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, quants
from transformers import LlamaConfig, LlamaForCausalLM

from engine.decode.decoder import SpecDecoder
from engine.model.device import Device
from engine.decode.drafters import ModelDrafter
from engine.errors import QuantizationError
from engine.events import GenerationParams
from engine.model.memory import estimate_weights_bytes
from engine.quant import Int4Linear, apply_int4, quantize_weight
from engine.quant.gguf_blocks import bf16_rounding_error, carry_over, decode_q4_rows
from engine.quant.int4 import Int4Weights, quantize_model
from tests.tiny import tiny_llama

CPU = torch.device("cpu")
# torch's kernel rounds activations, scales and zeros to bf16 (8 bits of mantissa),
# specchat's rounds activations to 8 bits per group of 32,
# and accumulates in fp32: against the fp32 product of the same codes, an
# output is off by at most a few bf16 steps of the output's scale.
REL_TOL = 2e-2


def _reference(weights: Int4Weights, x: torch.Tensor) -> torch.Tensor:
    """x @ W.T in fp32 with W rebuilt from bf16-rounded scales and zeros, x rounded to bf16."""
    rounded = Int4Weights(weights.codes, weights.scale.bfloat16().float(), weights.zero.bfloat16().float(),
                          weights.group_size)
    return x.bfloat16().float() @ rounded.dequantize().T


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("n, k, m", [(48, 256, 1), (64, 384, 5), (16, 128, 3)])
def test_int4_linear_matches_dequantized_reference(group_size: int, n: int, k: int, m: int, int4_kernel: str) -> None:
    gen = torch.Generator().manual_seed(n * k + group_size)
    w = torch.randn(n, k, generator=gen)
    weights = quantize_weight(w, group_size)
    layer = Int4Linear(weights, None, CPU)
    x = torch.randn(m, k, generator=gen)
    y = layer(x)
    ref = _reference(weights, x)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert float((y - ref).abs().max()) <= REL_TOL * float(ref.abs().max())
    # Round to nearest: every weight is within half a step of its group (plus bf16 rounding of the zero).
    step = weights.scale.repeat_interleave(group_size, dim=1)
    zero_err = (weights.zero - weights.zero.bfloat16().float()).abs().max()
    assert bool(((weights.dequantize() - w).abs() <= step / 2 + 1e-6 + zero_err).all())


def test_int4_linear_keeps_batch_dims_and_bias() -> None:
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(32, 64, generator=gen), torch.randn(32, generator=gen)
    layer = Int4Linear(quantize_weight(w, 32), b, CPU)
    x = torch.randn(2, 3, 64, generator=gen)
    ref = _reference(quantize_weight(w, 32), x.reshape(-1, 64)).reshape(2, 3, 32) + b
    y = layer(x)
    assert y.shape == (2, 3, 32)
    assert float((y - ref).abs().max()) <= REL_TOL * float(ref.abs().max())


@pytest.mark.parametrize("n, k, group_size, why", [
    (40, 128, 32, "multiple of 16"),     # the CPU kernel packs outputs in 16s
    (48, 100, 32, "not a multiple"),     # groups must tile the input features
    (48, 64, 128, "not a multiple"),
    (48, 96, 48, "not supported"),
])
def test_shapes_the_kernel_refuses_are_clear_errors(n: int, k: int, group_size: int, why: str) -> None:
    weights = Int4Weights(torch.zeros(n, k, dtype=torch.uint8), torch.ones(n, max(k // group_size, 1)),
                          torch.zeros(n, max(k // group_size, 1)), group_size)
    with pytest.raises(QuantizationError, match=why):
        Int4Linear(weights, None, CPU)


def test_quantize_model_keeps_layers_it_cannot_pack() -> None:
    model = tiny_llama(seed=1, vocab_size=90)  # 90 outputs: the CPU kernel refuses the head
    report = quantize_model(model, group_size=32)
    assert "lm_head" in report.kept and "multiple of 16" in report.kept["lm_head"]
    assert isinstance(model.model.layers[0].mlp.down_proj, Int4Linear)
    assert isinstance(model.lm_head, torch.nn.Linear)


# ----------------------------------------------------------------------------- GGUF blocks

def _nibbles(raw: np.ndarray, head: int) -> np.ndarray:
    """The codes of raw Q4 rows, read byte by byte (independent of decode_q4_rows)."""
    n = raw.shape[0]
    out = np.zeros((n, raw.shape[1] // (head + 16) * 32), dtype=np.uint8)
    for r in range(n):
        for b in range(raw.shape[1] // (head + 16)):
            qs = raw[r, b * (head + 16) + head : (b + 1) * (head + 16)]
            for j in range(16):
                out[r, b * 32 + j] = qs[j] & 0x0F
                out[r, b * 32 + j + 16] = qs[j] >> 4
    return out


@pytest.mark.parametrize("kind, head", [("Q4_0", 2), ("Q4_1", 4)])
def test_q4_blocks_keep_codes_and_match_gguf_dequantization(tmp_path: Path, kind: str, head: int) -> None:
    qtype = GGMLQuantizationType[kind]
    w = np.random.default_rng(7).standard_normal((48, 128)).astype(np.float32)
    path = tmp_path / "t.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("t.weight", quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = GGUFReader(str(path)).tensors[0]
    raw = np.asarray(tensor.data)
    codes, scale, zero = decode_q4_rows(raw, kind)
    assert np.array_equal(codes, _nibbles(raw, head))  # every 4-bit code, bit for bit
    weights = Int4Weights(torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(zero), 32)
    expected = torch.from_numpy(quants.dequantize(raw, qtype).reshape(48, 128))
    assert torch.allclose(weights.dequantize(), expected, rtol=0, atol=1e-6 * float(expected.abs().max()))
    # What the kernel keeps: scale and zero rounded to bf16, nothing else changed.
    max_abs, max_rel = bf16_rounding_error(weights)
    bf16 = Int4Weights(weights.codes, weights.scale.bfloat16().float(), weights.zero.bfloat16().float(), 32).dequantize()
    assert float((bf16 - expected).abs().max()) == pytest.approx(max_abs, rel=1e-6)
    assert max_rel <= 2.0**-8 * 2  # one bf16 rounding of the scale (over 8 codes) and one of the zero, per range


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert script: Q and K rows reordered for its rope layout."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tiny_llama_gguf(tmp_path: Path, kind: str) -> tuple[Path, LlamaForCausalLM]:
    """A 2-layer Llama written to a GGUF as llama.cpp would (Q4 linears, permuted Q/K), and
    the same model holding the GGUF's dequantized weights, as the converted copy would."""
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = LlamaForCausalLM(config).eval()
    qtype = GGMLQuantizationType[kind]
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    path = tmp_path / f"tiny-{kind}.gguf"
    writer = GGUFWriter(str(path), "llama")
    for i, layer in enumerate(model.model.layers):
        for hf, gg in names.items():
            linear = layer.get_submodule(hf)
            w = linear.weight.detach().numpy().astype(np.float32)
            heads = {"attn_q": 4, "attn_k": 2}.get(gg)
            stored = _permute(w, heads) if heads else w
            raw = quants.quantize(stored, qtype)
            writer.add_tensor(f"blk.{i}.{gg}.weight", raw, raw_dtype=qtype)
            back = quants.dequantize(raw, qtype).reshape(stored.shape)
            if heads:  # undo the permutation, as transformers' GGUF loader does
                back = back.reshape(heads, back.shape[0] // heads // 2, 2, -1).swapaxes(2, 1).reshape(w.shape)
            with torch.no_grad():
                linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(back)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, model


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_carry_over_maps_every_block_of_a_llama_gguf(tmp_path: Path, kind: str) -> None:
    path, model = _tiny_llama_gguf(tmp_path, kind)
    ids = torch.tensor([[1, 5, 9, 14, 20, 33, 2, 7]])
    with torch.no_grad():
        full = model(ids).logits
    carried = carry_over(path, model)
    assert len(carried) == 2 * 7  # every block linear, Q and K rows un-permuted correctly
    for name, weights in carried.items():
        assert torch.allclose(weights.dequantize(), model.get_submodule(name).weight, rtol=0, atol=1e-6)
    report = apply_int4(model, location=str(tmp_path / "nowhere"), gguf=path, group_size=32, quantize_head=False)
    assert sorted(report.carried_over) == sorted(carried)
    with torch.no_grad():
        quantized = model(ids).logits
    # Same codes; only the bf16 rounding of activations, scales and zeros is left.
    assert float((quantized - full).abs().max()) <= REL_TOL * float(full.abs().max())


def test_int4_cache_gives_the_same_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    tiny_llama(seed=1).save_pretrained(src)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    logits = []
    for _ in range(2):  # the first run writes the cache, the second reads it
        model = LlamaForCausalLM.from_pretrained(src).eval()
        apply_int4(model, location=str(src), gguf=None)
        with torch.no_grad():
            logits.append(model(ids).logits)
    assert len(list((tmp_path / "cache" / "int4").glob("*.safetensors"))) == 1
    assert torch.equal(logits[0], logits[1])


# ----------------------------------------------------------------------------- memory and decoding

@pytest.mark.parametrize("group_size, quantize_head", [(32, True), (32, False)])
def test_memory_plan_counts_int4_bytes_exactly(group_size: int, quantize_head: bool) -> None:
    model = tiny_llama(seed=1)
    quantize_model(model, group_size=group_size, quantize_head=quantize_head)
    real = sum(p.numel() * p.element_size() for p in model.parameters())
    real += sum(b.numel() * b.element_size() for b in model.buffers() if b.dtype in (torch.uint8, torch.bfloat16))
    assert estimate_weights_bytes(model.config, "int4", "float32", group_size, quantize_head) == real


def test_greedy_spec_with_an_int4_draft_equals_plain() -> None:
    target = tiny_llama(seed=1)
    draft = tiny_llama(seed=1)
    quantize_model(draft, group_size=32)
    cpu = Device(CPU)
    for prompt in ([3, 5, 7, 11, 13], [1, 2, 3, 1, 2, 3], [42]):
        params = GenerationParams(max_new_tokens=24)
        plain = [t for e in SpecDecoder(target, cpu).generate(prompt, params) for t in e.token_ids]
        for k in (2, 5, None):
            decoder = SpecDecoder(target, cpu, ModelDrafter(draft, cpu))
            events = list(decoder.generate(prompt, GenerationParams(max_new_tokens=24, k=k)))
            assert [t for e in events for t in e.token_ids] == plain
            assert events[-1].stats.accepted > 0  # the int4 copy agrees often


@pytest.mark.slow
def test_real_smollm2_gguf_blocks_are_all_carried_over(pocket_dir: Path) -> None:
    """Every Q4_1 linear of the pocket GGUF maps onto the converted model, bit for bit."""
    import json

    from transformers import AutoModelForCausalLM

    gguf = Path(json.loads((pocket_dir / "specchat-converted.json").read_text())["gguf"])
    model = AutoModelForCausalLM.from_pretrained(str(pocket_dir), dtype=torch.float32).eval()
    carried = carry_over(gguf, model)
    assert len(carried) == 30 * 7  # 30 blocks x (q, k, v, o, gate, up, down); the head is Q8_0
    worst = max(bf16_rounding_error(w)[1] for w in carried.values())
    assert worst <= 2.0**-8 * 2
