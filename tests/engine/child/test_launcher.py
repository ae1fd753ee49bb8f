"""The launcher thread that starts engine children, the priority lowering that spares it, and the real stderr."""
from __future__ import annotations

import io
import os
import sys
import threading
import types
from pathlib import Path

import pytest

from engine.child import launcher
from engine.child.backend import ProcessBackend
from engine.child.launcher import LAUNCHER, Launcher, lower_priority_except_launcher, real_stderr
from engine.config.profiles import profile_from_sources
from engine.events import ChatMessage, GenerationParams
from tests.tiny import save_tiny

MESSAGES = [ChatMessage("user", "w1 w2 w3 w4 w1 w2")]
PARAMS = GenerationParams(max_new_tokens=24)
LINUX_THREADS = pytest.mark.skipif(not hasattr(os, "setpriority") or not os.path.isdir("/proc/self/task"),
                                   reason="Linux threads")


@pytest.fixture(scope="module")
def talker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("child") / "talker", seed=5)  # writes text before its EOS


def reply_ids(events) -> list[int]:  # type: ignore[no-untyped-def]
    return [t for e in events for t in e.token_ids]


def test_every_job_runs_on_the_one_launcher_thread() -> None:
    fresh = Launcher()
    assert fresh.native_id is None  # no thread until the first job
    ran: list[threading.Thread] = []
    callers = [threading.Thread(target=fresh.run, args=(lambda: ran.append(threading.current_thread()),))
               for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(10)
    fresh.run(lambda: ran.append(threading.current_thread()))  # run() waits for the job
    assert len(ran) == 5 and len(set(ran)) == 1
    (thread,) = set(ran)
    assert thread.name == "specchat-engine-launcher" and thread.daemon
    assert thread is not threading.current_thread() and fresh.native_id == thread.native_id


def test_a_jobs_exception_is_raised_in_the_caller_and_the_launcher_goes_on() -> None:
    fresh = Launcher()
    error = OSError("bad value(s) in fds_to_keep")

    def fail() -> None:
        raise error

    with pytest.raises(OSError) as caught:
        fresh.run(fail)
    assert caught.value is error
    done: list[int] = []
    fresh.run(lambda: done.append(1))
    assert done == [1]


@LINUX_THREADS
def test_lowering_skips_the_launcher_and_threads_already_low(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = Launcher()
    fresh.run(lambda: None)
    monkeypatch.setattr(launcher, "LAUNCHER", fresh)
    me = threading.get_native_id()
    nice = {int(t): 0 for t in os.listdir("/proc/self/task")}
    nice[me] = 12  # already lower than asked
    changed: dict[int, int] = {}
    monkeypatch.setattr(os, "getpriority", lambda which, tid: nice.get(tid, 0))
    monkeypatch.setattr(os, "setpriority", lambda which, tid, value: changed.__setitem__(tid, value))
    release = threading.Event()
    other = threading.Thread(target=release.wait, args=(10,))  # a UI thread at the default priority
    keys = threading.Thread(target=release.wait, args=(10,))  # the thread that reads the keyboard
    other.start()
    keys.start()
    try:
        assert keys.native_id is not None
        count = lower_priority_except_launcher(5, keep={keys.native_id})
    finally:
        release.set()
        other.join()
        keys.join()
    assert changed.get(other.native_id) == 5 and set(changed.values()) == {5} and count == len(changed)
    assert fresh.native_id not in changed and me not in changed and keys.native_id not in changed


@LINUX_THREADS
def test_a_thread_that_ends_meanwhile_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(which: int, tid: int) -> int:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(os, "getpriority", gone)
    assert lower_priority_except_launcher(5) == 0


def test_nothing_is_lowered_where_threads_have_no_priority_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "os", types.SimpleNamespace())  # no setpriority (not Linux)
    assert lower_priority_except_launcher(5) == 0


def test_real_stderr_puts_the_interpreters_stderr_back_for_a_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in = io.StringIO()  # what a full-screen UI puts there: fileno() does not work
    monkeypatch.setattr(sys, "stderr", stand_in)
    with real_stderr():
        assert sys.stderr is sys.__stderr__
    assert sys.stderr is stand_in
    with pytest.raises(ValueError, match="failed start"):
        with real_stderr():
            raise ValueError("failed start")
    assert sys.stderr is stand_in


@LINUX_THREADS
def test_a_ui_that_lowers_its_priority_still_starts_engines_at_the_old_one(talker) -> None:
    """Linux hands a new process its creating thread's nice value: children start from the
    launcher thread, which lower_priority_except_launcher leaves alone."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    LAUNCHER.run(lambda: None)  # the launcher exists, at the process's priority
    result: dict[str, object] = {}

    def lowered_ui_thread() -> None:  # a thread of its own: raising nice cannot be undone unprivileged
        lower_priority_except_launcher(before + 5)
        result["ui"] = os.getpriority(os.PRIO_PROCESS, 0)
        backend = ProcessBackend.start(profile_from_sources(str(talker)), None, threads=1)
        try:
            result["child"] = os.getpriority(os.PRIO_PROCESS, backend.pid)
            result["reply"] = reply_ids(backend.chat(MESSAGES, PARAMS))
        finally:
            backend.close()

    thread = threading.Thread(target=lowered_ui_thread)
    thread.start()
    thread.join()
    for task in os.listdir("/proc/self/task"):  # put the test process back where allowed (root)
        try:
            os.setpriority(os.PRIO_PROCESS, int(task), before)
        except OSError:
            pass
    assert result["ui"] == before + 5 and result["child"] == before and result["reply"]


def test_interrupt_stops_the_childs_reply_from_another_thread(talker) -> None:
    """Esc's thread stops the engine itself: the reply's reader need not run first."""
    backend = ProcessBackend.start(profile_from_sources(str(talker), "none"), None, threads=1)
    try:
        events = backend.chat(MESSAGES, GenerationParams(max_new_tokens=200, stop_token_ids=(10_000,)))
        first = next(events)
        stopper = threading.Thread(target=backend.interrupt)
        stopper.start()
        stopper.join(5)
        rest = list(events)
        assert rest[-1].finish_reason == "cancelled"
        assert len(first.token_ids) + sum(len(e.token_ids) for e in rest) < 200
        again = list(backend.chat(MESSAGES, GenerationParams(max_new_tokens=4)))  # the next reply is not cancelled
        assert again[-1].finish_reason != "cancelled"
    finally:
        backend.close()


def test_the_child_runs_a_thread_fewer_only_while_the_ui_asks() -> None:
    from engine.child.serve import threads_now

    assert threads_now(2, now=10.0, yield_until=10.25) == 1  # a key came: leave the UI a core
    assert threads_now(2, now=10.3, yield_until=10.25) == 2  # then every core again
    assert threads_now(1, now=10.0, yield_until=10.25) == 1  # never none
    assert threads_now(8, now=0.0, yield_until=0.0) == 8
    assert threads_now(2, now=10.0, yield_until=10.25, cores=2) == 1  # the engine takes every core
    assert threads_now(4, now=10.0, yield_until=10.25, cores=8) == 4  # a core is free already: keep every thread


def test_a_reply_goes_on_while_the_ui_asks_for_a_core(talker) -> None:
    backend = ProcessBackend.start(profile_from_sources(str(talker), "none"), None, threads=2)
    try:
        params = GenerationParams(max_new_tokens=40, stop_token_ids=(10_000,))
        events = backend.chat(MESSAGES, params)
        ids = list(next(events).token_ids)
        backend.yield_to_ui(60.0)
        assert backend._yield_until.value > 0
        for event in events:
            ids.extend(event.token_ids)
        assert len(ids) == 40
        backend.yield_to_ui(0.0)
        assert len(reply_ids(backend.chat(MESSAGES, params))) == 40  # and the next reply on every thread
    finally:
        backend.close()


def test_the_child_waits_for_its_threads_as_generate_does(talker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is added to the engine child's environment: sleeping OpenMP waits (PASSIVE) made the
    app slowest on a quiet machine (engine/child/backend.py, at the child's start)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    backend = ProcessBackend.start(profile_from_sources(str(talker), "none"), None, threads=1)
    try:
        environ = Path(f"/proc/{backend.pid}/environ")
        if environ.exists():
            assert not any(v.startswith(b"OMP_WAIT_POLICY=") for v in environ.read_bytes().split(b"\0"))
    finally:
        backend.close()
