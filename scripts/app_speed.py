"""The app's decode speed against headless ``specchat generate --mode plain``, and how fast Esc stops a reply.

For each configuration given (``--config NAME:ENV=VALUE,ENV=VALUE``; e.g.
``old:SPECCHAT_THREADS=1`` and ``new:``), in alternation with a headless
``generate --mode plain --json`` run on the same prompt:

* **speed**: the real app in a tmux pane (a real terminal, Textual painting),
  speculation switched off with F5 before the prompt, one 512-token reply; its
  ``tokens_per_s`` as the engine measured it (read from the saved history) over the
  mean of the headless runs just before and just after it.
* **echo**: a second prompt in the same app; while its reply streams, two letters are
  typed into the prompt box and the pane is read every 5 ms until they show.
* **Esc**: then Esc, and the pane is read every 5 ms until the reply's footer says "■ stopped".

    PYTHONPATH=$PWD .venv/bin/python scripts/app_speed.py --repeats 3 --config old:SPECCHAT_THREADS=1 --config new:

Prints each run and the medians. Needs tmux. Every other process on the machine shifts the figures.

``--interleaved N`` measures the speed alone, with less of the machine's drift in it: an app
per configuration (speculation off) and one headless engine (plain, loaded once in a process
of its own, as ``generate`` loads it) stay open, and N times, in an order that rotates each
round, each writes the reply to the prompt in a new chat while the others wait idle; a ratio
is an app's tok/s over the headless engine's from the same round. The idle apps' CPU while the
headless one decodes is printed too (it is taken from the headless engine, in the apps' favour).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
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
PROMPT = "Explain in two short paragraphs what a hash table is and why lookups in it are fast."
ESC_PROMPT = "Write a long story about a lighthouse keeper and the sea, in ten chapters."


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of ``values`` at ``level`` (or the widest one
    ``len(values)`` allow: their range): order statistics x(k) and x(n-k+1), with k the largest
    such that a Binomial(n, 1/2) falls below k with probability at most (1 - level) / 2."""
    ordered, n = sorted(values), len(values)
    tail, k = 0.0, 0
    while k < n // 2 and tail + math.comb(n, k) / 2**n <= (1 - level) / 2:
        tail += math.comb(n, k) / 2**n
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def headless_plain(args: argparse.Namespace, env: dict[str, str]) -> float:
    cmd = [sys.executable, "-m", "app.cli", "generate", args.prompt, "--profile", args.profile, "--json",
           "--mode", "plain", "--max-new-tokens", str(args.max_new_tokens)]
    extra = dict(a.split("=", 1) for a in args.headless_env.split(",") if a)
    out = subprocess.run(cmd, cwd=ROOT, env={**env, **extra}, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)["stats"]["tokens_per_s"])


class Pane:
    def __init__(self, data: Path, env: dict[str, str], profile: str, width: int, height: int,
                 root: Path = ROOT, path_first: str = "") -> None:
        data.mkdir(parents=True, exist_ok=True)
        self.socket, self.session, self.db = data / "tmux.sock", f"speed-{uuid.uuid4().hex[:6]}", data / "history.db"
        app_env = {**env, "TERM": "xterm-256color", "SPECCHAT_DATA_DIR": str(data),
                   "PYTHONPATH": os.pathsep.join(filter(None, [path_first, str(root)]))}
        cli = " ".join([sys.executable, "-m", "app.cli", "--profile", profile])
        subprocess.run(["tmux", "-S", str(self.socket), "-f", "/dev/null", "new-session", "-d", "-s", self.session,
                        "-x", str(width), "-y", str(height), cli], check=True, cwd=root, env=app_env)

    def screen(self) -> str:
        return subprocess.run(["tmux", "-S", str(self.socket), "capture-pane", "-p", "-t", self.session],
                              capture_output=True, text=True).stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        subprocess.run(["tmux", "-S", str(self.socket), "send-keys", "-t", self.session,
                        *(["-l"] if literal else []), *keys], check=True)

    def wait_for(self, text: str, timeout: float, every: float = 0.2) -> float:
        deadline = time.monotonic() + timeout
        while text not in self.screen():
            if time.monotonic() > deadline:
                raise SystemExit(f"no {text!r} on screen in time:\n" + self.screen())
            time.sleep(every)
        return time.monotonic()

    def wait_ready(self, timeout: float) -> float:
        """Until the load notice ("pocket ready.") shows; the prompt box's placeholder says
        "sent when the model is ready" all through the load."""
        deadline = time.monotonic() + timeout
        while not re.search(r"\bready[.:]|Ask something ·", self.screen()):
            if time.monotonic() > deadline:
                raise SystemExit("the model never got ready:\n" + self.screen())
            time.sleep(0.2)
        return time.monotonic()

    FINISHED = ("FROM messages WHERE role = 'assistant' AND finish_reason IS NOT NULL "
                "AND stats IS NOT NULL AND stats != ''")
    """The finished replies saved with their stats."""

    def _query(self, sql: str) -> list[tuple]:
        """``sql``'s rows from the app's history ([] before it exists or while it cannot be read)."""
        if not self.db.exists():
            return []
        try:
            conn = sqlite3.connect(self.db, timeout=1)
            try:
                return conn.execute(sql).fetchall()
            finally:
                conn.close()
        except sqlite3.Error:
            return []

    def replies(self) -> list[dict]:
        return [{**json.loads(s), "finish_reason": f}
                for s, f in self._query(f"SELECT stats, finish_reason {self.FINISHED} ORDER BY id")]

    def finished(self) -> int:
        """How many :meth:`replies` there are, counted: cheap to ask while one streams."""
        rows = self._query(f"SELECT COUNT(*) {self.FINISHED}")
        return int(rows[0][0]) if rows else 0

    def wait_replies(self, n: int, timeout: float) -> list[dict]:
        """Every finished reply's stats, once there are ``n``. While the reply streams only
        :meth:`finished` is asked, every 0.2 s: reading and parsing every reply's stats there
        took 0.9 ms of this process's CPU a time with 40 replies saved, beside the app's
        engine on the same cores (the headless engine's turns have no such neighbour)."""
        deadline = time.monotonic() + timeout
        while self.finished() < n or len(rows := self.replies()) < n:
            if time.monotonic() > deadline:
                raise SystemExit("no finished reply in time:\n" + self.screen())
            time.sleep(0.2)
        return rows

    def ui_cpu_s(self) -> dict[str, float]:
        """CPU seconds each thread of the app's own process (the UI, not the engine's child) has
        used so far: ``main`` (Textual's event loop, where painting happens) and the others by id."""
        pid = subprocess.run(["tmux", "-S", str(self.socket), "display", "-p", "-t", self.session, "#{pane_pid}"],
                             capture_output=True, text=True).stdout.strip()
        used: dict[str, float] = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            used["main" if task.name == pid else task.name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return used

    def close(self) -> None:
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], capture_output=True)


def in_app(args: argparse.Namespace, env: dict[str, str], data: Path) -> tuple[float, float, float]:
    """(tok/s of a plain reply in the app, seconds from typing to the echo, from Esc to "■ stopped")."""
    root = Path(env.get("SPECCHAT_ROOT", str(ROOT)))  # another checkout's app (a config's SPECCHAT_ROOT=...)
    pane = Pane(data, env, args.profile, args.width, args.height, root)
    try:
        pane.wait_ready(args.timeout)
        time.sleep(1.0)
        pane.keys("F5")
        pane.wait_for("Speculation off", 30)
        pane.keys(args.prompt, literal=True)
        pane.keys("Enter")
        time.sleep(0.5)  # the UI's CPU from 0.5 s to 2.0 s into the reply: streaming, not its start or end
        cpu = pane.ui_cpu_s()
        time.sleep(1.5)
        after, streaming = pane.ui_cpu_s(), "generating" in pane.screen()
        reply = pane.wait_replies(1, args.timeout)[-1]
        speed = float(reply["tokens_per_s"])
        by_thread = sorted(((after[t] - cpu.get(t, 0.0)) / 1.5, t) for t in after)
        ui_share = sum(share for share, _ in by_thread)
        busiest = ", ".join(f"{t} {share:.1%}" for share, t in reversed(by_thread[-4:]))
        time.sleep(1.0)
        pane.keys(ESC_PROMPT, literal=True)
        pane.keys("Enter")
        pane.wait_for("generating…", 30, every=0.05)
        time.sleep(1.0)
        typed = time.monotonic()
        pane.keys("qz", literal=True)
        echoed = pane.wait_for("qz", 30, every=0.005)
        time.sleep(0.5)
        sent = time.monotonic()
        pane.keys("Escape")
        shown = pane.wait_for("■ stopped", 30, every=0.005)
        print(f"  the UI process used {ui_share:.1%} of a core from 0.5 to 2.0 s into the reply "
              f"({'still streaming' if streaming else 'the reply had ended: not a streaming figure'}; "
              f"busiest threads: {busiest})", flush=True)
        return speed, echoed - typed, shown - sent
    finally:
        pane.close()


def headless_loop(profile_name: str, max_new_tokens: int, child: bool = False, spec_off: bool = False) -> int:
    """The headless side of ``--interleaved``: a plain engine loaded once; each line read on stdin
    is a prompt, answered with one line: its reply's tok/s as the engine measured it. ``child``:
    the app's engine instead (the profile's drafter loaded, speculation switched off, in a child
    process started as the app starts it), without the app; ``spec_off``: the profile's drafter
    loaded and speculation switched off, in this process."""
    from app.models_cli import load_for
    from engine.config.models_file import load_profiles
    from engine.events import ChatMessage, generation_params

    profile = load_profiles(None).get(profile_name)
    if child:
        from app.ui.loading import default_loader

        engine = default_loader(profile, profile.memory_budget, lambda stage, fraction: None)
        engine.set_speculation(False)
    elif spec_off:
        engine = load_for(profile, "spec")
        engine.set_speculation(False)
    else:
        engine = load_for(profile, "plain")
    params = generation_params(profile, max_new_tokens)
    print("ready", flush=True)
    for line in sys.stdin:
        system = profile.system_prompt
        messages = ([ChatMessage("system", system)] if system else []) + [ChatMessage("user", line.rstrip("\n"))]
        last = None
        for last in engine.chat(messages, params):
            pass
        assert last is not None
        print(json.dumps({"tokens_per_s": last.stats.tokens_per_s, "tokens": last.stats.tokens}), flush=True)
    engine.close()
    return 0


def interleaved(args: argparse.Namespace, env: dict[str, str], configs: list[tuple[str, dict[str, str]]],
                data: Path) -> None:
    """``--interleaved N``: one app per configuration and one headless engine, all kept loaded,
    taking turns (the order rotates each round)."""
    def loop(*extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, __file__, "--headless-loop", "--profile", args.profile,
                                 "--max-new-tokens", str(args.max_new_tokens), *extra], cwd=ROOT, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    engines = {"headless": loop()}  # by name: the headless engines taking turns with the apps
    if args.with_child:
        engines.update({"engine-alone": loop("--child"), "spec-off": loop("--spec-off")})
    panes = {name: Pane(data / name, {**env, **extra}, args.profile, args.width, args.height,
                        Path(extra.get("SPECCHAT_ROOT", str(ROOT))))  # another checkout's app
             for name, extra in configs}
    try:
        for process in engines.values():
            if process.stdout.readline().strip() != "ready":
                raise SystemExit("the headless engine did not load")
        for pane in panes.values():
            pane.wait_ready(args.timeout)
            time.sleep(1.0)
            pane.keys("F5")
            pane.wait_for("Speculation off", 30)
        turns = [*engines, *panes]
        speeds: dict[str, list[float]] = {who: [] for who in turns}
        ratios: dict[str, list[float]] = {who: [] for who in turns if who != "headless"}
        idle: list[float] = []
        done = dict.fromkeys(panes, 0)

        def app_reply(name: str) -> float:
            pane = panes[name]
            done[name] += 1
            pane.keys("C-n")
            time.sleep(0.5)
            pane.keys(args.prompt, literal=True)
            pane.keys("Enter")
            return float(pane.wait_replies(done[name], args.timeout)[-1]["tokens_per_s"])

        def head_reply(name: str) -> float:
            process = engines[name]
            before, t0 = sum(sum(p.ui_cpu_s().values()) for p in panes.values()), time.monotonic()
            process.stdin.write(args.prompt + "\n")
            process.stdin.flush()
            speed = float(json.loads(process.stdout.readline())["tokens_per_s"])
            after = sum(sum(p.ui_cpu_s().values()) for p in panes.values())
            if name == "headless":
                idle.append((after - before) / (time.monotonic() - t0))
            return speed

        for i in range(args.interleaved):
            order = turns[i % len(turns):] + turns[:i % len(turns)]
            got = {}
            for who in order:
                got[who] = head_reply(who) if who in engines else app_reply(who)
                time.sleep(args.settle)  # an app's final render and collection must not run into the next turn
            for who, speed in got.items():
                speeds[who].append(speed)
            for name in ratios:
                ratios[name].append(got[name] / got["headless"])
            print(f"round {i + 1} ({' '.join(order)}): " + " · ".join(f"{w} {v:.1f}" for w, v in got.items())
                  + " tok/s · " + " · ".join(f"{n}/headless {ratios[n][-1]:.3f}" for n in ratios), flush=True)
        for name in ratios:
            low, high = median_interval(ratios[name])
            print(f"{name}: median {name}/headless {statistics.median(ratios[name]):.3f} (95% interval of the median "
                  f"{low:.3f}-{high:.3f}) over {len(ratios[name])} rounds (median {statistics.median(speeds[name]):.1f} "
                  "tok/s)")
        print(f"headless median {statistics.median(speeds['headless']):.1f} tok/s; the idle apps used "
              f"{statistics.median(idle):.1%} of a core while the headless engine decoded")
    finally:
        for pane in panes.values():
            pane.close()
        for process in engines.values():
            process.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="pocket")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=512, help="headless reply length (the app's is 512)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", action="append", default=[],
                        help="NAME:ENV=VALUE,... an app configuration to measure (repeatable; default: the app as is)")
    parser.add_argument("--headless-env", default="",
                        help="ENV=VALUE,... for the headless runs (e.g. OMP_WAIT_POLICY=PASSIVE, as the app's engine)")
    parser.add_argument("--width", type=int, default=120)
    parser.add_argument("--height", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--interleaved", type=int, default=0,
                        help="N rounds of app and headless replies, both kept loaded (speed only)")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="with --interleaved: seconds of quiet after each turn")
    parser.add_argument("--with-child", action="store_true",
                        help="with --interleaved: the app's engine without the app, and the profile's engine with "
                             "speculation off in one process, take turns too")
    parser.add_argument("--headless-loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spec-off", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.headless_loop:
        return headless_loop(args.profile, args.max_new_tokens, args.child, args.spec_off)
    if shutil.which("tmux") is None:
        raise SystemExit("needs tmux")
    configs: list[tuple[str, dict[str, str]]] = []
    for spec in args.config or ["app:"]:
        name, _, assignments = spec.partition(":")
        configs.append((name, dict(a.split("=", 1) for a in assignments.split(",") if a)))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if args.interleaved:
        with tempfile.TemporaryDirectory() as tmp:
            env.setdefault("SPECCHAT_STATE_DIR", str(Path(tmp) / "state"))
            interleaved(args, env, configs, Path(tmp))
        return 0
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in configs}
    with tempfile.TemporaryDirectory() as tmp:
        env.setdefault("SPECCHAT_STATE_DIR", str(Path(tmp) / "state"))
        for i in range(args.repeats):
            for name, extra in configs:
                before = headless_plain(args, env)
                speed, echo, esc = in_app(args, {**env, **extra}, Path(tmp) / f"{name}-{i}")
                after = headless_plain(args, env)  # headless on both sides: it swings run to run
                headless = (before + after) / 2
                results[name].append((speed / headless, echo, esc))
                print(f"run {i + 1} {name}: headless plain {before:.1f} and {after:.1f} tok/s · app plain {speed:.1f} tok/s · "
                      f"app/headless {speed / headless:.3f} · echo {1000 * echo:.0f} ms · "
                      f"Esc to '■ stopped' {1000 * esc:.0f} ms", flush=True)
    for name, rows in results.items():
        print(f"{name}: median app/headless {statistics.median(r for r, _, _ in rows):.3f}, "
              f"median echo {1000 * statistics.median(e for _, e, _ in rows):.0f} ms, "
              f"median Esc {1000 * statistics.median(e for _, _, e in rows):.0f} ms "
              f"(max {1000 * max(e for _, _, e in rows):.0f} ms) over {len(rows)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
