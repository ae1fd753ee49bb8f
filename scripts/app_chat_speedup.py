"""What the default profile's drafter gives on ordinary prompts in the app, as the app shows it, and whether it is true.

Runs the real app twice in tmux (``--profile``, default pocket): one with speculation as
it starts, one switched to plain with F5. Each prompt (the bench's chat and code prompts,
then a few more ordinary ones) goes to both, in a new chat each, alternating, and each
reply's saved figures are printed: tokens, tok/s, the HUD's speedup with its standard error
(or why there is none), the modes it ran in and why speculation was off, if it was. Then
the check: the reply's tok/s over the plain app's on the same prompt (greedy: the same
tokens), against the HUD's figure.

    PYTHONPATH=$PWD .venv/bin/python scripts/app_chat_speedup.py
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import tomllib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_speed import ROOT, Pane  # noqa: E402


def bench_prompts(classes: tuple[str, ...] = ("chat", "code")) -> list[str]:
    """The last user message of each of the bench's prompts of ``classes``."""
    with open(ROOT / "app" / "bench" / "prompts.toml", "rb") as f:
        shipped = tomllib.load(f)["prompt"]
    return [p["messages"][-1]["content"] for p in shipped if p["class"] in classes]


EXTRA = [
    "What should I pack for a three-day hiking trip in autumn?",
    "Give me three ideas for a birthday dinner at home.",
    "How do I politely decline a meeting invitation from a colleague?",
]


def send(pane: Pane, prompt: str) -> None:
    """A new chat, then ``prompt`` as one bracketed paste (it may hold line breaks), then Enter."""
    pane.keys("C-n")
    time.sleep(0.5)
    subprocess.run(["tmux", "-S", str(pane.socket), "set-buffer", "--", prompt], check=True)
    subprocess.run(["tmux", "-S", str(pane.socket), "paste-buffer", "-p", "-t", pane.session], check=True)
    time.sleep(0.3)
    pane.keys("Enter")


def line(s: dict) -> str:
    speedup = (f"{s['speedup']:.2f}× ± {s.get('speedup_se') or 0:.2f}" if s.get("speedup") is not None
               else s.get("speedup_note") or "none")
    return (f"{s['tokens']} tokens · {s['tokens_per_s']:.1f} tok/s · speedup {speedup} · modes {s.get('mode_tokens')} · "
            f"α {s.get('alpha')} · off: {s.get('speculation_off_reason')} {s.get('speculation_off_detail') or ''}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="pocket")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--repeats", type=int, default=1, help="replies to each prompt in each app (medians compared)")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    prompts = bench_prompts() + EXTRA
    checks: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        env.setdefault("SPECCHAT_STATE_DIR", str(Path(tmp) / "state"))
        spec = Pane(Path(tmp) / "spec", env, args.profile, 120, 40)
        plain = Pane(Path(tmp) / "plain", env, args.profile, 120, 40)
        try:
            spec.wait_ready(args.timeout)
            plain.wait_ready(args.timeout)
            time.sleep(1.0)
            plain.keys("F5")
            plain.wait_for("Speculation off", 30)
            done = 0
            for i, prompt in enumerate(prompts, start=1):
                ours, theirs = [], []
                for _ in range(args.repeats):  # alternating: the spec app, then the plain one
                    done += 1
                    send(spec, prompt)
                    ours.append(spec.wait_replies(done, args.timeout)[-1])
                    send(plain, prompt)
                    theirs.append(plain.wait_replies(done, args.timeout)[-1])
                for s in ours:
                    print(f"{i}. app:   {line(s)}", flush=True)
                plain_tps = statistics.median(p["tokens_per_s"] for p in theirs)
                print(f"   plain: {theirs[0]['tokens']} tokens · {plain_tps:.1f} tok/s "
                      f"(median of {[round(p['tokens_per_s'], 1) for p in theirs]})", flush=True)
                for s in ours:  # each reply's HUD figure against its own tok/s over the plain app's median
                    if s.get("speedup") is not None and s["tokens"] == theirs[0]["tokens"]:
                        measured = s["tokens_per_s"] / plain_tps
                        checks.append(s["speedup"] / measured)
                        print(f"   HUD {s['speedup']:.2f}× against {measured:.2f}× measured: {s['speedup'] / measured:.2f}",
                              flush=True)
            screen = spec.screen()
            print("notices on screen mentioning speculation:", "switched off" in screen or "back on" in screen)
            if checks:
                within = sum(1 for c in checks if abs(c - 1) <= 0.1)
                print(f"HUD ÷ measured over {len(checks)} replies: median {statistics.median(checks):.2f}, "
                      f"range {min(checks):.2f}-{max(checks):.2f}, {within} within 10%")
        finally:
            spec.close()
            plain.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
