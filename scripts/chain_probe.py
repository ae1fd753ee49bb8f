"""Chained against unchained speculation on one engine, alternating (issue 35; docs/gpu.md).

    python scripts/chain_probe.py --out DIR [--device cuda] [--rounds 5] [--profile pair-bf16]

Builds gpu_check.py's random pair, loads ``--profile`` once, and times greedy replies of 128 tokens
with ``decoder.chain`` = each of ``--chains`` in turn (0: plain decoding) after warm-ups, printing per reply: tok/s, the Ks the
schedule chose, rounds, and the passes captured during it (a capture costs 10-100 ms, as long as
a whole reply here: a figure with one is not a speed). Then one reply of each under cProfile
(host time by function), and the medians."""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", default="pair-bf16")
    ap.add_argument("--gguf", type=Path, default=None, help="pocket's GGUF, for the pocket-* profiles")
    ap.add_argument("--chains", default="4,1,0")
    ap.add_argument("--profiles", action="store_true", help="one reply of each under cProfile")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SPECCHAT_CACHE_DIR", str(a.out / "specchat-cache"))
    import gpu_check
    import gpu_speed
    from engine.config.models_file import load_profiles
    from engine.load.loader import load_engine

    work = a.out / "models"
    pair = gpu_check.build_pair(work / "pair", hidden=1024 if a.device == "cuda" else 256, draft_layers=2,
                                extra_layers=6)
    models = gpu_check.models_file(work / "gpu.toml", pair, (work / "s", work / "b"), a.gguf, a.device)
    engine = load_engine(load_profiles(models).get(a.profile))
    device = torch.device(a.device)
    prompt = gpu_speed.prompt_ids(engine, "Write a Python function that merges two sorted lists, then explain it.")
    runners = [engine.decoder.target, *([engine.decoder.drafter.runner] if hasattr(engine.decoder.drafter, "runner") else [])]
    chains = [int(c) for c in a.chains.split(",")]

    def reply(chain: int) -> dict[str, object]:
        engine.set_speculation(chain > 0)  # 0: plain decoding (bursts) on the same engine
        engine.decoder.chain = max(chain, 1)
        before = sum(r.capture.captures for r in runners)
        events: list[object] = []
        timed = gpu_speed.specchat_reply(engine, prompt, device, 128, events=events)
        ks = [e.stats.k for e in events]  # type: ignore[attr-defined]
        stats = events[-1].stats  # type: ignore[attr-defined]
        rate, ids = gpu_speed.decode_rate(timed, prompt_s), timed.ids
        return {"chain": chain, "tok_s": round(rate, 1), "after_first": round(timed.after_first, 1),
                "captured": sum(r.capture.captures for r in runners) - before,
                "ks": sorted(set(ks)), "rounds": stats.rounds, "tau": round(stats.tau, 2), "mode": stats.mode,
                "events": len(ks), "ids": ids}

    engine.set_speculation(False)
    prompt_s = gpu_speed.prompt_pass_s(engine, prompt, device)
    plain_ids = reply(0)["ids"]  # the reference: plain decoding (bursts) on the same engine

    def shown(row: dict[str, object]) -> dict[str, object]:
        ids = row.pop("ids")
        row["same_as_plain"] = ids == plain_ids
        if ids != plain_ids:
            row["first_difference"] = next((i for i, (x, y) in enumerate(zip(ids, plain_ids)) if x != y), None)
        return row

    for _ in range(3):
        for c in chains:
            print("warm-up", shown(reply(c)), flush=True)
    rates: dict[int, list[float]] = {c: [] for c in chains}
    for _ in range(a.rounds):
        for c in chains:
            row = shown(reply(c))
            rates[c].append(row["tok_s"])  # type: ignore[arg-type]
            print(row, flush=True)
    for c in chains if a.profiles else ():
        prof = cProfile.Profile()
        prof.enable()
        row = shown(reply(c))
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        print(f"--- cProfile, chain {c}: {row}\n" + "\n".join(text.getvalue().splitlines()[6:30]), flush=True)
    for c in chains:
        print(f"chain {c}: median {statistics.median(rates[c])} tok/s over {rates[c]}", flush=True)


if __name__ == "__main__":
    main()
