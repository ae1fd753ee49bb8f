"""What the default profile's drafter gives on ordinary chat prompts in the app, as the app shows it.

Runs the real app in tmux (``--profile``, default pocket), sends the bench's chat prompts
and a few more ordinary ones one after the other in one chat, and prints each reply's
saved figures: tokens, tok/s, the speedup with its standard error (or why there is none),
the modes it ran in and why speculation was off, if it was.

    PYTHONPATH=$PWD .venv/bin/python scripts/app_chat_speedup.py
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_speed import ROOT, Pane  # noqa: E402

PROMPTS = [
    "Explain why there are two high tides a day, in simple terms, for a curious twelve-year-old.",
    "I keep waking up at 4 a.m. and can't fall asleep again. What are some practical things I could try?",
    "What should I pack for a three-day hiking trip in autumn?",
    "Give me three ideas for a birthday dinner at home.",
    "How do I politely decline a meeting invitation from a colleague?",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="pocket")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        env.setdefault("SPECCHAT_STATE_DIR", str(Path(tmp) / "state"))
        pane = Pane(Path(tmp) / "app", env, args.profile, 160, 48)
        try:
            pane.wait_for("ready", args.timeout)
            for i, prompt in enumerate(PROMPTS, start=1):
                time.sleep(1.0)
                pane.keys(prompt, literal=True)
                pane.keys("Enter")
                s = pane.wait_replies(i, args.timeout)[-1]
                speedup = (f"{s['speedup']:.2f}× ± {s.get('speedup_se') or 0:.2f}" if s.get("speedup") is not None
                           else s.get("speedup_note") or "none")
                print(f"{i}. {s['tokens']} tokens · {s['tokens_per_s']:.1f} tok/s · speedup {speedup} · "
                      f"modes {s.get('mode_tokens')} · accepted {s.get('alpha')} · τ {s.get('tau')} · "
                      f"off: {s.get('speculation_off_reason')} {s.get('speculation_off_detail') or ''}", flush=True)
            screen = pane.screen()
            print("notices on screen mentioning speculation:", "switched off" in screen or "back on" in screen)
        finally:
            pane.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
