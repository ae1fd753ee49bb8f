"""The most a drafter can buy a profile on this machine: measured step costs, then the
speedup of every fixed K for a range of acceptance rates (docs/performance.md).

    .venv/bin/python scripts/spec_ceiling.py --profile coder [--rounds 12] [--alphas 0.7 0.8 0.87 0.95]
    SPECCHAT_CPU_KERNEL=avx2 .venv/bin/python scripts/spec_ceiling.py --profile coder --threads 1 --cpu-time

Loads the profile (target and draft), reads a 200-token prompt of random ids into both, then
times, alternating in one loop, a draft step (one token through the draft, its own output
layer as the profile sets it; none for a lookup drafter, whose proposal costs microseconds)
and target passes of 1..K_MAX+1 tokens, cropping each cache back
after every pass; medians in ms. With ``d`` the draft step, ``V(M)`` a target pass of M
tokens and ``T = V(1)`` a plain step, a round with K drafted tokens whose each is accepted
with probability α (independently) yields ``E = (1 − α^(K+1)) / (1 − α)`` tokens and costs
``K·d + V(K+1)``:

    speedup(K, α) = E · T / (K·d + V(K+1))

and, as the limit of a drafter that costs nothing, the same with ``d = 0``. Acceptance that
comes in runs (code) gives more tokens a round than the independent figure; the bench's
measured τ shows by how much. Run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config.models_file import load_profiles  # noqa: E402
from engine.load.loader import load_engine  # noqa: E402

K_MAX = 6


def tokens_per_round(alpha: float, k: int) -> float:
    """Expected tokens of a round: accepted drafts plus the target's own, α per token, independent."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="coder")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.7, 0.8, 0.87, 0.95])
    parser.add_argument("--cpu-time", action="store_true",
                        help="time passes by this thread's CPU time (needs --threads 1): steadier on a shared machine")
    args = parser.parse_args()
    if args.cpu_time and args.threads != 1:
        raise SystemExit("--cpu-time counts this thread's CPU time: use it with --threads 1")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    engine = load_engine(load_profiles().get(args.profile))
    draft = getattr(engine.decoder.drafter, "runner", None)  # a lookup drafter has none: d = 0
    target = engine.decoder.target
    if target._lean is None or (draft is not None and draft._lean is None):  # type: ignore[attr-defined]
        raise SystemExit(f"{args.profile} does not run on the lean forward")
    passes = {"d": (draft._lean, 1)} if draft is not None else {}
    passes |= {f"V({m})": (target._lean, m) for m in range(1, K_MAX + 2)}
    caches = {id(lean): lean.new_cache(4096) for lean, _ in passes.values()}
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 1000, (1, 200), generator=gen)
    times: dict[str, list[float]] = {name: [] for name in passes}
    with torch.inference_mode():
        for lean, _ in passes.values():
            if caches[id(lean)].get_seq_length() == 0:
                lean(prompt, caches[id(lean)], 0, 1, row_exact=False)
        for _ in range(args.rounds):
            for name, (lean, m) in passes.items():
                cache = caches[id(lean)]
                start = cache.get_seq_length()
                t0 = clock()
                lean(torch.randint(100, 1000, (1, m), generator=gen), cache, start, m)
                times[name].append(clock() - t0)
                for layer in cache.layers:
                    layer.crop(-m)
    ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    from engine.quant import cpu_kernel

    print(f"CPU kernel {cpu_kernel.variant() or 'torch'} (CPU flags: {' '.join(cpu_kernel.cpu_features())})"
          + ("; CPU time of this thread" if args.cpu_time else ""))
    print(f"{args.profile}, {args.threads} threads, medians of {args.rounds} alternating rounds (ms): "
          + ", ".join(f"{name} {v:.1f}" for name, v in ms.items()))
    t, d = ms["V(1)"], ms.get("d", 0.0)
    print(f"a draft step is {d / t:.2f} of a plain step; each further verified token adds "
          + ", ".join(f"{(ms[f'V({m + 1})'] - ms[f'V({m})']) / t:.2f}" for m in range(1, K_MAX + 1)) + " of one")
    ks = range(1, K_MAX + 1)
    print(f"{'alpha':>6} " + " ".join(f"{'K=' + str(k):>7}" for k in ks)
          + ("   | free draft: " + " ".join(f"{'K=' + str(k):>6}" for k in ks) if d else ""))
    for alpha in args.alphas:
        real = [tokens_per_round(alpha, k) * t / (k * d + ms[f"V({k + 1})"]) for k in ks]
        free = [tokens_per_round(alpha, k) * t / ms[f"V({k + 1})"] for k in ks]
        print(f"{alpha:>6.2f} " + " ".join(f"{s:>6.2f}x" for s in real)
              + ("   |             " + " ".join(f"{s:>5.2f}x" for s in free) if d else ""))
    engine.close()


if __name__ == "__main__":
    main()
