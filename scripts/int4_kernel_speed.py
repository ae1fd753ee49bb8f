"""specchat's CPU int4 kernel against torch's on the shapes of the shipped profiles (docs/performance.md).

    .venv/bin/python scripts/int4_kernel_speed.py [--threads 2] [--repeats 9] [--tokens 1 5]
    .venv/bin/python scripts/int4_kernel_speed.py --variants avx2 avx512-vnni [--only coder]

With ``--variants`` it compares variants of specchat's kernel instead (cpu_kernel.VARIANTS: each
packed in its own order, the same outputs checked bit for bit), on the same shapes plus the
GGUF's Q6_K tensors as 6-bit codes, with the bytes each reads a second (GB/s).

For each shape (out x in, planes) of `pocket` (SmolLM2-135M) and `coder` (Qwen2.5-Coder
1.5B), random int4 groups are packed for both kernels and multiplied by ``M`` tokens'
activations, the two kernels alternating; medians in ms. Both read every weight once a
call: the larger shapes do not fit the L3 cache, as a model's layers in turn do not. Run
it on a quiet machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.quant import cpu_kernel, cpu_linear, cpu_pack  # noqa: E402
from engine.quant.int4 import Int4Linear, Int4Weights, two_planes  # noqa: E402

SHAPES = [  # (name, out, in, planes)
    ("pocket q+k+v", 960, 576, 1), ("pocket gate+up", 3072, 576, 1), ("pocket down", 576, 1536, 1),
    ("pocket head", 49152, 576, 1),
    ("coder q", 1536, 1536, 1), ("coder gate+up", 17920, 1536, 1), ("coder down", 1536, 8960, 1),
    ("coder down (Q6_K planes)", 1536, 8960, 2), ("coder head (Q6_K planes)", 151936, 1536, 2),
]


def _layer(n: int, k: int, planes: int, kernel: str) -> Int4Linear:
    gen = torch.Generator().manual_seed(n + k)
    scale = torch.rand(n, k // 32, generator=gen) * 0.01
    weights = Int4Weights(torch.randint(0, 16, (n, planes * k), dtype=torch.uint8, generator=gen),
                          torch.cat([scale * 16**p for p in range(planes)], dim=1),  # 8 bits: two_planes' scales
                          torch.randn(n, planes * k // 32, generator=gen) * 0.01, 32, planes)
    real = cpu_kernel.matmul
    if kernel == "torch":
        cpu_kernel.matmul = lambda: None  # type: ignore[assignment]
    try:
        layer = Int4Linear(weights, None, torch.device("cpu"))
    finally:
        cpu_kernel.matmul = real  # type: ignore[assignment]
    assert layer.kernel == kernel, f"{kernel} kernel unavailable: {cpu_kernel.why_not()}"
    return layer


SIX_BIT_SHAPES = [("coder down (Q6_K, 6-bit)", 1536, 8960), ("coder head (Q6_K, 6-bit)", 151936, 1536)]


def _variant_layers(n: int, k: int, planes: int, names: list[str], six: bool) -> dict[str, Callable[..., torch.Tensor]]:
    """One weight of random codes packed for each variant in ``names`` (6-bit codes when ``six``)."""
    gen = torch.Generator().manual_seed(n + k)
    if six:
        q = torch.randint(0, 64, (n, k), generator=gen)
        s = (torch.randn(n, k // 16, generator=gen) * 1e-3).bfloat16().float()
        weights = two_planes(q + 96, s, 8.0 * s, torch.zeros_like(s), 16)
    else:
        scale = torch.rand(n, k // 32, generator=gen) * 0.01
        weights = Int4Weights(torch.randint(0, 16, (n, planes * k), dtype=torch.uint8, generator=gen),
                              torch.cat([scale * 16**p for p in range(planes)], dim=1),
                              torch.randn(n, planes * k // 32, generator=gen) * 0.01, 32, planes)
    out = {}
    for name in names:
        packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, weights.planes, variant=name)
        out[name] = cpu_linear.linear(cpu_pack.on_huge_pages(packed), table, None, k, weights.planes, variant=name)
    return out


def compare_variants(args: argparse.Namespace) -> None:
    """The kernel's variants alternating on each shape: medians in ms and the weight bytes read a second."""
    names = list(args.variants)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    if args.cpu_time and args.threads != 1:
        raise SystemExit("--cpu-time counts this thread's CPU time: use it with --threads 1")
    for name in names:
        problem = cpu_kernel.why_not(name)
        if problem is not None:
            raise SystemExit(f"the {name} variant cannot run here: {problem}")
    print(f"CPU flags: {' '.join(cpu_kernel.cpu_features())}; {args.threads} threads")
    print(f"{'shape':<26} {'M':>2} " + " ".join(f"{n + ' ms':>16} {'GB/s':>6}" for n in names) + f" {'ratio':>6}")
    shapes = [(name, n, k, planes, False) for name, n, k, planes in SHAPES]
    shapes += [(name, n, k, 2, True) for name, n, k in SIX_BIT_SHAPES]
    for name, n, k, planes, six in shapes:
        if args.only and not name.startswith(args.only):
            continue
        layers = _variant_layers(n, k, planes, names, six)
        nbytes = n * k * (7 / 8 if six else planes / 2)
        for m in args.tokens:
            x = torch.randn(m, k)
            times: dict[str, list[float]] = {v: [] for v in names}
            outs = {}
            for _ in range(args.repeats):
                for v in names:
                    start = clock()
                    outs[v] = layers[v](x)
                    times[v].append(clock() - start)
            same = all(torch.equal(outs[names[0]], outs[v]) for v in names)
            ms = [statistics.median(times[v]) * 1e3 for v in names]
            cells = " ".join(f"{t:>16.3f} {nbytes / t / 1e6:>6.1f}" for t in ms)
            print(f"{name:<26} {m:>2} {cells} {ms[0] / ms[-1]:>5.2f}x{'' if same else '  OUTPUTS DIFFER'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--variants", nargs="+", help="compare these variants of specchat's kernel instead of torch's")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by this thread's CPU time (with --threads 1): less noise on a shared machine")
    parser.add_argument("--only", default="", help="only the shapes whose name starts with this (e.g. coder)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.variants:
        compare_variants(args)
        return
    print(f"{'shape':<26} {'M':>2} {'specchat ms':>12} {'torch ms':>9} {'ratio':>6}")
    for name, n, k, planes in SHAPES:
        ours = Int4Linear.fuse([_layer(n, k, planes, "specchat")])
        theirs = Int4Linear.fuse([_layer(n, k, planes, "torch")])
        for m in args.tokens:
            x = torch.randn(m, k)
            times: dict[str, list[float]] = {"specchat": [], "torch": []}
            for _ in range(args.repeats):
                for label, f in (("specchat", ours), ("torch", theirs)):
                    start = time.perf_counter()
                    f(x)
                    times[label].append(time.perf_counter() - start)
            a, b = (statistics.median(times[label]) * 1e3 for label in ("specchat", "torch"))
            print(f"{name:<26} {m:>2} {a:>12.3f} {b:>9.3f} {b / a:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
