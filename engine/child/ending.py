"""An engine child's end: read once, by one thread of the parent, and handed to whoever asks.

Why one reader: a child's exit status can be read (``waitpid``) only once. The watcher of
:meth:`~engine.child.backend.ProcessBackend.when_it_ends` joined the process while the reply's
reader joined it too and then read its exit code; the one whose ``waitpid`` lost got ECHILD, read
no code, and the reply ended "the engine process exited (code None)", saved into the history (a
hostile tester's, after ``kill -9`` mid-reply). Now only :class:`ChildEnd`'s thread reaps the child;
the others wait for it to say so.
"""
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

PROGRESS_CPU_S = 0.1
"""CPU seconds a child must have used over a wait (:class:`StopClock`) to count as still working."""

CODE_WAIT_S = 1.0
"""How long the reaper waits for an exit code that another reaper (multiprocessing's own, as a
later engine starts) read first and has not stored yet."""


class ChildEnd:
    """Reaps ``process`` on a thread of its own, once it ends however it ends, and keeps its exit code."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self._ended = threading.Event()
        self._code: int | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        threading.Thread(target=self._reap, name="specchat-engine-reaper", daemon=True).start()

    @property
    def ended(self) -> bool:
        """Whether the child has ended and been reaped (its :attr:`code` is read)."""
        return self._ended.is_set()

    @property
    def code(self) -> int | None:
        """The exit code as multiprocessing gives it (``-signal`` for a signal); None until it ended, or
        where it could not be read."""
        return self._code

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: for good) for the end; answers whether it came."""
        return self._ended.wait(timeout)

    def then(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` from a thread other than the caller's once the child has ended (at once,
        on a thread of its own, if it has already)."""
        with self._lock:
            if not self._ended.is_set():
                self._callbacks.append(callback)
                return
        threading.Thread(target=callback, name="specchat-engine-ended", daemon=True).start()

    def _reap(self) -> None:
        self._process.join()  # the one waitpid on this child
        code = self._process.exitcode
        deadline = time.monotonic() + CODE_WAIT_S
        while code is None and time.monotonic() < deadline:  # another reaper read it and is storing it
            time.sleep(0.01)
            code = self._process.exitcode
        with self._lock:
            self._code = code
            self._ended.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


CRASH_SIGNALS = frozenset(getattr(signal, name) for name in ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE")
                          if hasattr(signal, name))
"""Signals a process gets from its own fault (a bad read in a C kernel, an abort): a crash, not a kill.
A child ended by one was said to be "killed", as if by a user."""


def crashed(code: int | None) -> bool:
    """Whether exit ``code`` (``-signal``) is a crash (:data:`CRASH_SIGNALS`)."""
    return code is not None and -code in CRASH_SIGNALS


def how_it_ended(code: int | None) -> str:
    """The end of a process with exit ``code`` in words, naming its signal (never "code None")."""
    if code is None:
        return "ended"
    if code >= 0:
        return f"exited (code {code})"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if crashed(code):
        return f"crashed ({name})"
    if -code == getattr(signal, "SIGKILL", None):
        return f"was killed ({name}: by another program, or by the system when memory ran out)"
    return f"was killed ({name})"


def cpu_seconds(pid: int | None) -> float | None:
    """The CPU seconds process ``pid`` has used, or None where it is stopped (SIGSTOP), gone or unknown."""
    try:
        process = psutil.Process(pid)
        if process.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE):
            return None
        used = process.cpu_times()
    except (psutil.Error, ValueError, TypeError):
        return None
    return float(used.user + used.system)


class StopClock:
    """How long a child told to stop (its reply, or itself) has had, and whether it is still working: one
    stopped (SIGSTOP), gone, or that used less than :data:`PROGRESS_CPU_S` of CPU over a wait is not, and
    is ended; a slow but working one (a prompt's piece on a slow CPU, a compile) is waited for again."""

    def __init__(self, cpu: Callable[[], float | None], now: float) -> None:
        self._cpu = cpu
        self.asked = self._since = now
        self._cpu_then = cpu()

    def overdue(self, now: float, wait_s: float, limit_s: float | None = None) -> bool:
        """True once ``limit_s`` has passed since it was asked, or ``wait_s`` since the last look with the
        child not working meanwhile; a working child's wait starts again."""
        if limit_s is not None and now - self.asked >= limit_s:
            return True
        if now - self._since <= wait_s:
            return False
        cpu_now = self._cpu()
        if cpu_now is None or self._cpu_then is None or cpu_now - self._cpu_then < PROGRESS_CPU_S:
            return True
        self._since, self._cpu_then = now, cpu_now
        return False
