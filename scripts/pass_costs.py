"""What a target pass of M tokens costs, in process (docs/performance.md).

    .venv/bin/python scripts/pass_costs.py --profile pocket [--tokens 1 2 4 8] [--passes 64]

Loads the profile's target (no draft), reads a 200-token prompt of random ids, then times
passes of M new tokens through the lean forward, cropping the cache back after each so the
context stays near 200 tokens: medians in ms, on a quiet machine, ``--threads`` (2) threads.
``--profile-ops`` adds torch's profiler table of one-token passes (the C kernels' time does
not show there: it is what the table leaves out).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config.models_file import load_profiles  # noqa: E402
from engine.load.loader import load_engine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="pocket")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--passes", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile-ops", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    profile = dataclasses.replace(load_profiles().get(args.profile), drafter="none", draft=None)
    engine = load_engine(profile)
    lean = engine.decoder.target._lean  # type: ignore[attr-defined]
    if lean is None:
        raise SystemExit(f"{args.profile}'s target does not run the lean forward")
    print(f"{args.profile}: attention step {'on' if getattr(lean, 'native_attention', False) else 'off'}, "
          f"{sum(layer.folded for layer in lean.layers)}/{len(lean.layers)} layers folded")
    cache = lean.new_cache(4096)
    gen = torch.Generator().manual_seed(0)
    lean(torch.randint(100, 1000, (1, 200), generator=gen), cache, 0, 1, row_exact=False)

    def one_pass(m: int) -> None:
        start = cache.get_seq_length()
        lean(torch.randint(100, 1000, (1, m), generator=gen), cache, start, m)
        for layer in cache.layers:
            layer.crop(-m)

    with torch.inference_mode():
        for m in args.tokens:
            for _ in range(5):
                one_pass(m)
            times = []
            for _ in range(args.passes):
                t0 = time.perf_counter()
                one_pass(m)
                times.append(time.perf_counter() - t0)
            print(f"M={m:<3} median {statistics.median(times) * 1e3:7.2f} ms   min {min(times) * 1e3:7.2f} ms")
        if args.profile_ops:
            from torch.profiler import ProfilerActivity, profile as torch_profile

            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(20):
                    one_pass(1)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    engine.close()


if __name__ == "__main__":
    main()
