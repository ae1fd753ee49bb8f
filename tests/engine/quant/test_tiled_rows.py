"""Q4_K rows in tiles (cpu_pack.tile_rows, the kernel's INT4KT): every output has the bits the same
rows give laid out one after another, on every variant this machine runs, for one token, passes of several
and prompt pieces past a block of 32; the layout gives its codes and headers back; a layer in tiles serves
a draft's output rows (Int4Linear.rows) with the full layer's bits."""
from __future__ import annotations

import pytest
import torch

from engine.quant import cpu_kernel, cpu_linear, cpu_pack
from engine.quant.int4 import Int4Linear
from tests.engine.quant.test_k_quant_headers import q4_k_weights

CPU = torch.device("cpu")


def _runnable(name: str) -> None:
    problem = cpu_kernel.why_not(name)
    if problem is not None:
        pytest.skip(f"the {name} variant cannot run on this machine: {problem}")


def test_tiles_give_the_rows_codes_and_headers_back() -> None:
    weights = q4_k_weights(12, 768, seed=3)
    packed, headers = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 1, headers=weights.headers,
                                    variant="avx2", tiled=False)
    tiled = cpu_pack.tile_rows(packed, headers)
    t = cpu_pack.TILE_ROWS
    assert tiled.shape == (12 // t, 3, t, 144)
    tile, at = divmod(7, t)
    block = tiled[tile, 2].reshape(-1)  # row 7's third super-block: its header among the tile's, then its codes
    assert torch.equal(block[16 * at : 16 * at + 16], headers[7, 32:48])
    assert torch.equal(block[16 * t + 128 * at : 16 * t + 128 * at + 128], packed[7, 256:384])
    back, back_headers = cpu_pack.untile(tiled)
    assert torch.equal(back, packed) and torch.equal(back_headers, headers)
    for variant in cpu_kernel.VARIANTS:  # no CPU needed to lay out or read back
        codes, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 1, headers=weights.headers,
                                     variant=variant, tiled=True)
        assert codes.dim() == 4 and table.numel() == 0
        assert torch.equal(cpu_pack.unpack_codes(codes, variant=variant), weights.codes)


def test_rows_off_the_tiles_or_another_variants_choice_stay_rows() -> None:
    weights = q4_k_weights(9, 512, seed=4)  # 9 rows: not whole tiles
    packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 1, headers=weights.headers, tiled=True)
    assert packed.shape == (9, 256) and table.shape == (9, 32)
    whole, long = q4_k_weights(8, 512, seed=4), q4_k_weights(8, cpu_pack.TILE_MAX_K + 256, seed=5)
    assert cpu_pack.pack(whole.codes, whole.scale, whole.zero, 1, headers=whole.headers, variant="avx2")[0].dim() == 2
    tiled = cpu_pack.pack(whole.codes, whole.scale, whole.zero, 1, headers=whole.headers, variant="avx512-vnni")[0]
    assert tiled.dim() == 4 and cpu_pack.tiles("avx512-vnni") and not cpu_pack.tiles("avx2")
    rows = cpu_pack.pack(long.codes, long.scale, long.zero, 1, headers=long.headers, variant="avx512-vnni")[0]
    assert rows.dim() == 2  # long rows stay apart


@pytest.mark.parametrize("name", list(cpu_kernel.VARIANTS))
@pytest.mark.parametrize("n, k", [(16, 256), (40, 1536), (12, 8960)])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_output_has_the_bits_of_the_same_rows_untiled(name: str, n: int, k: int, threads: int) -> None:
    _runnable(name)
    weights = q4_k_weights(n, k, seed=n + k)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(k)) * 2
    gate = torch.randn(6, 2 * k, generator=torch.Generator().manual_seed(n))
    norm = (torch.rand(k) + 0.5, 1e-6)
    bias = torch.randn(n)
    out = {}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for tiled in (False, True):
            packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, 1, variant=name,
                                          headers=weights.headers, tiled=tiled)
            assert (packed.dim() == 4) == tiled
            plain = cpu_linear.linear(packed, table, bias, k, 1, variant=name)
            normed = cpu_linear.linear(packed, table, None, k, 1, norm=norm, variant=name)
            gated = cpu_linear.linear(packed, table, None, k, 1, gated=True, variant=name)
            assert plain.spec[0] == (5 if tiled else 3)  # type: ignore[attr-defined]
            residual = torch.ones(5, n)
            out[tiled] = [*(plain(x[:m]) for m in (1, 2, 3, 4, 5, 9, 37)), normed(x[:2]), gated(gate),
                          plain(x[:5], residual=residual)]
    finally:
        torch.set_num_threads(before)
    for rows, tiles in zip(out[False], out[True], strict=True):
        assert torch.equal(rows, tiles), float((rows - tiles).abs().max())
    whole = out[True][6]
    for i, m in enumerate((1, 2, 3, 4, 5, 9)):  # a token's row is the same alone and in any pass
        assert torch.equal(out[True][i], whole[:m])


def test_a_tiled_layer_serves_its_rows_with_the_full_layers_bits() -> None:
    _runnable("")
    weights = q4_k_weights(32, 512, seed=9)
    layer = Int4Linear(weights, None, CPU)
    if layer.packed.dim() != 4:
        pytest.skip("this machine's kernel variant keeps Q4_K rows untiled")
    ids = torch.tensor([30, 3, 17, 0, 5])
    x = torch.randn(3, 512)
    assert torch.equal(layer.rows(ids)(x), layer(x)[:, ids])  # type: ignore[misc]
