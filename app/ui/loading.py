"""Loading a profile's models: the loader, the threads it may use, and a switch in place.

Local profiles load in the engine's child process (:mod:`engine.child.backend`), server
profiles connect here. A switch loads the new pair next to the old one and
closes the old one only once the new one is ready (or first, when the memory
plan says they do not fit together): :func:`load_beside`, run in a worker thread.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.ui.messages import EngineFailed, EngineReady
from engine.api import ChatBackend
from engine.progress import ProgressFn
from engine.environment import UI_NICE as UI_NICE_ENV, threads, whole
from engine.errors import LoadStoppedError, SpecChatError

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile

Loader = Callable[["ModelProfile", "int | None", ProgressFn, threading.Event], ChatBackend]
"""Loads a profile's backend (``default_loader``; tests pass fakes). Its last argument is set when
the user stops the load (Esc): the loader then ends what it runs and raises
:class:`~engine.errors.LoadStoppedError`."""

ENGINE_LOG = "engine.log"


def default_loader(profile: "ModelProfile", memory_budget: int | None, progress: ProgressFn,
                   stop: threading.Event) -> ChatBackend:
    """Load the engine for real (seconds to minutes; runs in a worker thread).

    Local models load in a child process (:mod:`engine.child.backend`): the decode loop
    then never waits for the UI's Python, and ``stop`` ends the load, downloads and
    all, by ending that process. Its output goes to ``engine.log`` in the user state
    dir. A server profile only talks HTTP and stays here: its connect (each of the host's
    addresses in turn, up to the connect timeout each) and probes (each answer within twice
    :meth:`engine.remote.backend.ServerBackend.probe_timeout`) run in a thread of their own, which
    ``stop`` leaves behind at once (:func:`abandonable`)."""
    if profile.backend != "server":  # torch is imported in the child only (app.ui.collector says why)
        from engine.child.backend import ProcessBackend
        from engine.paths import state_dir

        return ProcessBackend.start(profile, memory_budget, progress, log=state_dir() / ENGINE_LOG,
                                    threads=engine_threads(), stop=stop)
    from engine.fetch.hublog import hub_messages_as_progress
    from engine.load.loader import load_engine

    def connect() -> ChatBackend:
        with hub_messages_as_progress(progress):  # hub retries as progress, not raw text over the screen
            return load_engine(profile, memory_budget=memory_budget, progress=progress)

    return abandonable(connect, stop, f"Stopped loading {profile.name}.")


STOP_POLL_S = 0.05
"""How often :func:`abandonable` looks at its stop flag."""


def abandonable(load: Callable[[], ChatBackend], stop: threading.Event, stopped: str) -> ChatBackend:
    """``load()`` in a daemon thread, waited for until it answers or ``stop`` is set; then
    :class:`~engine.errors.LoadStoppedError` (``stopped``, its message) is raised at once, and a
    backend the abandoned load still brings is closed when it comes (a server that answers late
    holds nothing of ours). Its errors are raised here as they are."""
    lock, done = threading.Lock(), threading.Event()
    outcome: list[ChatBackend | BaseException] = []
    abandoned = False

    def run() -> None:
        try:
            result: ChatBackend | BaseException = load()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, raised there
            result = exc
        with lock:
            outcome.append(result)
            late = abandoned
        done.set()
        if late and not isinstance(result, BaseException):
            result.close()

    threading.Thread(target=run, name="load", daemon=True).start()
    while True:
        with lock:
            if stop.is_set():  # before a result: Esc pressed as the server answered still stops
                abandoned = True
                came = outcome[0] if outcome else None
                break
            if outcome:
                result = outcome[0]
                if isinstance(result, BaseException):
                    raise result
                return result
        done.wait(STOP_POLL_S)
    if came is not None and not isinstance(came, BaseException):
        came.close()
    raise LoadStoppedError(stopped)


UI_NICE = 0
"""Nice value the UI's threads take once a local engine is loaded (Linux; 0: unchanged;
``SPECCHAT_UI_NICE`` sets it). Not lowered by default: on a machine with other work the
lowered UI starves. Measured on 2 shared cores (scripts/app_speed.py, tmux): at nice 10 a
key typed while a reply streamed echoed after 0.48-1.32 s and Esc showed "stopped" after
1.07-1.13 s, against 15-40 ms and 0.22-0.46 s at nice 0. The UI stays light instead: the
a key leaves the UI a core for a moment (:meth:`EngineHost.yield_to_ui`), and Esc stops the
engine from the keyboard's own thread (:meth:`EngineHost.interrupt`)."""


def engine_threads() -> int | None:
    """Torch threads for the app's engine: ``SPECCHAT_THREADS``, else None (torch's default:
    every core; it ran on every core but one, 0.66x of ``specchat generate`` on 2 cores)."""
    return threads()


def ui_nice() -> int:
    """:data:`UI_NICE`, or ``SPECCHAT_UI_NICE``."""
    nice = whole(UI_NICE_ENV, 0, 19)
    return UI_NICE if nice is None else nice


def key_threads() -> set[int]:
    """Native ids of the threads that read the keyboard (Textual's ``textual-input``): they
    keep their priority when the UI lowers its own."""
    import threading

    return {t.native_id for t in threading.enumerate() if t.name == "textual-input" and t.native_id is not None}


def needs_room(exc: BaseException) -> bool:
    """True when a load failed for lack of memory that closing the loaded models could free
    (planned, or a real out-of-memory error); not when the profile's own budget is the limit."""
    from engine.model.device import Device
    from engine.errors import MemoryPlanError

    return (isinstance(exc, MemoryPlanError) and exc.room_helps) or Device.is_out_of_memory(exc)


def error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, SpecChatError) else f"{type(exc).__name__}: {exc}"


def load_beside(loader: Loader, memory_budget: int | None, profile: "ModelProfile", old: ChatBackend | None,
                old_profile: "ModelProfile | None", progress: ProgressFn,
                stop: threading.Event | None = None,
                quitting: threading.Event | None = None) -> EngineReady | EngineFailed:
    """Load ``profile`` next to the old backend, closing the old one once the new is ready.

    When the new one does not fit next to the old (the memory plan says so, or
    loading runs out of memory), the old one is closed first and the new one tried
    again; if that fails too the old profile is loaded again. Any other failure,
    and a load the user stops (``stop`` set), leaves the old backend as it was (or
    loads it again where it was closed to make room). Never ends with no model
    unless even reloading the old profile fails (then the message says so). Runs in
    a worker thread; the answer is the message to post to the UI. ``quitting`` (the app closes)
    stops the way back to the old pair too, which Esc does not.
    """
    stop = stop if stop is not None else threading.Event()

    def close(backend: ChatBackend) -> None:
        try:
            backend.close()
        except Exception as exc:  # closing must not block loading the next one
            progress(f"previous models closed with an error: {exc}", None)

    try:
        backend = loader(profile, memory_budget, progress, stop)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none is a traceback
        error, stopped = error_text(exc), isinstance(exc, LoadStoppedError)
        if old is None or old_profile is None:
            return EngineFailed(error, profile.name, stopped=stopped)
        if not needs_room(exc):
            return EngineFailed(error, profile.name, (old, old_profile), stopped=stopped)
        progress(f"{profile.name} does not fit next to {old_profile.name}: unloading it first", None)
        close(old)
        try:
            backend = loader(profile, memory_budget, progress, stop)
        except Exception as again:  # noqa: BLE001
            error, stopped = error_text(again), isinstance(again, LoadStoppedError)
            progress(f"loading {old_profile.name} again", None)
            # The way back is not stopped by Esc: Esc stops the new profile's load, and the models
            # loaded before stay (a second Esc here left no model loaded at all).
            try:
                restored = loader(old_profile, memory_budget, progress, quitting or threading.Event())
            except Exception as lost:  # noqa: BLE001
                return EngineFailed(f"{error.rstrip('.')}. Reloading {old_profile.name} failed too: "
                                    f"{error_text(lost)}", profile.name)
            return EngineFailed(error, profile.name, (restored, old_profile), stopped=stopped)
    if old is not None:
        close(old)
    return EngineReady(backend, profile)
