"""The child's side: load the profile, then answer requests until told to close or the pipe ends."""
from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.api import ChatBackend
from engine.child.protocol import (
    ChatRequest, ControlRequest, Info, LearnRequest, Progress, Ready, ReplyEnd, Round, failure,
)

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event as ProcessEvent

    from engine.config.profiles import ModelProfile
    from engine.events import ChatEvent


SEND_EVERY_S = 0.25
"""The longest a round waits in the child before it is sent (seconds): the app paints a
streaming reply at most this often (:data:`app.ui.pacing.PAINT_EVERY_S`), so sooner buys
nothing on screen. Each message wakes the UI's reader, its history saver and its event loop,
and on 2 cores every wake-up preempts one of the engine's two threads while the other waits
for it. Measured (``scripts/app_speed.py --interleaved``, pocket, 2026-11-27; docs/performance.md):
app ÷ headless 0.858 at 0.05 s and 0.923 at 0.25 s in one run; in later runs, with the UI's
other wake-up cuts, a paired gain of 1.007 and 1.072 over before: a few per cent at most."""


class RoundBatch:
    """The rounds not sent yet: a reply's first round, one that ends it or carries a notice,
    and any once :data:`SEND_EVERY_S` has passed since the last message go at once."""

    def __init__(self, conn: Connection, engine: ChatBackend) -> None:
        self._conn = conn
        self._engine = engine
        self._events: list[ChatEvent] = []
        self._sent_at: float | None = None

    def add(self, event: ChatEvent, now: float) -> None:
        self._events.append(event)
        if (self._sent_at is None or now - self._sent_at >= SEND_EVERY_S
                or event.finish_reason is not None or event.notice):
            self.send(now)

    def send(self, now: float | None = None) -> None:
        """Send the rounds waiting, if any."""
        if self._events:
            self._conn.send(Round(tuple(self._events), self._engine.info))
            self._events = []
            self._sent_at = time.monotonic() if now is None else now


def threads_now(full: int, now: float, yield_until: float, cores: int | None = None) -> int:
    """Torch threads for the next round: one fewer than ``full`` until the UI's deadline
    ``yield_until`` (``time.monotonic()``) passes (a key arrived, or a paint is about to
    start: the UI needs a core), else ``full``. With fewer threads than the ``cores`` this
    process may run on, a core is free for the UI already and nothing is given up."""
    if cores is not None and full < cores:
        return full
    return max(1, full - 1) if now < yield_until else full


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS says, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


PARENT_CHECK_S = 1.0
"""How often the child looks whether the app that started it still lives (seconds)."""


def own_group_ending_with_parent(check_s: float = PARENT_CHECK_S) -> None:
    """Make this process a process group of its own, so a stopped load kills what it started with
    it (a download's pip: :meth:`engine.child.backend.ProcessBackend._stop`), and end that group when
    the parent ends. A group of its own no longer gets the terminal's SIGHUP, and a child busy
    loading reads no pipe that would tell it: a terminal closed during a load left it downloading
    on its own. A daemon thread looks every ``check_s``; POSIX only (elsewhere: nothing)."""
    if not hasattr(os, "setpgid"):
        return
    os.setpgid(0, 0)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(check_s)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def serve(conn: Connection, control: Connection, cancel: "ProcessEvent", profile: "ModelProfile",
          memory_budget: int | None, log: Path | None, threads: int | None = None,
          yield_until: Any = None) -> None:
    """The child's main loop (the target of the spawned process).

    ``log``: a file that takes the child's stdout and stderr; ``threads``: torch's
    intra-op threads (None: torch's default); ``yield_until``: a shared double, a
    ``time.monotonic()`` deadline before which each round runs on one thread fewer
    (:meth:`~engine.child.backend.ProcessBackend.yield_to_ui`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the engine stops
    own_group_ending_with_parent()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if log is not None:
        _redirect_output(log)
    # A native crash (a bad read in a C kernel, an abort) writes every thread's Python stack to the
    # log (fd 2, redirected above) before its signal ends the process: the log stayed empty, said
    # nothing, and was not kept as <log>.1 when the app loaded the engine again.
    faulthandler.enable(file=2, all_threads=True)
    from engine.fetch.hublog import hub_messages_as_progress, quiet_transformers
    from engine.load.loader import load_engine

    quiet_transformers()  # progress goes to the parent, as messages

    def progress(stage: str, fraction: float | None) -> None:
        conn.send(Progress(stage, fraction))

    try:
        with hub_messages_as_progress(progress):
            engine = load_engine(profile, memory_budget=memory_budget, progress=progress)
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        conn.send(failure(exc))
        return
    conn.send(Ready(engine.info))
    import torch

    full, cores = torch.get_num_threads(), usable_cores()
    threading.Thread(target=_answer_control, args=(engine, control), name="control", daemon=True).start()
    try:
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                return
            if not isinstance(request, ChatRequest):
                return  # CloseRequest
            current = full
            rounds = RoundBatch(conn, engine)
            try:
                for event in engine.chat(request.messages, request.params, cancel):
                    rounds.add(event, time.monotonic())
                    if yield_until is not None:  # the next round: leave the UI a core while it asks
                        wanted = threads_now(full, time.monotonic(), yield_until.value, cores)
                        if wanted != current:
                            torch.set_num_threads(wanted)
                            current = wanted
                rounds.send()
                conn.send(ReplyEnd(engine.info))
            except Exception as exc:  # noqa: BLE001 - the parent raises it in its thread
                rounds.send()  # the text so far is the reply's
                conn.send(failure(exc))
            finally:
                if current != full:
                    torch.set_num_threads(full)
    finally:
        engine.close()


def _answer_control(engine: ChatBackend, control: Connection) -> None:
    """The child's control thread: switch speculation, or hand the drafter earlier chats, when
    asked, replies streaming or not (the decoder reads its switch between rounds, and the suffix
    drafter swaps its index in whole, as in one process)."""
    while True:
        try:
            request: ControlRequest = control.recv()
        except (EOFError, OSError):
            return
        try:
            if isinstance(request, LearnRequest):
                engine.learn(request.texts)
            else:
                engine.set_speculation(request.enabled)
            control.send(Info(engine.info))
        except Exception as exc:  # noqa: BLE001 - the parent raises it
            control.send(failure(exc))


def _redirect_output(log: Path) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2) at a new ``log``; the
    last engine's log, if it wrote anything, is kept as ``<log>.1``. An engine that crashed is
    loaded again by the app at once, and its crash report was truncated away with the old log.
    A log that cannot be opened (its folder made read-only since the parent looked) gives way to
    the null device: the engine never fails for its log, nor writes over the app's screen."""
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        if log.stat().st_size > 0:
            os.replace(log, log.with_name(log.name + ".1"))
    except OSError:
        pass  # no log yet, or it cannot be moved: it is started again as before
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
