"""The CPU kernel's variants (AVX2, AVX-512 VNNI, AVX-VNNI): chosen by the CPU's flags or forced
by SPECCHAT_CPU_KERNEL, each packing the codes in its own order, and every one giving each output
the bits the AVX2 reference gives (the same int32 sums, the same float work after them)."""
from __future__ import annotations

import pytest
import torch

from engine.errors import SettingError
from engine.quant import cpu_isa, cpu_kernel, cpu_linear, cpu_pack
from engine.quant.int4 import Int4Weights, quantize_weight, quantize_weight8, two_planes
from tests.engine.quant.test_k_quant_headers import q4_k_weights, q6_k_weights

VNNI = [name for name in cpu_kernel.VARIANTS if name != "avx2"]
AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})
AVX512 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}


def _six_bit(n: int, k: int, seed: int) -> Int4Weights:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 64, (n, k), generator=gen)
    s = (torch.randn(n, k // 16, generator=gen) * 1e-3).bfloat16().float()
    return two_planes(q + 96, s, 8.0 * s, torch.zeros_like(s), 16)


def _weights(kind: str, n: int, k: int, seed: int) -> Int4Weights:
    if kind == "6-bit":
        return _six_bit(n, k, seed)
    if kind == "q4_k":
        return q4_k_weights(n, k, seed)
    if kind == "q6_k":
        return q6_k_weights(n, k, seed)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    return quantize_weight8(w) if kind == "8-bit" else quantize_weight(w, 32)


@pytest.fixture(autouse=True)
def _flags() -> None:
    """Each test sees the machine's own flags unless it sets others."""
    cpu_isa.cpu_flags.cache_clear()


def _runnable(name: str) -> None:
    problem = cpu_kernel.why_not(name)
    if problem is not None:
        pytest.skip(f"the {name} variant cannot run on this machine: {problem}")
    if cpu_kernel.why_not("avx2") is not None:
        pytest.skip(f"the avx2 reference cannot run here: {cpu_kernel.why_not('avx2')}")


@pytest.mark.parametrize("name", VNNI)
@pytest.mark.parametrize("kind, n, k", [("int4", 37, 576), ("int4", 40, 1536), ("int4", 12, 64), ("int4", 9, 8960),
                                        ("8-bit", 21, 2112), ("8-bit", 16, 1536), ("6-bit", 19, 1536),
                                        ("6-bit", 8, 2304), ("6-bit", 9, 8960), ("q4_k", 37, 512), ("q4_k", 40, 1536),
                                        ("q4_k", 9, 8960), ("q6_k", 19, 1536), ("q6_k", 9, 8960)])
def test_each_vnni_variant_gives_every_output_the_avx2_bits(name: str, kind: str, n: int, k: int) -> None:
    """Random layers of each layout (K with and without a tail after its 256-weight blocks, rows off
    the kernel's tile, long rows one at a time, long 6-bit rows in tiles again on VNNI), one token and
    passes of several: the VNNI variant's outputs equal the AVX2 reference's exactly, and so do a folded
    norm, a gate and a residual add; a token's row is the same alone and in a pass of seven."""
    _runnable(name)
    weights = _weights(kind, n, k, seed=n + k)
    planes = weights.planes
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(k)) * 2
    gate = torch.randn(5, 2 * k, generator=torch.Generator().manual_seed(n))
    norm = (torch.rand(k) + 0.5, 1e-6)
    bias = torch.randn(n)
    out = {}
    for variant in ("avx2", name):
        packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, planes, variant=variant,
                                        headers=weights.headers)
        plain = cpu_linear.linear(packed, table, bias, k, planes, variant=variant)
        normed = cpu_linear.linear(packed, table, None, k, planes, norm=norm, variant=variant)
        gated = cpu_linear.linear(packed, table, None, k, planes, gated=True, variant=variant)
        residual = torch.ones(7, n)
        out[variant] = [plain(x[:1]), plain(x[:3]), plain(x), normed(x[:4]), gated(gate), plain(x, residual=residual)]
    for variant in out:
        assert torch.equal(out[variant][0], out[variant][2][:1])
    for reference, got in zip(out["avx2"], out[name], strict=True):
        assert torch.equal(reference, got), float((reference - got).abs().max())


@pytest.mark.parametrize("name", list(cpu_kernel.VARIANTS))
@pytest.mark.parametrize("kind, k", [("int4", 576), ("int4", 1536), ("8-bit", 2112), ("6-bit", 1536), ("q4_k", 1536),
                                     ("q6_k", 1536)])
def test_every_variants_layout_keeps_every_code(name: str, kind: str, k: int) -> None:
    """Packing for any variant (no CPU needed) and unpacking for the same gives the codes back."""
    weights = _weights(kind, 6, k, seed=k)
    packed, _ = cpu_pack.pack(weights.codes, weights.scale, weights.zero, weights.planes, variant=name,
                                headers=weights.headers)
    assert torch.equal(cpu_pack.unpack_codes(packed, k if kind in ("6-bit", "q6_k") else None, variant=name), weights.codes)


def test_the_vnni_order_moves_only_whole_256_blocks_and_undoes_itself() -> None:
    codes = torch.arange(3 * 576).reshape(3, 576) % 251
    ordered = cpu_kernel.vnni_order(codes)
    assert torch.equal(ordered[:, 512:], codes[:, 512:])  # the tail after the last 256 stays
    assert not torch.equal(ordered[:, :512], codes[:, :512])
    assert torch.equal(cpu_kernel.vnni_order(ordered), codes)
    # weight 4 (group 0, first half, part 1) lands in part 1's vector, lane 0: byte 32
    assert int(ordered[0, 32]) == int(codes[0, 4]) and int(ordered[0, 4]) == int(codes[0, 32])


@pytest.mark.parametrize("flags, env, chosen", [
    (AVX2_ONLY, "", "avx2"), (AVX512, "", "avx512-vnni"), (AVX512, "avx2", "avx2"), (AVX512, "AVX512", "avx512-vnni"),
    (AVX2_ONLY | {"avx_vnni"}, "", "avx-vnni"), (AVX512 | {"avx_vnni"}, "auto", "avx512-vnni"),
])
def test_the_variant_follows_the_cpus_flags_unless_one_is_forced(
    flags: frozenset[str], env: str, chosen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: flags)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setenv(cpu_kernel.ENV, env)
    assert cpu_kernel.why_not() is None
    assert cpu_isa.choose() == chosen
    assert cpu_pack.layout_tag(chosen) == {"avx2": "2", "avx-vnni": "2-vnni", "avx512-vnni": f"2-vnni-t{cpu_pack.TILE_ROWS}"}[chosen]


def test_a_forced_variant_the_cpu_lacks_or_an_unknown_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: AVX2_ONLY)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setenv(cpu_kernel.ENV, "avx512-vnni")
    assert cpu_kernel.why_not() == ("the avx512-vnni variant needs the CPU flags f16c avx512f avx512bw avx512vl "
                                    "avx512_vnni, and this CPU lacks some")
    assert cpu_kernel.variant() is None and cpu_kernel.library.__wrapped__() is None
    monkeypatch.setenv(cpu_kernel.ENV, "avx9")  # before, torch's slower kernel ran instead, said only in the log
    with pytest.raises(SettingError, match="SPECCHAT_CPU_KERNEL='avx9': use auto, torch or one of avx512-vnni, "
                                           "avx-vnni, avx2, or unset it"):
        cpu_kernel.why_not()


def test_an_avx2_cpu_without_f16c_runs_torchs_kernel_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """F16C converts a Q4_K header's fp16 d and dmin: a CPU reporting AVX2 without it (none is known) is told so."""
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: AVX2_ONLY - {"f16c"})
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setenv(cpu_kernel.ENV, "")
    assert cpu_isa.choose() == "avx2"
    assert cpu_kernel.why_not() == "the avx2 variant needs the CPU flags f16c, and this CPU lacks some"
    assert cpu_kernel.variant() is None and cpu_kernel.library.__wrapped__() is None


def test_the_cpu_features_named_are_the_ones_the_cpu_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: AVX512 | {"avx512_bf16"})
    assert cpu_kernel.cpu_features() == ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"]


def test_the_variant_named_is_the_one_loaded_and_packs_its_order() -> None:
    """variant() reports the library the process loaded, and pack() without a variant lays codes
    out for it: the two cannot disagree."""
    if cpu_kernel.matmul() is None:
        pytest.skip(f"specchat's CPU kernel cannot run here: {cpu_kernel.why_not()}")
    name = cpu_kernel.variant()
    assert name == cpu_kernel.library().specchat_kernel_variant().decode()
    assert cpu_kernel.is_vnni() == (name != "avx2")


def test_a_variant_the_compiler_cannot_build_falls_back_to_avx2(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chosen by the flags but unbuildable (a compiler without -mavx512vnni): the AVX2 reference runs,
    and variant() says so (torch's kernel only where AVX2 cannot be had either)."""
    _runnable("avx2")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: AVX512)
    monkeypatch.setitem(cpu_kernel.VARIANTS, "avx512-vnni", (("-mno-such-isa",), cpu_kernel.VARIANTS["avx512-vnni"][1]))
    lib = cpu_kernel.library.__wrapped__()
    assert lib is not None and lib.specchat_kernel_variant().decode() == "avx2"


@pytest.mark.parametrize("name", list(cpu_kernel.VARIANTS))
def test_a_built_library_says_which_variant_it_is(name: str) -> None:
    _runnable(name)
    lib = cpu_kernel.library(name)
    assert lib is not None and lib.specchat_kernel_variant().decode() == name


def test_the_engine_names_the_kernel_that_multiplies_an_int4_target_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the loading stage and EngineInfo.cpu_kernel say: the variant (or torch's) for an int4
    target on the CPU, nothing where no CPU int4 kernel runs."""
    from engine.config.profiles import ModelSpec
    from engine.load.loader import cpu_kernel_name
    from engine.model.device import Device

    cpu = Device(torch.device("cpu"))
    monkeypatch.setenv(cpu_kernel.ENV, "avx2")
    assert cpu_kernel_name(ModelSpec("x.gguf", quantization="int4"), cpu) == (cpu_kernel.variant() or "torch")
    assert cpu_kernel_name(ModelSpec("x.gguf"), cpu) is None
    monkeypatch.setenv(cpu_kernel.ENV, "torch")
    assert cpu_kernel_name(ModelSpec("x.gguf", quantization="int4"), cpu) == "torch"


def test_a_library_cut_short_in_the_cache_is_built_again_not_loaded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A library cut short (a crash as it was written) was mapped past its end: every command died
    of SIGBUS with no word (a hostile test's). Loaded in a child, so the old failure is a failed test."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if cpu_kernel._compiler() is None:
        pytest.skip("no C compiler here")
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "SPECCHAT_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(root)}
    load = [sys.executable, "-c", "from engine.quant.cpu_kernel import _load; _load('avx2'); print('loaded')"]
    assert subprocess.run(load, env=env, capture_output=True, text=True, timeout=300).stdout.strip() == "loaded"
    (built,) = (tmp_path / "kernels").glob("specchat_avx2-*.so")
    whole = built.read_bytes()
    built.write_bytes(whole[:1000])
    done = subprocess.run(load, env=env, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout.strip()) == (0, "loaded"), done.stderr[-500:]
    assert built.stat().st_size == len(whole)  # built again, whole


def test_a_library_built_before_the_stamps_is_kept_where_no_compiler_could_build_it_again(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    if cpu_kernel._compiler() is None:
        pytest.skip("no C compiler here to build the library first")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path))
    cpu_kernel._load("avx2")
    (built,) = (tmp_path / "kernels").glob("specchat_avx2-*.so")
    cpu_kernel._stamp_path(built).unlink()  # as a cache from before the stamps holds it
    monkeypatch.setattr(cpu_kernel, "_compiler", lambda: None)
    assert cpu_kernel._load("avx2") is not None and built.exists()  # loaded as before, not deleted
    assert not cpu_kernel._stamp_path(built).exists()
