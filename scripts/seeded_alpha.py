"""Acceptance of the two samplers: Gumbel coupling (seeded) and rejection sampling (unseeded).

    .venv/bin/python scripts/seeded_alpha.py [--profile pocket-selfdraft] [--k 4]
        [--temperatures 0.7 1.0] [--new-tokens 64] [--repeats 3] [--check-plain] [--json OUT]

For every temperature, each shipped bench prompt is answered ``--repeats``
times with a fixed K by the profile's model draft, once per sampler:

* ``coupled``: ``--seed`` set (seeds 1, 2, ... per repeat): Gumbel-max
  coupling, drafter-invariant (engine/decode/verify.py);
* ``rejection``: no seed: rejection sampling (Leviathan et al.).

Per sampler it prints the acceptance rate (accepted ÷ proposed), the per-token
alpha (accepted ÷ draft positions reached, the alpha of
tau = (1 - alpha^(K+1)) / (1 - alpha)), and tau (tokens ÷ target passes).
Coupling accepts a draft token with probability at least (1 - TV) / (1 + TV)
where rejection sampling reaches 1 - TV, so its alpha is expected a little lower.

``--check-plain`` also loads the target alone and checks that every coupled
reply has the ids of plain decoding with the same seed (reporting the first
differing position, if any).

Timing-free: it can run on a busy machine. Loads through ``app.cli.load_for``,
like ``specchat generate``.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.bench.inputs import load_prompt_set  # noqa: E402
from app.models_cli import load_for  # noqa: E402
from engine.events import ChatEvent, ChatMessage, GenerationParams, SamplingParams  # noqa: E402
from engine.config.models_file import load_profiles  # noqa: E402


def counts(events: Iterable[ChatEvent]) -> tuple[list[int], dict[str, int]]:
    """Token ids of a reply and its draft counts, round by round.

    A round that proposed ``n`` tokens and had ``a`` accepted reached
    ``n`` positions if all were accepted, else ``a + 1`` (the first rejection).
    """
    ids: list[int] = []
    total = {"proposed": 0, "accepted": 0, "reached": 0, "tokens": 0, "passes": 0}
    before_p = before_a = 0
    last = None
    for event in events:
        ids += event.token_ids
        s = event.stats
        proposed, accepted = s.proposed - before_p, s.accepted - before_a
        before_p, before_a = s.proposed, s.accepted
        total["proposed"] += proposed
        total["accepted"] += accepted
        total["reached"] += proposed if accepted == proposed else accepted + 1
        last = s
    if last is not None:
        total["tokens"], total["passes"] = last.tokens, last.target_passes
    return ids, total


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="pocket-selfdraft")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=0, help="use only the first N prompts (0: all)")
    parser.add_argument("--check-plain", action="store_true", help="coupled replies must equal seeded plain decoding")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()

    profile = load_profiles().get(args.profile)
    engine = load_for(profile, "spec")
    plain_engine = load_for(profile, "plain") if args.check_plain else None
    prompts = load_prompt_set()[: args.prompts or None]
    rows: list[dict[str, Any]] = []
    mismatches: list[str] = []
    try:
        for temperature in args.temperatures:
            for sampler in ("coupled", "rejection"):
                total = {"proposed": 0, "accepted": 0, "reached": 0, "tokens": 0, "passes": 0}
                for spec in prompts:
                    messages: list[ChatMessage] = list(spec.messages)
                    if profile.system_prompt and messages[0].role != "system":
                        messages.insert(0, ChatMessage("system", profile.system_prompt))
                    for repeat in range(args.repeats):
                        seed = repeat + 1 if sampler == "coupled" else None
                        sampling = SamplingParams(temperature=temperature, top_p=profile.top_p, top_k=profile.top_k, seed=seed)
                        params = GenerationParams(sampling=sampling, max_new_tokens=args.new_tokens, k=args.k)
                        ids, reply = counts(engine.chat(messages, params))
                        for key in total:
                            total[key] += reply[key]
                        if plain_engine is not None and seed is not None:
                            plain_ids = [t for e in plain_engine.chat(messages, params) for t in e.token_ids]
                            at = first_difference(ids, plain_ids)
                            if at is not None:
                                mismatches.append(f"T={temperature} {spec.name} seed {seed}: differs from plain at token {at}")
                row = {
                    "temperature": temperature, "sampler": sampler, "k": args.k, **total,
                    "acceptance_rate": total["accepted"] / total["proposed"] if total["proposed"] else None,
                    "alpha_per_token": total["accepted"] / total["reached"] if total["reached"] else None,
                    "tau": total["tokens"] / total["passes"] if total["passes"] else None,
                }
                rows.append(row)
                print(
                    f"T={temperature:<4} {sampler:<9} K={args.k}  acceptance rate {row['acceptance_rate']:.3f}  "
                    f"per-token alpha {row['alpha_per_token']:.3f}  tau {row['tau']:.2f}  "
                    f"({total['accepted']}/{total['proposed']} accepted, {total['tokens']} tokens)",
                    flush=True,
                )
    finally:
        engine.close()
        if plain_engine is not None:
            plain_engine.close()
    if args.check_plain:
        print("coupled replies identical to seeded plain decoding" if not mismatches else "\n".join(mismatches))
    if args.json:
        args.json.write_text(json.dumps({"profile": profile.name, "rows": rows, "mismatches": mismatches}, indent=2))
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
