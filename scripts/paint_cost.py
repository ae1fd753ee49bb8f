"""What the app's painting costs the engine, measured inside one reply: paints on and off by turns.

The real app runs in a tmux pane (speculation off with F5) and writes replies to a long
prompt. Within each reply, time is cut into windows of ``--window`` seconds from the reply's
start; in every other window the app holds its paints back (the rounds wait and are painted
when the next window opens), and in the others it paints as it always does. Each round the
engine sends carries its own token count and time (``ReplyStats.tokens``, ``elapsed_s``), so
the engine's speed in every window is read from the engine's clock, leaving out each window's
first ``--margin`` seconds (the held rounds are painted just after it, inside the window). A painted window's speed
is divided by the mean of the two unpainted windows beside it: the machine's drift over
seconds, which moves whole replies by ±20% here, mostly cancels.

    PYTHONPATH=$PWD .venv/bin/python scripts/paint_cost.py --replies 12

Prints each reply's ratios and their median: the engine's speed while the app paints, as a
share of its speed while it does not. The hook that holds paints back is put into the app's
process only (a ``sitecustomize`` on its ``PYTHONPATH`` that the engine's child process
skips); nothing in the app is changed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_speed import ESC_PROMPT, ROOT, Pane  # noqa: E402  (a script beside this one)

HOOK = '''
import json, os, time
_window = float(os.environ.pop("PAINT_COST_WINDOW_S", "0") or 0)  # popped: the engine's child skips this
_log_path = os.environ.pop("PAINT_COST_LOG", "")
_margin = float(os.environ.pop("PAINT_COST_MARGIN_S", "0") or 0)
if _window and _log_path:
    from app.ui import messages, pacing, requests
    requests.generation_params.__defaults__ = (int(os.environ.pop("PAINT_COST_MAX_NEW_TOKENS", "512")),)
    _log = open(_log_path, "a", buffering=1)
    _state = {"t0": None}
    _start, _wait, _take = pacing.PaintPacer.start, pacing.PaintPacer.wait, messages.Outbox.take

    def start(self):
        _start(self)
        _state["t0"] = time.monotonic()
        _log.write(json.dumps({"reply": _state["t0"]}) + "\\n")

    def wait(self):
        t0 = _state["t0"]
        if t0 is not None:
            into = time.monotonic() - t0
            k = int(into / _window)
            if k % 2 == 1:  # a window without paints: the next paint opens the next window
                return (k + 1) * _window + _margin - into + 0.001
            if k and into - k * _window < _margin:  # the held rounds are painted past the margin, inside the window
                return k * _window + _margin - into + 0.001
        return _wait(self)

    def take(self):
        events = _take(self)
        rounds = [(e.stats.tokens, e.stats.elapsed_s) for e in events if e.stats is not None]
        if rounds:
            _log.write(json.dumps({"rounds": rounds}) + "\\n")
        return events

    pacing.PaintPacer.start, pacing.PaintPacer.wait, messages.Outbox.take = start, wait, take

    _lend = os.environ.pop("PAINT_COST_LEND_S", "")
    if _lend:  # the app's own setting: how long the engine lends a core for each paint (0: never)
        pacing.PAINT_YIELD_S = float(_lend)
'''


def window_speeds(rounds: list[tuple[int, float]], window: float, margin: float) -> dict[int, float]:
    """Tokens a second in each window ``k`` (engine time ``[k·window + margin, (k+1)·window]``)."""
    by_window: dict[int, list[tuple[int, float]]] = {}
    for tokens, elapsed in rounds:
        k = int(elapsed // window)
        if elapsed - k * window >= margin:
            by_window.setdefault(k, []).append((tokens, elapsed))
    speeds = {}
    for k, points in by_window.items():
        (t0, e0), (t1, e1) = min(points, key=lambda p: p[1]), max(points, key=lambda p: p[1])
        if e1 - e0 >= (window - margin) / 2:
            speeds[k] = (t1 - t0) / (e1 - e0)
    return speeds


def ratios(speeds: dict[int, float]) -> list[float]:
    """Each painted window (even ``k`` ≥ 2) over the mean of the unpainted ones beside it."""
    return [speeds[k] / ((speeds[k - 1] + speeds[k + 1]) / 2)
            for k in sorted(speeds) if k >= 2 and k % 2 == 0 and k - 1 in speeds and k + 1 in speeds]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="pocket")
    parser.add_argument("--prompt", default=ESC_PROMPT)
    parser.add_argument("--replies", type=int, default=12)
    parser.add_argument("--window", type=float, default=0.5, help="seconds a window lasts (default 0.5)")
    parser.add_argument("--margin", type=float, default=0.1,
                        help="seconds at each window's start left out (the change of state; default 0.1)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="a reply's length (the app's: 512)")
    parser.add_argument("--lend-s", type=float, default=None,
                        help="the app's PAINT_YIELD_S: how long the engine lends a core for each paint "
                             "(0: no core lent; default: as the app is)")
    parser.add_argument("--width", type=int, default=120)
    parser.add_argument("--height", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="paint-cost-") as tmp:
        hook_dir, log = Path(tmp) / "hook", Path(tmp) / "rounds.jsonl"
        hook_dir.mkdir()
        (hook_dir / "sitecustomize.py").write_text(HOOK)
        env = {**os.environ, "PAINT_COST_WINDOW_S": str(args.window), "PAINT_COST_LOG": str(log),
               "PAINT_COST_MARGIN_S": str(args.margin), "PAINT_COST_LEND_S": "" if args.lend_s is None else str(args.lend_s),
               "PAINT_COST_MAX_NEW_TOKENS": str(args.max_new_tokens)}
        pane = Pane(Path(tmp) / "data", env, args.profile, args.width, args.height, ROOT, str(hook_dir))
        try:
            pane.wait_ready(args.timeout)
            time.sleep(1.0)
            pane.keys("F5")
            pane.wait_for("Speculation off", 30)
            for n in range(1, args.replies + 1):
                pane.keys("C-n")
                time.sleep(0.5)
                pane.keys(args.prompt, literal=True)
                pane.keys("Enter")
                pane.wait_replies(n, args.timeout)
                time.sleep(2.0)  # the final render and collection stay out of the next reply
        finally:
            pane.close()
        replies: list[list[tuple[int, float]]] = []
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if "reply" in entry:
                replies.append([])
            elif replies:
                replies[-1].extend((int(t), float(e)) for t, e in entry["rounds"])
    every: list[float] = []
    for i, rounds in enumerate(replies, 1):
        got = ratios(window_speeds(rounds, args.window, args.margin))
        every.extend(got)
        tokens = rounds[-1][0] if rounds else 0
        print(f"reply {i}: {tokens} tokens, painted ÷ unpainted " + " ".join(f"{r:.3f}" for r in got), flush=True)
    if every:
        print(f"median painted ÷ unpainted {statistics.median(every):.3f} over {len(every)} windows "
              f"({sum(r < 1 for r in every)} below 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
