"""The app's own CPU while a reply streams, with no engine: what the UI takes from the engine's cores.

Runs the real app (``SpecChatApp``, headless Textual at the given size) against a stand-in
backend that sends a fixed reply of ``--tokens`` one-token rounds at ``--rate`` tokens a
second, in batches every ``--batch-s`` seconds (as the engine's child process sends them:
``engine/child/serve.py`` ``SEND_EVERY_S``), and prints the process's CPU time over the
reply's wall time (the share of one core the UI used), for the UI thread and the rest.

    PYTHONPATH=$PWD .venv/bin/python scripts/ui_stream_cost.py --repeats 5

On 2 cores the engine's two threads take both, so this share comes out of the reply's
speed (docs/performance.md, "The app's decode speed"). CPU time moves with the machine as
wall time does: compare figures from one run, configurations alternating (``--config``
names a ``module:ATTR=value`` to set for a run, e.g. ``app.ui.pacing:UI_BUDGET=0.03``).
No terminal is written (Textual's headless driver), so the writer thread's share is left out;
``--tmux`` runs the app in a real terminal and prints tmux's server's share beside it.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.api import EngineInfo  # noqa: E402
from engine.events import ChatEvent, ChatMessage, GenerationParams, ReplyStats, TextPiece  # noqa: E402

if TYPE_CHECKING:
    from app.ui.app import SpecChatApp

PARAGRAPH = ("The keeper climbed the spiral stairs each evening as the light went out of the sky, counting "
             "the steps as his father had, and lit the great lamp before the first ship rounded the point. ")
REPLY = ("## Chapter one\n\n" + PARAGRAPH * 3 + "\n\n" + "".join(f"- {w} rolled in from the west\n" for w in
         ("Fog", "Rain", "Wind", "A storm", "The tide")) + "\n" + PARAGRAPH * 4 + "\n\n## Chapter two\n\n"
         + PARAGRAPH * 6)
"""A reply of prose, headings and a list (about 600 word pieces)."""


SKIP_S = 0.5
"""Seconds into a reply before its CPU is counted (as ``scripts/app_speed.py`` counts the real app's)."""


class SteadyBackend:
    """A ``ChatBackend`` that streams ``REPLY``'s word pieces, one a round, at a steady rate."""

    def __init__(self, tokens: int, rate: float, batch_s: float, out: Path | None = None) -> None:
        self.pieces = re.findall(r"\s*\S+", REPLY * (1 + tokens // 600))[:tokens]
        self.rate, self.batch_s = rate, batch_s
        self.speculation = True
        self.out = out
        """Where a finished reply's times go as JSON (the app in a terminal, ``--tmux``)."""
        self.done = False
        self.times: list[tuple[float, float, float]] = []
        """(wall, process CPU, the terminal's CPU) at each batch of the latest reply."""

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(profile="steady", target="steady", drafter="none", mode="plain", device="cpu")

    def chat(self, messages: Sequence[ChatMessage], params: GenerationParams,
             cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        start = time.monotonic()
        self.times = []
        out_of_process = self.out is not None  # the app in a terminal of its own (--tmux)
        sent = 0
        while sent < len(self.pieces):
            due = min(len(self.pieces), int((time.monotonic() - start) * self.rate) + 1)
            for i in range(sent, due):
                stats = ReplyStats(mode="plain", drafter="none", rounds=i + 1, target_passes=i + 1, tokens=i + 1,
                                   elapsed_s=time.monotonic() - start, tokens_per_s=self.rate,
                                   mode_tokens=(("plain", i + 1),))
                yield ChatEvent(self.pieces[i], (TextPiece(self.pieces[i], "target"),), (i,), stats,
                                finish_reason="stop" if i == len(self.pieces) - 1 else None)
            sent = due
            self.times.append((time.monotonic(), time.process_time(), terminal_cpu() if out_of_process else 0.0))
            if cancel is not None and cancel.is_set():
                return
            time.sleep(self.batch_s)
        self.done = True
        if self.out is not None:
            self.out.write_text(json.dumps(self.times))

    def learn(self, texts: Sequence[str]) -> None:
        pass

    def set_speculation(self, enabled: bool) -> None:
        self.speculation = enabled

    def close(self) -> None:
        pass


def stat_cpu_s(stat: Path) -> float:
    """User + system CPU seconds in a ``/proc`` ``stat`` file (a process's or a thread's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def terminal_cpu() -> float:
    """CPU seconds the terminal this app draws into has used so far: in ``--tmux`` the app is the
    pane's command, so its parent is tmux's server, which parses every frame the app writes."""
    return stat_cpu_s(Path(f"/proc/{os.getppid()}/stat"))


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far (by name where Python knows it)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    used: dict[str, float] = {}
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            cpu = stat_cpu_s(task / "stat")
        except OSError:
            continue
        name = names.get(int(task.name), "other")
        used[name] = used.get(name, 0.0) + cpu
    return used


def steady_app(backend: SteadyBackend) -> "SpecChatApp":
    """The real app with ``backend`` as its only profile's engine."""
    from app.ui.app import SpecChatApp
    from engine.config.profiles import ModelProfile, ModelSpec, Profiles

    profile = ModelProfile(name="steady", target=ModelSpec("steady/model"), drafter="none")
    return SpecChatApp(loader=lambda p, budget, progress, stop=None: backend,
                       profiles_loader=lambda: Profiles({"steady": profile}, default="steady", files=()))


def share_of(times: list[tuple[float, float, float]], seconds: float) -> tuple[float, float]:
    """(process CPU ÷ wall, the terminal's CPU ÷ wall) from ``SKIP_S`` into a reply for ``seconds``
    (or to its last batch)."""
    first = next(i for i, (wall, *_) in enumerate(times) if wall - times[0][0] >= SKIP_S)
    last = next((i for i, (wall, *_) in enumerate(times) if wall - times[first][0] >= seconds), len(times) - 1)
    wall = times[last][0] - times[first][0]
    return (times[last][1] - times[first][1]) / wall, (times[last][2] - times[first][2]) / wall


def in_terminal(args: argparse.Namespace, settings: list[str]) -> tuple[float, float]:
    """The app in a tmux pane of the given size (Textual's own driver writing a real terminal):
    (its process's CPU share, tmux's server's) while one reply streams. The terminal's share is
    the engine's loss too: parsing the app's frames takes the same cores. (This server draws to no
    client, being detached: a terminal emulator showing the frames costs more.)"""
    with tempfile.TemporaryDirectory(prefix="ui-stream-") as tmp:
        sock, out = Path(tmp) / "tmux.sock", Path(tmp) / "times.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", str(out), "--tokens", str(args.tokens),
               "--rate", str(args.rate), "--batch-s", str(args.batch_s),
               *(f"--set={setting}" for setting in settings)]
        env = {**os.environ, "TERM": "xterm-256color", "SPECCHAT_DATA_DIR": tmp}
        tmux = ["tmux", "-S", str(sock)]
        subprocess.run([*tmux, "-f", "/dev/null", "new-session", "-d", "-s", "cost", "-x", str(args.width),
                        "-y", str(args.height), " ".join(f"'{part}'" for part in cmd)], check=True, env=env)
        try:
            deadline = time.monotonic() + 60
            while "Ask" not in subprocess.run([*tmux, "capture-pane", "-p", "-t", "cost"], capture_output=True,
                                              text=True).stdout:
                if time.monotonic() > deadline:
                    raise SystemExit("the app never showed its prompt box")
                time.sleep(0.2)
            time.sleep(1.0)
            if args.folded_hud:
                subprocess.run([*tmux, "send-keys", "-t", "cost", "F6"], check=True)
                time.sleep(0.5)
            subprocess.run([*tmux, "send-keys", "-t", "cost", "-l", "Write a long story."], check=True)
            subprocess.run([*tmux, "send-keys", "-t", "cost", "Enter"], check=True)
            deadline = time.monotonic() + 60 + args.tokens / args.rate
            while not out.exists():
                if time.monotonic() > deadline:
                    raise SystemExit("the reply never finished")
                time.sleep(0.2)
            time.sleep(0.2)
            return share_of(json.loads(out.read_text()), args.seconds)
        finally:
            subprocess.run([*tmux, "kill-server"], capture_output=True)


async def one_reply(args: argparse.Namespace) -> tuple[float, dict[str, float]]:
    """(process CPU ÷ wall while one reply streams, CPU share by thread): from ``SKIP_S`` into the
    reply for ``--seconds`` (or to its last batch), so neither the reply's start nor its final
    render is in it (the engine has finished by then). Headless Textual, in this process."""
    from textual.widgets import TextArea

    backend = SteadyBackend(args.tokens, args.rate, args.batch_s)
    app = steady_app(backend)
    async with app.run_test(size=(args.width, args.height)) as pilot:
        for _ in range(100):
            await pilot.pause(0.05)
            if app.engine.backend is not None:
                break
        await pilot.pause(0.5)
        if args.folded_hud:
            await pilot.press("f6")
            await pilot.pause(0.2)
        app.query_one(TextArea).text = "Write a long story about a lighthouse keeper."
        await pilot.press("enter")
        while not backend.times or backend.times[-1][0] - backend.times[0][0] < SKIP_S:
            await asyncio.sleep(0.01)  # the pilot's pause would wait for the app and refresh it: sleep instead
        first, before = len(backend.times) - 1, thread_cpu()
        while len(backend.times) < len(backend.pieces) and not backend.done:
            if backend.times[-1][0] - backend.times[first][0] >= args.seconds:
                break
            await asyncio.sleep(0.01)
        after, last = thread_cpu(), len(backend.times) - 1
        while not backend.done:
            await asyncio.sleep(0.05)
        await pilot.pause(0.3)
    (wall0, cpu0, _), (wall1, cpu1, _) = backend.times[first], backend.times[last]
    wall = wall1 - wall0
    return (cpu1 - cpu0) / wall, {name: (after[name] - before.get(name, 0.0)) / wall for name in after}


def apply(setting: str) -> tuple[object, str, object]:
    """Set ``module:ATTR=value``; returns what to restore."""
    target, value = setting.split("=", 1)
    module_name, attr = target.split(":")
    module = importlib.import_module(module_name)
    old = getattr(module, attr)
    setattr(module, attr, type(old)(value))
    return module, attr, old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2000, help="rounds of one token (default: 2000)")
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds of streaming counted (default: 6)")
    parser.add_argument("--rate", type=float, default=190.0, help="tokens a second (default: 190, pocket here)")
    parser.add_argument("--batch-s", type=float, default=0.25, help="seconds between batches of rounds (default: 0.25)")
    parser.add_argument("--width", type=int, default=120)
    parser.add_argument("--height", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folded-hud", action="store_true", help="fold the HUD to its one line first (F6)")
    parser.add_argument("--config", action="append", default=[],
                        help="NAME:module:ATTR=value[;module:ATTR=value] (repeatable; 'now:' is the tree as it is)")
    parser.add_argument("--tmux", action="store_true", help="run the app in a tmux pane (a real terminal)")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the app itself, for --tmux
    parser.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)  # a config's, in --serve
    args = parser.parse_args()
    if args.serve:
        for setting in args.set:
            apply(setting)
        steady_app(SteadyBackend(args.tokens, args.rate, args.batch_s, args.serve)).run()
        return
    os.environ.setdefault("SPECCHAT_DATA_DIR", tempfile.mkdtemp(prefix="ui-stream-"))
    configs = [(c.split(":", 1)[0], [s for s in c.split(":", 1)[1].split(";") if s]) for c in args.config or ["now:"]]
    shares: dict[str, list[float]] = {name: [] for name, _ in configs}
    terminals: dict[str, list[float]] = {name: [] for name, _ in configs}
    for repeat in range(args.repeats):
        for name, settings in configs[repeat % len(configs):] + configs[:repeat % len(configs)]:
            restore = [apply(s) for s in settings]
            try:
                terminal = None
                if args.tmux:
                    (share, terminal), by_thread = in_terminal(args, settings), {}
                else:
                    share, by_thread = asyncio.run(one_reply(args))
            finally:
                for module, attr, old in restore:
                    setattr(module, attr, old)
            shares[name].append(share)
            if terminal is not None:
                terminals[name].append(terminal)
            busiest = ", ".join(f"{t} {s:.1%}" for t, s in sorted(by_thread.items(), key=lambda kv: -kv[1])[:3])
            print(f"run {repeat + 1} {name}: {share:.1%} of a core ({busiest or f'tmux {terminal:.1%}'})",
                  flush=True)
    for name, values in shares.items():
        beside = (f"; tmux's server {statistics.median(terminals[name]):.1%}, together "
                  f"{statistics.median(a + b for a, b in zip(values, terminals[name])):.1%}") if terminals[name] else ""
        print(f"{name}: median {statistics.median(values):.1%} of a core over {len(values)} replies{beside}")


if __name__ == "__main__":
    main()
