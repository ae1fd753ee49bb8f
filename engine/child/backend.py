"""The engine in a process of its own: the same :class:`~engine.api.ChatBackend`, off the UI's GIL.

Why: the decode loop dispatches a few hundred small torch ops per step from
Python, and each releases and retakes the GIL. In one process with a Textual
UI that renders while the reply streams, every retake can wait for the UI's
Python (up to the interpreter's switch interval), and the reply ran at about
half of headless ``specchat generate`` (measured: ``scripts/streaming_cost.py``).
A child process has its own interpreter and GIL; the UI talks to it through
one pipe, and the events crossing it are the same frozen dataclasses.

The protocol (parent → child, child → parent), one message at a time:

* start: the child loads ``profile`` and sends ``("progress", stage, fraction)``
  messages, then ``("ready", info)`` or ``("error", exception)``;
* ``("chat", messages, params)`` → ``("event", ChatEvent, info)`` per round, then
  ``("end", None, info)``, or ``("error", exception)``; the shared ``cancel``
  event stops the reply between rounds, as in-process;
* on a second pipe, answered by a thread of the child even while a reply
  streams (F5 mid-reply): ``("speculation", enabled)`` → ``("info", info)`` or
  ``("error", exception)``;
* ``("close",)`` → the child frees the models and exits.

A child that dies (killed, crashed) ends the reply with an :class:`EngineError`
saying so; the conversation is the app's and nothing of it is lost.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.api import EngineInfo
from engine.progress import ProgressFn, no_progress
from engine.errors import EngineBusyError, EngineError
from engine.events import ChatEvent, ChatMessage, GenerationParams

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event as ProcessEvent

    from engine.config.profiles import ModelProfile

POLL_S = 0.05
"""How often a waiting parent looks at its ``cancel`` event (seconds)."""

CLOSE_WAIT_S = 10.0
"""How long :meth:`ProcessBackend.close` waits for the child to exit before killing it."""


class _Reply(Iterator[ChatEvent]):
    """A reply's events. A generator's ``finally`` runs only once it has started, so a
    reply dropped (or closed) before its first event is let go of here instead: the
    child is stopped and the engine freed for the next :meth:`ProcessBackend.chat`."""

    def __init__(self, events: Iterator[ChatEvent], abandon: Callable[[], None]) -> None:
        self._events = events
        self._abandon: Callable[[], None] | None = abandon  # until the first event is asked for

    def __next__(self) -> ChatEvent:
        self._abandon = None  # from here the generator's own finally cleans up
        return next(self._events)

    def close(self) -> None:
        abandon, self._abandon = self._abandon, None
        if abandon is not None:
            abandon()
        else:
            self._events.close()  # type: ignore[attr-defined]

    def __del__(self) -> None:
        self.close()


class ProcessBackend:
    """A :class:`~engine.api.ChatBackend` whose engine runs in a spawned child process.

    One reply at a time, like :class:`~engine.chat.session.ChatEngine`: a second
    :meth:`chat` while one streams raises :class:`EngineBusyError`.
    """

    def __init__(self, process: Any, conn: Connection, control: Connection, cancel: "ProcessEvent",
                 info: EngineInfo) -> None:
        self._process = process
        self._conn = conn
        self._control = control
        self._cancel = cancel
        self._info = info
        self._busy = threading.Lock()
        self._control_lock = threading.Lock()

    @classmethod
    def start(cls, profile: "ModelProfile", memory_budget: int | None = None,
              progress: ProgressFn = no_progress, log: Path | None = None,
              threads: int | None = None) -> "ProcessBackend":
        """Spawn the child, load ``profile`` there (progress forwarded), and wait until it is ready.

        Load errors are raised here as the child raised them (a
        :class:`~engine.errors.MemoryPlanError` stays one). ``log``: a file that
        takes the child's stdout and stderr (under a full-screen UI, which they
        would scribble over); None leaves them on the parent's. ``threads``: torch's
        intra-op threads in the child (None: torch's default, one per core)."""
        ctx = multiprocessing.get_context("spawn")  # never fork a process that runs threads (the UI)
        conn, child_conn = ctx.Pipe()
        control, child_control = ctx.Pipe()
        with _real_stderr():
            cancel = ctx.Event()  # its semaphore starts multiprocessing's resource tracker
            process = ctx.Process(target=serve, args=(child_conn, child_control, cancel, profile, memory_budget, log, threads),
                                  name=f"specchat-engine-{profile.name}", daemon=True)
            _LAUNCHER.run(process.start)
        child_conn.close()
        child_control.close()
        backend = cls(process, conn, control, cancel, EngineInfo(profile.name, "", "", "plain", ""))
        try:
            while True:
                kind, *rest = backend._receive()
                if kind == "progress":
                    progress(rest[0], rest[1])
                elif kind == "ready":
                    backend._info = rest[0]
                    return backend
                else:
                    raise rest[0]
        except BaseException:
            backend._stop()
            raise

    @property
    def info(self) -> EngineInfo:
        """The child's state as of its last message (every event and every reply's end carry it)."""
        return self._info

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._process.pid

    def chat(self, messages: Sequence[ChatMessage], params: GenerationParams,
             cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        """Reply to ``messages`` in the child; one event per round, as :meth:`ChatEngine.chat`."""
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError("this engine is already writing a reply; wait for it to finish or cancel it")
        try:
            # A cancel already set reaches the child before the request does: forwarding it
            # only once the reply is read let the child write a few rounds first.
            if cancel is not None and cancel.is_set():
                self._cancel.set()
            else:
                self._cancel.clear()
            self._send(("chat", list(messages), params))
        except BaseException:
            self._busy.release()
            raise
        return _Reply(self._events(cancel), self._abandon)

    def _abandon(self) -> None:
        """The reply's reader went away before reading anything: stop the child, free the engine."""
        self._cancel.set()
        self._drain()
        self._busy.release()

    def _events(self, cancel: threading.Event | None) -> Iterator[ChatEvent]:
        ended = False
        try:
            while True:
                kind, *rest = self._receive(cancel)
                if kind == "error":
                    ended = True
                    raise rest[0]
                self._info = rest[1]
                if kind == "end":
                    ended = True
                    return
                yield rest[0]
        finally:
            if not ended:  # the caller stopped reading: stop the child and wait for its end
                self._abandon()
            else:
                self._busy.release()

    def _drain(self) -> None:
        try:
            while True:
                kind, *rest = self._receive()
                if kind in ("end", "error"):
                    return
        except EngineError:
            return

    def set_speculation(self, enabled: bool) -> None:
        """Switch speculation in the child, at once, even while a reply streams."""
        with self._control_lock:
            self._send(("speculation", enabled), self._control)
            kind, payload = self._receive(conn=self._control)
        if kind == "error":
            raise payload
        self._info = payload

    def close(self) -> None:
        """Ask the child to free its models and exit; kill it if it does not."""
        self._cancel.set()
        try:
            self._conn.send(("close",))
        except (OSError, ValueError):
            pass
        self._stop()

    def _stop(self) -> None:
        self._process.join(CLOSE_WAIT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()
        self._control.close()

    def _send(self, message: tuple[Any, ...], conn: Connection | None = None) -> None:
        try:
            (conn or self._conn).send(message)
        except (OSError, ValueError) as exc:
            raise self._died() from exc

    def _receive(self, cancel: threading.Event | None = None, conn: Connection | None = None) -> tuple[Any, ...]:
        """The child's next message on ``conn`` (the reply pipe by default); forwards ``cancel``."""
        conn = conn or self._conn
        try:
            while True:
                if cancel is not None and cancel.is_set():
                    self._cancel.set()
                if conn.poll(POLL_S):
                    return conn.recv()
                if not self._process.is_alive() and not conn.poll():
                    raise self._died()
        except (EOFError, OSError) as exc:
            raise self._died() from exc

    def _died(self) -> EngineError:
        self._process.join(1.0)
        code = self._process.exitcode
        how = "was killed" if code is not None and code < 0 else f"exited (code {code})"
        return EngineError(f"the engine process {how}; the conversation is kept: pick the profile again (F2) "
                           "to reload the models")


class _Launcher:
    """Starts the children from one long-lived thread.

    Linux gives a new process the scheduling priority (nice value) of the
    *thread* that started it, and a new thread that of its creator. A UI that
    lowers its own threads' priority, so that the engine's threads win the
    cores while a reply streams (:func:`lower_priority_except_launcher`), would
    otherwise pass its lowered priority on to the next engine it loads. The
    launcher thread is made by the first start and is never lowered.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], None], threading.Event, list[BaseException]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def native_id(self) -> int | None:
        """The launcher thread's id for the OS (None until the first start)."""
        return self._thread.native_id if self._thread is not None else None

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the launcher thread and wait for it; its exception is raised here."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="specchat-engine-launcher", daemon=True)
                self._thread.start()
        done, errors = threading.Event(), []
        self._jobs.put((job, done, errors))
        done.wait()
        if errors:
            raise errors[0]

    def _serve(self) -> None:
        while True:
            job, done, errors = self._jobs.get()
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                errors.append(exc)
            done.set()


_LAUNCHER = _Launcher()


def lower_priority_except_launcher(nice: int) -> int:
    """Raise the nice value of every thread of this process to at least ``nice``, except the
    thread that starts engine children; returns how many threads were changed. Linux only
    (elsewhere nothing happens). Raising one's own nice value needs no privilege."""
    tasks = Path("/proc/self/task")
    if not hasattr(os, "setpriority") or not tasks.is_dir():
        return 0
    changed = 0
    for entry in tasks.iterdir():
        tid = int(entry.name)
        if tid == _LAUNCHER.native_id:
            continue
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except OSError:  # the thread ended meanwhile
            continue
    return changed


def serve(conn: Connection, control: Connection, cancel: "ProcessEvent", profile: "ModelProfile",
          memory_budget: int | None, log: Path | None, threads: int | None = None) -> None:
    """The child's main loop: load, then answer requests until ``close`` or the pipe ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the engine stops
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if log is not None:
        _redirect_output(log)
    from engine.fetch.hublog import hub_messages_as_progress, quiet_transformers
    from engine.load.loader import load_engine

    quiet_transformers()  # progress goes to the parent, as messages

    def progress(stage: str, fraction: float | None) -> None:
        conn.send(("progress", stage, fraction))

    try:
        with hub_messages_as_progress(progress):
            engine = load_engine(profile, memory_budget=memory_budget, progress=progress)
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        _send_error(conn, exc)
        return
    conn.send(("ready", engine.info))
    threading.Thread(target=_answer_control, args=(engine, control), name="control", daemon=True).start()
    try:
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                return
            try:
                if request[0] == "chat":
                    for event in engine.chat(request[1], request[2], cancel):
                        conn.send(("event", event, engine.info))
                    conn.send(("end", None, engine.info))
                else:
                    return
            except Exception as exc:  # noqa: BLE001 - the parent raises it in its thread
                _send_error(conn, exc)
    finally:
        engine.close()


def _answer_control(engine: Any, control: Connection) -> None:
    """The child's control thread: switch speculation when asked, replies streaming or not
    (the decoder reads its switch between rounds, as in one process)."""
    while True:
        try:
            request = control.recv()
        except (EOFError, OSError):
            return
        try:
            engine.set_speculation(request[1])
            control.send(("info", engine.info))
        except Exception as exc:  # noqa: BLE001 - the parent raises it
            _send_error(control, exc)


@contextmanager
def _real_stderr() -> Iterator[None]:
    """Put the interpreter's own stderr back for a moment: multiprocessing hands
    ``sys.stderr.fileno()`` to the processes it starts, and Textual's stand-in
    answers -1 ("bad value(s) in fds_to_keep")."""
    saved = sys.stderr
    if sys.__stderr__ is not None:
        sys.stderr = sys.__stderr__
    try:
        yield
    finally:
        sys.stderr = saved


def _redirect_output(log: Path) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2) at ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)


def _send_error(conn: Connection, exc: BaseException) -> None:
    """Send ``exc`` as it is when it survives pickling, else as an EngineError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001
        exc = EngineError(f"{type(exc).__name__}: {exc}")
    exc.__traceback__ = None
    conn.send(("error", exc))
