"""Would a token tree pay for suffix drafting here? An upper-bound estimate (issue 22, item 2).

SuffixDecoding verifies a small tree of candidate continuations in one pass instead of one
chain. Whether that pays on this CPU depends on two measured things:

1. how many more tokens a tree gets accepted per pass than the chain the drafter proposes
   now, replayed against the target's own greedy replies on the bench's prompt set (each
   prompt with the earlier prompts' exchanges as history, as ``specchat bench`` runs it);
2. what a verify pass of ``n`` rows costs on the lean forward (timed here, median of reps).

The tree for a round is grown best-first over every continuation the drafter's evidence
supports (this chat's text and the earlier exchanges, one suffix index over both): it
holds the drafter's chain, and the node with the highest product of shares is added next,
``--extra`` nodes beyond the chain (a node already on the chain's path adds nothing).
A pass over a tree of ``n`` nodes is priced as a chain pass of ``n + 1`` rows. That leaves
out what a tree would add (its mask, compacting the accepted branch's KV rows), so the
tree's figure is an upper bound on what it could buy.

    .venv/bin/python scripts/tree_estimate.py --threads 2 --max-new-tokens 128 --json bench-out/tree.json
"""
from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.bench.inputs import load_prompt_set, render  # noqa: E402
from app.models_cli import load_for  # noqa: E402
from engine.config.models_file import load_profiles  # noqa: E402
from engine.decode.decoder import GenerationParams, SpecDecoder  # noqa: E402
from engine.decode.runner import ModelRunner  # noqa: E402
from engine.decode.suffix import MIN_MATCH, SuffixDrafter, SuffixIndex  # noqa: E402
from engine.events import SamplingParams  # noqa: E402


def tree(index: SuffixIndex, context: Sequence[int], extra: int, chain: Sequence[int]) -> dict[tuple[int, ...], float]:
    """Paths (token tuples) of a tree: the drafter's ``chain`` plus up to ``extra`` nodes
    grown best-first over ``index``'s continuations of ``context``'s longest match."""
    kept: dict[tuple[int, ...], float] = {}
    for i in range(1, len(chain) + 1):
        kept[tuple(chain[:i])] = 1.0
    nodes = len(kept) + extra
    m, lo, hi = index.longest_match(context)
    if m < MIN_MATCH:
        return kept
    n = len(index.corpus)
    heap: list[tuple[float, tuple[int, ...], int, int]] = [(-1.0, (), lo, hi)]
    while heap and len(kept) < nodes:
        neg, path, a, b = heapq.heappop(heap)
        if path:
            kept.setdefault(path, -neg)
        if len(path) >= m:  # a path is at most as long as the match behind it
            continue
        starts = index.order[a:b] + m + len(path)
        nxt = np.where(starts < n, index.corpus[np.minimum(starts, n - 1)], -1)
        real = nxt[nxt >= 0]
        if real.size == 0:
            continue
        values, counts = np.unique(real, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist()):
            left = a + int(np.searchsorted(nxt, v, "left"))
            right = a + int(np.searchsorted(nxt, v, "right"))
            heapq.heappush(heap, (neg * c / real.size, (*path, v), left, right))
    return kept


def accepted(paths: dict[tuple[int, ...], float], truth: Sequence[int]) -> int:
    """How many of ``truth``'s first tokens a tree holds as one path from its root."""
    a = 0
    while a < len(truth) and tuple(truth[:a + 1]) in paths:
        a += 1
    return a


def pass_costs(target: torch.nn.Module, device, context: Sequence[int], widest: int, reps: int) -> list[float]:
    """Seconds for one verify pass of ``n`` rows after ``context`` (median of ``reps``), n = 1..widest."""
    runner = ModelRunner(target, device)
    runner.prefill(list(context))
    base = len(runner)
    costs = []
    for n in range(1, widest + 1):
        times = []
        for _ in range(reps):
            runner.truncate(base)
            start = time.perf_counter()
            runner.forward(list(context[-n:]), logits_to_keep=n)
            times.append(time.perf_counter() - start)
        costs.append(statistics.median(times))
    runner.release()
    return costs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="pocket-suffix")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--extra", default="4,8,16", help="nodes a tree adds to the chain, for each size priced")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    profile = load_profiles().get(args.profile)
    engine = load_for(profile, "spec", None)
    target, _ = engine.models()
    k = profile.k_max
    sizes = [int(s) for s in args.extra.split(",")]
    prompts = render(load_prompt_set(), engine.prompt_ids)
    exchanges: list[list[int]] = []
    rows = []
    with torch.inference_mode():
        for prompt in prompts:
            plain = SpecDecoder(target, engine.device, None)
            params = GenerationParams(max_new_tokens=args.max_new_tokens, stop_token_ids=tuple(engine.stop_ids))
            reply = [t for e in plain.generate(list(prompt.ids), params) for t in e.token_ids]
            drafter = SuffixDrafter(exchanges)
            ids = list(prompt.ids)
            drafter.prefill(ids)
            sim = {"chain": [0, 0, []]}  # per method: position, passes, widths
            sim.update({f"tree+{s}": [0, 0, []] for s in sizes})
            for name, state in sim.items():
                while state[0] < len(reply):
                    context = ids + reply[:state[0]]
                    truth = reply[state[0]:]
                    chain = list(drafter.propose(context, k, SamplingParams(), None).tokens)
                    if name == "chain":
                        a, width = _prefix(chain, truth), len(chain)
                    else:
                        # This chat up to its last token: indexing that token too would
                        # only find the context itself, which has no continuation.
                        index = SuffixIndex([*exchanges, context[:-1]])
                        paths = tree(index, context, int(name[5:]), chain)
                        a, width = accepted(paths, truth), len(paths)
                    state[0] += min(a + 1, len(reply) - state[0])
                    state[1] += 1
                    state[2].append(width)
            rows.append({"prompt": prompt.name, "class": prompt.prompt_class, "tokens": len(reply),
                         **{n: {"passes": s[1], "widths": s[2]} for n, s in sim.items()}})
            exchanges.append([*prompt.ids, *reply])
            print(f"{prompt.prompt_class}/{prompt.name}: " + ", ".join(
                f"{n} {len(reply) / s[1]:.2f} tok/pass" for n, s in sim.items()), file=sys.stderr)
        widest = max(max(max(r[n]["widths"] or [0]) for n in r if isinstance(r[n], dict)) for r in rows) + 1
        costs = pass_costs(target, engine.device, prompts[0].ids, widest, args.reps)
    engine.close()
    report = {"profile": args.profile, "k_max": k, "threads": args.threads, "pass_ms": [c * 1e3 for c in costs],
              "prompts": rows, "by_method": {}}
    for name in ["chain", *[f"tree+{s}" for s in sizes]]:
        tokens = sum(r["tokens"] for r in rows)
        passes = sum(r[name]["passes"] for r in rows)
        seconds = sum(costs[w] for r in rows for w in r[name]["widths"])  # w drafted rows + 1
        report["by_method"][name] = {"tau": tokens / passes, "verify_s": seconds, "tokens_per_verify_s": tokens / seconds}
    base = report["by_method"]["chain"]["tokens_per_verify_s"]
    for name, figures in report["by_method"].items():
        figures["over_chain"] = figures["tokens_per_verify_s"] / base
        print(f"{name:8} τ {figures['tau']:.2f}  {figures['tokens_per_verify_s']:.1f} tok/s of verify time  "
              f"{figures['over_chain']:.2f}× chain")
    print("pass ms by rows: " + " ".join(f"{i + 1}:{c * 1e3:.1f}" for i, c in enumerate(costs)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def _prefix(a: Sequence[int], b: Sequence[int]) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


if __name__ == "__main__":
    raise SystemExit(main())
