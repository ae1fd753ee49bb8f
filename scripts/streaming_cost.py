"""The cost of streaming: the app's tok/s against headless ``specchat generate`` on the same prompt.

Runs, in alternation, ``specchat generate --json`` and the real app in a tmux
pane (a real terminal, Textual drawing every paint), with the same profile,
prompt and reply length. The app's figure is the reply's own ``tokens_per_s``
as the engine measured it inside the app, read from the saved history (the
same number the HUD and the reply footer show). Prints each run and the
median ratio app / headless; the issue asks for >= 0.95.

    .venv/bin/python scripts/streaming_cost.py --profile pocket --repeats 5

Needs tmux. Run it on a quiet machine: every other process shifts the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = ("Write a detailed, step-by-step explanation of how a hash table works, "
          "with a short Python example and its output.")


def model_args(args: argparse.Namespace) -> list[str]:
    return ["--target", args.target] if args.target else ["--profile", args.profile]


def headless(args: argparse.Namespace, env: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "app.cli", "generate", args.prompt, *model_args(args), "--json",
           "--max-new-tokens", str(args.max_new_tokens)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    stats = json.loads(out)["stats"]
    return {"tokens": stats["tokens"], "tok_s": stats["tokens_per_s"]}


def in_app(args: argparse.Namespace, env: dict[str, str], data: Path) -> dict:
    """One reply in the real app in tmux; the stats of the saved reply."""
    data.mkdir(parents=True, exist_ok=True)
    socket = data / "tmux.sock"
    session = f"cost-{uuid.uuid4().hex[:6]}"
    app_env = {**env, "TERM": "xterm-256color", "SPECCHAT_DATA_DIR": str(data)}
    if args.app_threads:
        app_env["SPECCHAT_THREADS"] = str(args.app_threads)
    cli = " ".join([sys.executable, "-m", "app.cli", *model_args(args)])
    subprocess.run(["tmux", "-S", str(socket), "-f", "/dev/null", "new-session", "-d", "-s", session,
                    "-x", str(args.width), "-y", str(args.height), cli], check=True, cwd=ROOT, env=app_env)
    db = data / "history.db"
    try:
        deadline = time.monotonic() + args.timeout
        while "ready" not in _screen(socket, session):  # the "… ready" toast
            if time.monotonic() > deadline:
                raise SystemExit("the app did not load in time:\n" + _screen(socket, session))
            time.sleep(0.2)
        subprocess.run(["tmux", "-S", str(socket), "send-keys", "-t", session, "-l", args.prompt], check=True)
        subprocess.run(["tmux", "-S", str(socket), "send-keys", "-t", session, "Enter"], check=True)
        while True:
            row = _finished_reply(db)
            if row is not None:
                return row
            if time.monotonic() > deadline:
                raise SystemExit("no finished reply in time:\n" + _screen(socket, session))
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True)


def _screen(socket: Path, session: str) -> str:
    return subprocess.run(["tmux", "-S", str(socket), "capture-pane", "-p", "-t", session],
                          capture_output=True, text=True).stdout


def _finished_reply(db: Path) -> dict | None:
    if not db.exists():
        return None
    try:
        conn = sqlite3.connect(db, timeout=1)
        try:
            row = conn.execute("SELECT stats, finish_reason FROM messages WHERE role = 'assistant' "
                               "AND finish_reason IS NOT NULL ORDER BY id DESC LIMIT 1").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    if row is None or not row[0]:
        return None
    stats = json.loads(row[0])
    return {"tokens": stats["tokens"], "tok_s": stats["tokens_per_s"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="pocket", help="profile to compare with (default: pocket)")
    parser.add_argument("--target", help="a model source instead of a profile (as specchat --target)")
    parser.add_argument("--prompt", default=PROMPT, help="the prompt both answer (default: a long explanation)")
    parser.add_argument("--max-new-tokens", type=int, default=512,
                        help="headless reply length; the app's limit is 512 (default: 512)")
    parser.add_argument("--repeats", type=int, default=5, help="pairs of runs, in alternation (default: 5)")
    parser.add_argument("--threads", type=int, help="torch threads for headless generate (default: torch's, one per core)")
    parser.add_argument("--app-threads", type=int,
                        help="the app's engine threads, as SPECCHAT_THREADS (default: the app's, every core but one)")
    parser.add_argument("--width", type=int, default=120, help="terminal columns for the app (default: 120)")
    parser.add_argument("--height", type=int, default=40, help="terminal rows for the app (default: 40)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per app run (default: 600)")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("needs tmux")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        env.setdefault("SPECCHAT_STATE_DIR", str(Path(tmp) / "state"))
        for i in range(args.repeats):
            h = headless(args, env)
            a = in_app(args, env, Path(tmp) / f"app-{i}")
            ratio = a["tok_s"] / h["tok_s"]
            ratios.append(ratio)
            print(f"run {i + 1}: headless {h['tok_s']:.1f} tok/s ({h['tokens']} tokens) · "
                  f"app {a['tok_s']:.1f} tok/s ({a['tokens']} tokens) · app/headless {ratio:.3f}", flush=True)
    print(f"median app/headless: {statistics.median(ratios):.3f} over {len(ratios)} pairs "
          f"(the issue asks for >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
