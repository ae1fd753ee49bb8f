"""specchat's CPU int4 kernel against torch's on the shapes of the shipped profiles (docs/performance.md).

    .venv/bin/python scripts/int4_kernel_speed.py [--threads 2] [--repeats 9] [--tokens 1 5]

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
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.quant import cpu_kernel  # noqa: E402
from engine.quant.int4 import Int4Linear, Int4Weights  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 5])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
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
