"""Where engine children are started from: one long-lived thread whose priority is never lowered.

Linux gives a new process the scheduling priority (nice value) of the *thread*
that started it, and a new thread that of its creator. A UI that lowers its own
threads' priority, so that the engine's threads win the cores while a reply
streams (:func:`lower_priority_except_launcher`), would otherwise pass its
lowered priority on to the next engine it loads.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path


class Launcher:
    """Runs jobs (a process's ``start``) on its own thread, made by the first job."""

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


LAUNCHER = Launcher()
"""The process's one launcher."""


def lower_priority_except_launcher(nice: int, keep: Collection[int] = ()) -> int:
    """Raise the nice value of every thread of this process to at least ``nice``, except the
    thread that starts engine children and the threads whose native ids are in ``keep``;
    returns how many threads were changed. Linux only (elsewhere nothing happens). Raising
    one's own nice value needs no privilege (lowering it again does: a kept thread must be
    kept from the start)."""
    tasks = Path("/proc/self/task")
    if not hasattr(os, "setpriority") or not tasks.is_dir():
        return 0
    changed = 0
    for entry in tasks.iterdir():
        tid = int(entry.name)
        if tid == LAUNCHER.native_id or tid in keep:
            continue
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except OSError:  # the thread ended meanwhile
            continue
    return changed


@contextmanager
def real_stderr() -> Iterator[None]:
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
