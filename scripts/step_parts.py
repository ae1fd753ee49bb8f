"""Where a target pass's time goes, part by part (docs/performance.md, issue 38).

    .venv/bin/python scripts/step_parts.py --profile coder [--tokens 1] [--passes 48] [--threads 2]

Loads the profile's target (no draft; ``--draft``: its draft model instead), reads a prompt of random ids (``--context``, 200 tokens), then runs passes
of M new tokens through the lean forward (its native path: every projection and the attention
step on specchat's CPU kernels), cropping the cache back after each, with a wall-clock timer
around each of the pass's parts: the joint q/k/v product (``qkv``), the attention step
(``attention``), ``o`` (with its residual add), ``gate_up`` (with its folded norm), ``down``
(with SwiGLU and its residual add) and the output layer (``head``). What the parts leave of
the whole pass is the Python and torch glue between them (``glue``: the embedding, the rotary
tables, the cache's bookkeeping, the calls' argument checks). Medians per pass in ms.
The timers cost about a microsecond each (a few hundred a pass): the parts' sum is what it is
with them, the calls made from Python; the untimed pass (``pass, untimed``: one call a layer, where
:mod:`engine.model.cpu_layer` makes them from C) is measured in the same loop.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config.models_file import load_profiles  # noqa: E402
from engine.load.loader import load_engine  # noqa: E402
from engine.model import cpu_attention  # noqa: E402

PARTS = ("qkv", "attention", "o", "gate_up", "down", "head")


def timed(fn: Callable[..., Any], part: str, totals: dict[str, float]) -> Callable[..., Any]:
    """``fn`` with its wall time added to ``totals[part]`` on every call."""
    def f(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        totals[part] += time.perf_counter() - t0
        return out

    return f


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="coder")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1])
    parser.add_argument("--context", type=int, default=200, help="tokens cached before the passes (default: 200)")
    parser.add_argument("--passes", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--draft", action="store_true", help="time the profile's draft model instead of its target")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    profile = load_profiles().get(args.profile)
    engine = load_engine(profile if args.draft else dataclasses.replace(profile, drafter="none", draft=None))
    lean = (engine.decoder.drafter.runner if args.draft else engine.decoder.target)._lean  # type: ignore[attr-defined]
    if lean is None or not lean.native_attention:
        raise SystemExit(f"{args.profile}'s target does not run the lean forward's native path here")
    from engine.quant import cpu_kernel

    print(f"{args.profile}: CPU kernel {cpu_kernel.variant()}, {len(lean.layers)} layers, {args.threads} threads")
    totals: dict[str, float] = collections.defaultdict(float)
    plain = {"layers": [(l.qkv, l.o, l.gate_up, l.down) for l in lean.layers], "head": lean.head,
             "attention": cpu_attention.attention_step}
    wrapped = {"layers": [tuple(timed(fn, part, totals) for fn, part in zip(fns, PARTS[:1] + PARTS[2:5]))
                          for fns in plain["layers"]],
               "head": timed(lean.head, "head", totals),
               "attention": timed(cpu_attention.attention_step, "attention", totals)}

    one_call = lean.native_layers  # a layer's calls made from C (engine/model/cpu_layer.py): not timed part by part

    def use(which: dict[str, Any]) -> None:
        lean.native_layers = one_call if which is plain else None
        lean.layers = [layer._replace(qkv=qkv, o=o, gate_up=gate_up, down=down)
                       for layer, (qkv, o, gate_up, down) in zip(lean.layers, which["layers"])]
        lean.head = which["head"]
        cpu_attention.attention_step = which["attention"]

    cache = lean.new_cache(4096)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        lean(torch.randint(100, 1000, (1, args.context), generator=gen), cache, 0, 1, row_exact=False)

        def one_pass(m: int) -> float:
            start = cache.get_seq_length()
            ids = torch.randint(100, 1000, (1, m), generator=gen)
            t0 = time.perf_counter()
            lean(ids, cache, start, m)
            took = time.perf_counter() - t0
            for layer in cache.layers:
                layer.crop(-m)
            return took

        for m in args.tokens:
            rows: dict[str, list[float]] = collections.defaultdict(list)
            for i in range(args.passes + 4):
                use(plain)
                untimed = one_pass(m)
                use(wrapped)
                totals.clear()
                whole = one_pass(m)
                if i < 4:
                    continue
                rows["pass, untimed"].append(untimed)
                rows["pass, timed"].append(whole)
                for part in PARTS:
                    rows[part].append(totals[part])
                rows["glue"].append(whole - sum(totals.values()))
            use(plain)
            print(f"M={m}: medians of {args.passes} passes (ms)")
            for name, v in rows.items():
                print(f"  {name:<14} {statistics.median(v) * 1e3:8.2f}")
    engine.close()


if __name__ == "__main__":
    main()
