"""The engine in a process of its own: the same :class:`~engine.api.ChatBackend`, off the UI's GIL.

Why: the decode loop dispatches a few hundred small torch ops per step from
Python, and each releases and retakes the GIL. In one process with a Textual
UI that renders while the reply streams, every retake can wait for the UI's
Python (up to the interpreter's switch interval), and the reply ran at about
half of headless ``specchat generate`` (measured: ``scripts/streaming_cost.py``).
A child process has its own interpreter and GIL; the UI talks to it through
one pipe, and the events crossing it are the same frozen dataclasses.

The messages crossing the pipes are in :mod:`engine.child.protocol`, the child's
loop in :mod:`engine.child.serve`, the thread that starts children in
:mod:`engine.child.launcher`, how a child's end is read and worded in
:mod:`engine.child.ending`, and its log's checks in :mod:`engine.child.logfile`.

A child that dies (killed, crashed) ends the reply with an :class:`EngineError`
saying so; the conversation is the app's and nothing of it is lost. So does a child that
stops answering (stopped with SIGSTOP, wedged): once a reply was told to stop it has
:data:`STOP_WAIT_S` to end it, and a control request :data:`CONTROL_WAIT_S` (a drafter's
lesson :data:`LEARN_WAIT_S`) for its answer, or it is ended as hung (a reply's child only once
it is stopped or no longer uses the CPU: a slow but working one is waited for). Before, such a child
held the engine for good: Esc, F2 and ctrl+q waited on it, and F5 froze the UI. When the app closes
(:meth:`ProcessBackend.closing`) a child has :data:`CLOSE_ANSWER_S`, and its reply ends as closed,
not as a failure.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.api import EngineInfo
from engine.child.ending import ChildEnd, StopClock, cpu_seconds, crashed, how_it_ended
from engine.child.launcher import LAUNCHER, real_stderr
from engine.child.logfile import crash_report, writable_log
from engine.child.protocol import (
    ChatRequest, CloseRequest, ControlAnswer, ControlRequest, Failure, FromChild, LearnRequest, Progress, Ready,
    ReplyEnd, Round, SpeculationRequest, ToChild,
)
from engine.child.reply import Reply
from engine.child.serve import serve
from engine.errors import EngineBusyError, EngineClosedError, EngineDiedError, EngineError, LoadStoppedError
from engine.events import ChatEvent, ChatMessage, GenerationParams
from engine.progress import ProgressFn, no_progress

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event as ProcessEvent

    from engine.config.profiles import ModelProfile

POLL_S = 0.25
"""How often a waiting parent looks at its ``cancel`` event and whether the child lives (seconds).
Esc does not wait for it (:meth:`ProcessBackend.interrupt` tells the child at once), and an event
wakes the reader as it arrives. Every 0.05 s, the reader woke 20 times a second through a reply:
on a 2-core machine each wake-up takes a core from the engine's threads for a moment, and an
OpenMP step waits for its slowest thread."""

YIELD_S = 0.25
"""How long the child runs on one thread fewer after :meth:`ProcessBackend.yield_to_ui` (seconds)."""

CLOSE_ANSWER_S = 1.0
"""How long a closing child (the app quitting: :meth:`ProcessBackend.closing`) has to end its reply, or
itself, before it is ended unless it is still working (up to :data:`CLOSE_WAIT_S`). A child stopped
(SIGSTOP) mid-reply kept ctrl+q on a blank screen for :data:`STOP_WAIT_S`, keys typed meanwhile
reaching the shell; a healthy one exits in about a second, working all along."""

CLOSE_WAIT_S = 10.0
"""The longest :meth:`ProcessBackend.close` waits for a child still working to exit before killing it."""

STOP_WAIT_S = 10.0
"""How long a reply told to stop (Esc, a switch, quitting) may take to end before its child is
looked at: a healthy child ends it within a round or a prompt's piece (well under a second). One
that is stopped (SIGSTOP), or used less than :data:`PROGRESS_CPU_S` of CPU meanwhile, is ended as
hung; one still computing (a slow machine, a compile) gets another wait (:class:`~engine.child.ending.StopClock`)."""

CONTROL_WAIT_S = 5.0
"""How long a speculation switch (F5) waits for the child's answer, which its control thread
gives at once, even while a reply streams."""

CONTROL_TURN_S = 1.0
"""How long F5's request waits for the control pipe while another request holds it (a lesson)."""

LEARN_WAIT_S = 120.0
"""How long handing the drafter earlier chats may take (tokenizing and indexing: about a second)."""

DIED_WAIT_S = 1.0
"""How long a child whose pipe ended may take to end itself before it is ended as hung."""


class ProcessBackend:
    """A :class:`~engine.api.ChatBackend` whose engine runs in a spawned child process.

    One reply at a time, like :class:`~engine.chat.session.ChatEngine`: a second
    :meth:`chat` while one streams raises :class:`EngineBusyError`.
    """

    def __init__(self, process: Any, conn: Connection, control: Connection, cancel: "ProcessEvent",
                 info: EngineInfo) -> None:
        self._process = process
        self._end = ChildEnd(process)  # the one reader of the child's end: nothing else may join it
        self._conn = conn
        self._control = control
        self._cancel = cancel
        self._info = info
        self._busy = threading.Lock()
        self._control_lock = threading.Lock()
        self._closing = threading.Event()
        self._yield_until: Any = None  # the shared deadline of yield_to_ui (set by start)
        self.log_note: str | None = None
        """Why the child writes no log (set by :meth:`start`), for the app to say once."""
        self._log: Path | None = None
        """The child's log, where it writes one (set by :meth:`start`): a crash's report is there."""
        self._loading: str | None = None
        """The profile the child is loading (set by :meth:`start` until it is ready), for its errors to say."""

    @classmethod
    def start(cls, profile: "ModelProfile", memory_budget: int | None = None,
              progress: ProgressFn = no_progress, log: Path | None = None,
              threads: int | None = None, stop: threading.Event | None = None) -> "ProcessBackend":
        """Spawn the child, load ``profile`` there (progress forwarded), and wait until it is ready.

        Load errors are raised here as the child raised them (a
        :class:`~engine.errors.MemoryPlanError` stays one). ``log``: a file that
        takes the child's stdout and stderr (under a full-screen UI, which they
        would scribble over); None leaves them on the parent's. ``threads``: torch's
        intra-op threads in the child (None: torch's default, one per core). ``stop``:
        once set, the child and its process group (a download's pip) are killed within
        :data:`POLL_S` and :class:`~engine.errors.LoadStoppedError` is raised."""
        log, log_note = writable_log(log)
        ctx = multiprocessing.get_context("spawn")  # never fork a process that runs threads (the UI)
        conn, child_conn = ctx.Pipe()
        control, child_control = ctx.Pipe()
        yield_until = ctx.Value("d", 0.0, lock=False)  # a time.monotonic() deadline, shared with the child
        with real_stderr():
            cancel = ctx.Event()  # its semaphore starts multiprocessing's resource tracker
            process = ctx.Process(target=serve, args=(child_conn, child_control, cancel, profile, memory_budget, log,
                                                      threads, yield_until),
                                  name=f"specchat-engine-{profile.name}", daemon=True)
            # The child inherits this environment as it is: its OpenMP threads wait as `specchat
            # generate`'s do. Sleeping waits (OMP_WAIT_POLICY=PASSIVE), chosen on a shared loaded
            # machine, made the app slowest on a quiet one (2026-11-26, scripts/app_speed.py, pocket,
            # plain, 512 tokens: 75-88 tok/s against 122-140; docs/performance.md).
            LAUNCHER.run(process.start)
        child_conn.close()
        child_control.close()
        backend = cls(process, conn, control, cancel, EngineInfo(profile.name, "", "", "plain", ""))
        backend._yield_until = yield_until
        backend.log_note = log_note
        backend._log = log if log_note is None else None
        backend._loading = profile.name
        try:
            while True:
                message = backend._receive(stop=stop)
                if isinstance(message, Progress):
                    progress(message.stage, message.fraction)
                elif isinstance(message, Ready):
                    backend._info = message.info
                    backend._loading = None
                    return backend
                else:
                    raise _error(message)
        except LoadStoppedError:
            backend._stop(wait_s=0)
            raise LoadStoppedError(f"Stopped loading {profile.name}.") from None
        except BaseException:
            backend._stop()
            raise

    @property
    def info(self) -> EngineInfo:
        """The child's state as of its last message (every event and every reply's end carry it)."""
        return self._info

    @property
    def alive(self) -> bool:
        """Whether the child still runs (a killed or crashed one must be loaded again)."""
        return not self._end.ended

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._process.pid

    def when_it_ends(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from a thread of its own) once the child has ended, however it ends,
        closed by :meth:`close` too. Killed while idle, it was noticed only when the next prompt
        failed. Called once the child is reaped: :attr:`alive` is False when the callback asks."""
        self._end.then(callback)

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
            self._send(ChatRequest(list(messages), params))
        except BaseException:
            self._busy.release()
            raise
        return Reply(self._events(cancel), self._abandon)

    def yield_to_ui(self, seconds: float = YIELD_S) -> None:
        """Have the child decode on one thread fewer for ``seconds``, from any thread (a key's
        own): on a machine where the engine takes every core and the UI's threads yield to
        it, the UI then has a core to show the key on (its echo took over a second)."""
        if self._yield_until is not None:
            self._yield_until.value = time.monotonic() + seconds

    def interrupt(self) -> None:
        """Tell the child to stop the reply now, from any thread (a key's own thread): the
        reply's reader forwards its ``cancel`` only when it next runs, which on a busy
        machine, with the UI's threads at a lower priority, can be long after the key."""
        self._cancel.set()

    def _abandon(self) -> None:
        """The reply's reader went away before reading anything: stop the child, free the engine."""
        self._cancel.set()
        self._drain()
        self._busy.release()

    def _events(self, cancel: threading.Event | None) -> Iterator[ChatEvent]:
        ended = False
        try:
            while True:
                message = self._receive(cancel)
                if isinstance(message, Round):
                    self._info = message.info
                    yield from message.events
                    continue
                ended = True
                if isinstance(message, ReplyEnd):
                    self._info = message.info
                    return
                raise _error(message)  # type: ignore[arg-type]
        finally:
            if not ended:  # the caller stopped reading: stop the child and wait for its end
                self._abandon()
            else:
                self._busy.release()

    def _drain(self) -> None:
        try:
            while True:
                if isinstance(self._receive(), (ReplyEnd, Failure)):
                    return
        except EngineError:
            return

    def set_speculation(self, enabled: bool) -> None:
        """Switch speculation in the child, at once, even while a reply streams."""
        self._control_request(SpeculationRequest(enabled), CONTROL_WAIT_S, turn_s=CONTROL_TURN_S)

    def learn(self, texts: Sequence[str]) -> None:
        """Hand the child's drafter earlier chats' messages (see :meth:`ChatBackend.learn`)."""
        self._control_request(LearnRequest(list(texts)), LEARN_WAIT_S)

    def _control_request(self, request: ControlRequest, wait_s: float, turn_s: float | None = None) -> None:
        """Send ``request`` on the control pipe and take its answer within ``wait_s``; a child that
        gives none is ended (an answer that came later would be read as the next request's). A
        request behind another (F5 while the drafter learns earlier chats, up to a second or more)
        waits ``turn_s`` (default ``wait_s``) for its turn, then is refused: it waited on the UI's
        thread for the whole lesson."""
        if not self._control_lock.acquire(timeout=wait_s if turn_s is None else turn_s):
            raise EngineError("the engine is busy handing the drafter earlier chats; try again in a moment")
        try:
            self._send(request, self._control)
            answer: ControlAnswer = self._receive(conn=self._control, within=wait_s)  # type: ignore[assignment]
        finally:
            self._control_lock.release()
        if isinstance(answer, Failure):
            raise answer.error
        self._info = answer.info

    def closing(self) -> None:
        """The app is closing (from any thread, before :meth:`close` waits for the reply): the reply is
        stopped, its child ended if it has not ended it within :data:`CLOSE_ANSWER_S` and is not working,
        and the reply ends with :class:`EngineClosedError`, not as a failure of the engine."""
        self._closing.set()
        self._cancel.set()

    def close(self) -> None:
        """Ask the child to free its models and exit; kill it if it does not (see :data:`CLOSE_ANSWER_S`)."""
        self.closing()
        try:
            self._conn.send(CloseRequest())
        except (OSError, ValueError):
            pass
        self._stop()

    def _stop(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Give the child ``wait_s`` to exit (:data:`CLOSE_ANSWER_S` unless it works), then end it with its
        process group (what it started: a download's pip), and close the pipes."""
        clock = StopClock(self._cpu_seconds, time.monotonic())
        while not self._end.wait(min(POLL_S, wait_s)) and not clock.overdue(time.monotonic(), CLOSE_ANSWER_S,
                                                                             wait_s):
            pass
        self._kill()
        self._conn.close()
        self._control.close()

    def _kill(self) -> None:
        """End the child and its process group now, if it still runs, and reap it."""
        pid = self._process.pid
        if not self._end.ended and pid is not None:
            try:
                if hasattr(os, "killpg") and os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    self._process.kill()
            except (ProcessLookupError, PermissionError):
                pass
            self._end.wait()

    def _send(self, message: ToChild | ControlRequest, conn: Connection | None = None) -> None:
        try:
            (conn or self._conn).send(message)
        except (OSError, ValueError) as exc:
            raise self._died() from exc

    def _receive(self, cancel: threading.Event | None = None, conn: Connection | None = None,
                 stop: threading.Event | None = None, within: float | None = None) -> FromChild | ControlAnswer:
        """The child's next message on ``conn`` (the reply pipe by default); forwards ``cancel``;
        raises :class:`LoadStoppedError` once ``stop`` is set. A child that sends nothing within
        ``within`` seconds, or on the reply pipe within :data:`STOP_WAIT_S` of the reply being told
        to stop, is ended: :class:`EngineDiedError`, saying it hung. Once the app closes, the reply
        pipe's child has :data:`CLOSE_ANSWER_S`: :class:`EngineClosedError`."""
        conn = conn or self._conn
        began = time.monotonic()
        stopping: StopClock | None = None  # since the reply was seen told to stop
        closing: StopClock | None = None  # since the app was seen closing
        try:
            while True:
                if stop is not None and stop.is_set():
                    raise LoadStoppedError("stopped")
                if cancel is not None and cancel.is_set():
                    self._cancel.set()
                if conn.poll(POLL_S):
                    return conn.recv()
                if self._end.ended and not conn.poll():
                    raise self._died()
                now = time.monotonic()
                if within is not None and now - began > within:
                    raise self._hung(f"did not answer within {within:g} s")
                if conn is not self._conn:
                    continue
                if self._closing.is_set():
                    closing = closing or StopClock(self._cpu_seconds, now)
                    if closing.overdue(now, CLOSE_ANSWER_S, CLOSE_WAIT_S):
                        self._kill()
                        raise self._died()
                elif self._cancel.is_set():
                    stopping = stopping or StopClock(self._cpu_seconds, now)
                    if stopping.overdue(now, STOP_WAIT_S):
                        raise self._hung(f"did not stop the reply within {now - stopping.asked:.0f} s of being "
                                         "asked and was not working")
        except (EOFError, OSError) as exc:
            raise self._died() from exc

    def _cpu_seconds(self) -> float | None:
        """The CPU seconds the child has used, or None where it is stopped (SIGSTOP), gone or unknown."""
        return cpu_seconds(self._process.pid)

    def _hung(self, what: str) -> EngineDiedError:
        """End a child that stopped answering; the error that says so."""
        self._kill()
        return EngineDiedError(f"the engine process {what} and was ended{self._at_stake()}")

    def _died(self) -> EngineError:
        """The error for a child whose pipe ended: how it ended, read from :class:`ChildEnd` (one that
        closed its pipe and lives on is of no use, and is ended); once the app closes, that it closed."""
        if self._closing.is_set():
            self._kill()
            return EngineClosedError("the engine was closed while it wrote this reply; the reply keeps what it had")
        if not self._end.wait(DIED_WAIT_S):
            return self._hung("closed its pipe")
        code = self._end.code
        report = crash_report(self._log) if crashed(code) else ""
        return EngineDiedError(f"the engine process {how_it_ended(code)}{self._at_stake()}{report}")

    def _at_stake(self) -> str:
        """What a child's death cost, for its error: a load (a death while loading read "the conversation
        is kept", which means nothing for a load), or nothing of the conversation."""
        return f" while loading {self._loading}" if self._loading is not None else "; the conversation is kept"


def _error(message: FromChild) -> BaseException:
    """The exception a message that should not have come stands for."""
    if isinstance(message, Failure):
        return message.error
    return EngineError(f"the engine process sent {type(message).__name__} out of turn")
