"""specchat's CPU int4 kernel: the weights torch's kernel would use, activations to 8 bits,
every output the same bit for bit whatever the number of tokens or threads."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from engine.quant import cpu_kernel, cpu_linear, cpu_pack
from engine.quant.int4 import Int4Linear, Int4Weights, quantize_weight, quantize_weight8

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _kernel() -> None:
    if cpu_kernel.matmul() is None:
        pytest.skip(f"specchat's CPU int4 kernel cannot run here: {cpu_kernel.why_not()}")


def _weights(n: int, k: int, seed: int, planes: int = 1) -> Int4Weights:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    return quantize_weight8(w) if planes == 2 else quantize_weight(w, 32)


def _reference(weights: Int4Weights, x: torch.Tensor) -> torch.Tensor:
    """fp32 x @ W.T, W with scales and zeros rounded to bf16 (the weights both kernels use)."""
    rounded = Int4Weights(weights.codes, weights.scale.bfloat16().float(), weights.zero.bfloat16().float(),
                          weights.group_size, weights.planes)
    return x @ rounded.dequantize().T


def _int8_bound(weights: Int4Weights, x: torch.Tensor) -> torch.Tensor:
    """The most the activations' rounding to 8 bits can move each output: half a step of each
    group of 32 (max|x| / 254) times the sum of |w| over the group, summed over groups."""
    k = x.shape[-1]
    half_step = x.abs().view(*x.shape[:-1], k // 32, 32).amax(-1) / 254
    w = weights.dequantize().abs().view(weights.shape[0], k // 32, 32).sum(-1)
    return half_step @ w.T * 1.001 + 1e-5


@pytest.mark.parametrize("n, k, planes", [(48, 256, 1), (16, 576, 1), (64, 64, 1), (48, 320, 2), (1536, 1536, 1),
                                           (32, 4160, 1), (32, 2112, 2)])
def test_outputs_are_the_dequantized_product_within_the_activations_rounding(n: int, k: int, planes: int) -> None:
    """The kernel multiplies exactly the weights torch's kernel would (bf16 scales and zeros);
    the only other rounding is the activations' to int8 per group of 32, and each output is
    within the bound that rounding allows (K with a tail after its 8-group blocks, and two
    planes, included)."""
    weights = _weights(n, k, seed=n + k, planes=planes)
    bias = torch.randn(n)
    layer = Int4Linear(weights, bias, CPU)
    assert layer.kernel == "specchat"
    x = torch.randn(7, k)
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (7, n)
    err = (y - bias - _reference(weights, x)).abs()
    assert bool((err <= _int8_bound(weights, x)).all()), float((err / _int8_bound(weights, x)).max())


# long rows go one at a time; from 4096 inputs several tokens take two rows a tile on AVX-512
@pytest.mark.parametrize("planes, k, n", [(1, 192, 80), (2, 192, 80), (1, 4096, 80), (2, 2048, 80), (2, 4096, 80)])
def test_each_token_gets_the_same_bits_in_a_pass_of_any_size_and_any_thread_count(planes: int, k: int, n: int) -> None:
    """Row-exactness, which keeps greedy speculation token-identical to plain decoding: a token's
    outputs in a pass of M tokens (verify passes, and prompts longer than the kernel's 32-token
    blocks) equal its outputs alone, bit for bit, on one thread or two."""
    weights = _weights(n, k, seed=5, planes=planes)
    f = Int4Linear.fuse([Int4Linear(weights, torch.randn(n), CPU)])
    x = torch.randn(41, k) * torch.logspace(-3, 2, 41).unsqueeze(1)  # groups of very different sizes
    alone = torch.cat([f(x[i : i + 1]) for i in range(41)])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for m in (1, 2, 3, 4, 5, 6, 7, 9, 17, 32, 33, 41):
                assert torch.equal(f(x[:m]), alone[:m]), (count, m)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("planes", [1, 2])
@pytest.mark.parametrize("k", [576, 4096])
def test_a_row_count_off_the_kernels_tile_is_computed_whole(planes: int, k: int) -> None:
    """The kernel takes output rows four at a time (one token) or two (several, from 4096 inputs on
    AVX-512); the last tile may be short (the layer refuses such shapes for torch's sake, so this
    calls the kernel directly). Each token still gets the bits it gets alone."""
    weights = _weights(11, k, seed=4, planes=planes)
    packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, planes)
    bias = torch.randn(11)
    x = torch.randn(3, k)
    f = cpu_linear.linear(packed, table, bias, k, planes)
    y = f(x)
    err = (y - bias - _reference(weights, x)).abs()
    assert bool((err <= _int8_bound(weights, x)).all())
    assert torch.equal(y, torch.cat([f(x[i : i + 1]) for i in range(3)]))


def test_a_zero_group_of_activations_gives_exact_zeros() -> None:
    weights = _weights(16, 128, seed=2)
    y = Int4Linear(weights, None, CPU)(torch.zeros(2, 128))
    assert torch.equal(y, torch.zeros(2, 16))


def test_pack_keeps_every_code_and_rounds_scales_as_torch_does() -> None:
    weights = _weights(24, 256, seed=9)
    packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 1)
    assert packed.shape == (24, 128) and table.shape == (24, 1, 2, 8) and table.dtype == torch.bfloat16
    assert torch.equal(cpu_pack.unpack_codes(packed), weights.codes)
    assert torch.equal(table[:, 0, 0], weights.scale.bfloat16()) and torch.equal(table[:, 0, 1], weights.zero.bfloat16())


def test_two_planes_are_joined_into_the_8_bit_weights_they_stand_for() -> None:
    """Two int4 planes (l, h; the high plane's scale 16 s) become one signed byte a weight,
    v = 16 h + l - 128, with w = v s + c: the very weights the planes dequantize to."""
    weights = _weights(24, 256, seed=9, planes=2)
    packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 2)
    assert packed.shape == (24, 256) and packed.dtype == torch.int8
    assert table.shape == (24, 2, 8) and table.dtype == torch.float32
    assert torch.equal(cpu_pack.unpack_codes(packed), weights.codes)
    v = cpu_kernel.vnni_order(packed).float() if cpu_kernel.is_vnni() else packed.float()  # weight order
    v = v.view(24, 8, 32)
    joined = (v * table[:, 0, :, None] + table[:, 1, :, None]).view(24, 256)
    assert torch.allclose(joined, _reference(weights, torch.eye(256)).T, rtol=0, atol=1e-6)
    off = weights.scale.clone()
    off[:, 8:] *= 1.5  # a high plane whose scale is not 16 times the low one's
    with pytest.raises(ValueError, match="16 times"):
        cpu_pack.pack(weights.codes, off, weights.zero, 2)


def test_shapes_it_does_not_take_go_to_torchs_kernel() -> None:
    """Inputs not in whole 64-weight pairs of groups, or groups other than 32, run on torch's kernel."""
    assert not cpu_pack.fits(96, 32) and not cpu_pack.fits(128, 64) and cpu_pack.fits(128, 32)
    assert Int4Linear(quantize_weight(torch.randn(16, 96), 32), None, CPU).kernel == "torch"
    assert Int4Linear(quantize_weight(torch.randn(16, 128), 64), None, CPU).kernel == "torch"


@pytest.mark.parametrize("kind", ["int4", "int8", "six-bit"])
def test_a_subset_of_rows_gives_the_full_layers_bits_for_those_rows(kind: str) -> None:
    """An output layer over some of its rows (a draft's frequent tokens) takes those rows' own codes
    and scales, so each of its outputs is the full layer's, bit for bit, in passes of any size."""
    from tests.engine.quant.test_six_bit import six_bit

    weights = six_bit(80, 512, seed=4) if kind == "six-bit" else _weights(80, 256, seed=4, planes=2 if kind == "int8" else 1)
    bias = torch.randn(80)
    layer = Int4Linear(weights, bias, CPU)
    assert layer.kernel == "specchat"
    ids = torch.tensor([0, 3, 4, 17, 40, 41, 79])
    part = layer.rows(ids)
    assert part is not None
    for m in (1, 3, 8):
        x = torch.randn(m, weights.shape[1])
        assert torch.equal(part(x), layer(x)[:, ids])


def test_on_torchs_kernel_no_subset_of_rows_is_offered() -> None:
    layer = Int4Linear(quantize_weight(torch.randn(16, 96), 32), None, CPU)
    assert layer.kernel == "torch" and layer.rows(torch.tensor([1, 2])) is None


def _uncached(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels looked for anew, not the cached answers."""
    for name in ("library", "matmul", "matmul8", "matmul6", "attention"):
        monkeypatch.setattr(cpu_kernel, name, getattr(cpu_kernel, name).__wrapped__)


def test_without_a_compiler_torchs_kernel_runs_and_the_log_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(cpu_kernel.shutil, "which", lambda name: None)
    _uncached(monkeypatch)
    with caplog.at_level(logging.INFO, logger="engine.quant.cpu_kernel"):
        assert cpu_kernel.matmul() is None
        assert Int4Linear(quantize_weight(torch.randn(16, 128), 32), None, CPU).kernel == "torch"
    assert "no C compiler was found" in caplog.text


def test_a_failing_build_leaves_no_library_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_kernel, "FLAGS", ("-not-a-flag",))
    _uncached(monkeypatch)
    assert cpu_kernel.matmul() is None
    assert not any((tmp_path / "cache" / "kernels").iterdir())


def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_kernel.ENV, "torch")
    assert cpu_kernel.why_not() == f"{cpu_kernel.ENV}=torch is set"


def test_a_folded_pre_norm_and_a_residual_add_in_place_are_the_ops_they_replace() -> None:
    """``norm``: the rows are RMS-normalised before the product (within float rounding of
    torch's rms_norm, then the same 8-bit bound); ``residual``: the product is added into the
    residual in place, the very sum ``residual + f(x)`` gives."""
    weights = _weights(64, 256, seed=11)
    packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 1)
    gamma, eps = torch.rand(256) + 0.5, 1e-5
    x = torch.randn(5, 256) * 3
    folded = cpu_linear.linear(packed, table, None, 256, 1, norm=(gamma, eps))(x)
    normed = torch.nn.functional.rms_norm(x, (256,), gamma, eps)
    err = (folded - _reference(weights, normed)).abs()
    assert bool((err <= _int8_bound(weights, normed) * 1.01 + 1e-4).all())

    plain = cpu_linear.linear(packed, table, torch.randn(64), 256, 1)
    residual = torch.randn(5, 64)
    want = residual + plain(x)
    got = plain(x, residual=residual)
    assert got is residual and torch.equal(got, want)
    with pytest.raises(ValueError, match="float32 tensor of 5 x 64"):
        plain(x, residual=torch.zeros(5, 64, dtype=torch.bfloat16))


def test_the_quantization_report_says_which_kernel_runs_each_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.quant.int4 import quantize_model
    from tests.tiny import tiny_llama

    model = tiny_llama(3, hidden_size=64)
    report = quantize_model(model, group_size=32)
    assert report.kernels == {"specchat": len(report.quantized)}
    assert f"{len(report.quantized)} on specchat's kernel" in report.summary()
    monkeypatch.setattr(cpu_kernel, "matmul", lambda: None)
    report = quantize_model(tiny_llama(3, hidden_size=64), group_size=32)
    assert report.kernels == {"torch": len(report.quantized)}


@pytest.mark.parametrize("capability, usable", [("AVX2", True), ("AVX512", True), ("AVX512_BF16", True),
                                                 ("DEFAULT", False), ("NO AVX", False), ("SVE256", False)])
def test_it_runs_only_where_torch_reports_avx2_or_better(
    capability: str, usable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    problem = cpu_kernel.why_not()
    assert (problem is None) is usable
    if not usable:
        assert problem == f"the CPU offers {capability}, and the kernel needs AVX2 and FMA"


def test_large_weights_are_copied_to_huge_page_aligned_memory_and_small_ones_stay() -> None:
    """The kernel streams its weights; large ones move to a 2 MiB-aligned mapping advised for
    huge pages (Linux), the same values; small ones are left where they are."""
    import mmap

    small = torch.arange(100, dtype=torch.uint8)
    assert cpu_pack.on_huge_pages(small) is small
    big = torch.randint(0, 255, (cpu_pack.HUGE_MIN_BYTES + 1000,), dtype=torch.uint8).view(torch.int8)
    moved = cpu_pack.on_huge_pages(big)
    assert torch.equal(moved, big) and moved.dtype == torch.int8
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert moved.data_ptr() != big.data_ptr() and moved.data_ptr() % cpu_pack.HUGE_PAGE == 0
