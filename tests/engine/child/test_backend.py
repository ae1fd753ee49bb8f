"""The engine in a child process (engine.child.backend): the same replies, cancel, errors, a dead child."""
from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.child.backend import ProcessBackend
from engine.errors import EngineBusyError, EngineDiedError, LoadStoppedError, ModelSourceError
from engine.events import ChatMessage, GenerationParams
from engine.load.loader import load_engine
from engine.config.profiles import profile_from_sources
from tests.tiny import save_tiny

MESSAGES = [ChatMessage("user", "w1 w2 w3 w4 w1 w2")]
PARAMS = GenerationParams(max_new_tokens=24)


@pytest.fixture(scope="module")
def talker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("child") / "talker", seed=5)  # writes text before its EOS


@pytest.fixture(scope="module")
def backend(talker: Path) -> Iterator[ProcessBackend]:
    stages: list[str] = []
    started = ProcessBackend.start(profile_from_sources(str(talker)), None, lambda s, f: stages.append(s),
                                   threads=1)
    assert "ready" in stages  # the child's progress reached the parent
    yield started
    started.close()


def reply_ids(events) -> list[int]:  # type: ignore[no-untyped-def]
    return [t for e in events for t in e.token_ids]


def test_the_child_replies_with_the_tokens_the_in_process_engine_writes(backend, talker) -> None:
    local = load_engine(profile_from_sources(str(talker)))
    try:
        expected = reply_ids(local.chat(MESSAGES, PARAMS))
    finally:
        local.close()
    assert expected
    events = list(backend.chat(MESSAGES, PARAMS))
    assert reply_ids(events) == expected
    assert events[-1].finish_reason is not None
    assert backend.info.mode == events[-1].stats.mode  # the info came back with the reply's end
    assert backend.info.profile == "cli" and backend.info.target == local.info.target


def test_cancel_stops_the_reply_and_the_engine_answers_again(backend) -> None:
    cancel = threading.Event()
    cancel.set()
    reply = backend.chat(MESSAGES, PARAMS, cancel)
    time.sleep(1.0)  # the child has the request before the reply is read: the cancel must be there already
    events = list(reply)
    assert events[-1].finish_reason == "cancelled" and reply_ids(events) == []
    assert reply_ids(backend.chat(MESSAGES, PARAMS))


def test_a_reply_left_unread_frees_the_engine(backend) -> None:
    events = backend.chat(MESSAGES, PARAMS)
    next(events)
    with pytest.raises(EngineBusyError):
        backend.chat(MESSAGES, PARAMS)
    events.close()  # the reader went away: the child is stopped and drained
    assert reply_ids(backend.chat(MESSAGES, PARAMS))


def test_a_reply_never_read_frees_the_engine(backend) -> None:
    unread = backend.chat(MESSAGES, PARAMS)
    del unread  # dropped before its first event: no generator cleanup ran for it
    gc.collect()
    assert reply_ids(backend.chat(MESSAGES, PARAMS))
    closed = backend.chat(MESSAGES, PARAMS)
    closed.close()
    assert reply_ids(backend.chat(MESSAGES, PARAMS))


def test_speculation_switches_in_the_child(backend) -> None:
    backend.set_speculation(False)
    assert backend.info.mode == "plain"
    plain = list(backend.chat(MESSAGES, PARAMS))
    assert plain[-1].stats.mode == "plain"
    backend.set_speculation(True)
    assert backend.info.mode == "ngram" and backend.info.fallback_reason is None


def test_speculation_switches_while_a_reply_streams(backend) -> None:
    """F5 mid-reply: answered by the child's control thread, not after the reply."""
    events = backend.chat(MESSAGES, GenerationParams(max_new_tokens=200, stop_token_ids=(10_000,)))
    next(events)
    backend.set_speculation(False)  # would wait for the whole reply on the reply pipe
    assert backend.info.mode == "plain"
    rest = list(events)
    assert rest and rest[-1].stats.mode == "plain"
    backend.set_speculation(True)


def test_a_load_error_is_raised_as_the_child_raised_it(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError) as err:
        ProcessBackend.start(profile_from_sources(str(tmp_path / "missing")), None, threads=1)
    assert "missing" in str(err.value)


def test_a_log_that_cannot_be_written_leaves_the_engine_running_without_one(talker, tmp_path: Path) -> None:
    """A state folder that was read-only or a file ended every engine at its start: the app's every
    load failed with "the engine process exited (code 1)" (a hostile tester's)."""
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state folder should be")
    backend = ProcessBackend.start(profile_from_sources(str(talker)), None, log=blocker / "engine.log", threads=1)
    try:
        assert backend.log_note is not None and str(blocker / "engine.log") in backend.log_note
        assert "SPECCHAT_STATE_DIR" in backend.log_note
        assert reply_ids(backend.chat(MESSAGES, PARAMS))  # it answers all the same
    finally:
        backend.close()
    assert blocker.read_text() == "a file where the state folder should be"


def test_the_child_takes_the_null_device_when_its_log_cannot_be_opened(tmp_path: Path) -> None:
    """The folder made read-only between the parent's look and the child's open: the child still starts."""
    import subprocess

    (tmp_path / "state").write_text("not a folder")
    code = ("import os, sys; from pathlib import Path; from engine.child.serve import _redirect_output; "
            f"_redirect_output(Path({str(tmp_path / 'state' / 'engine.log')!r})); print('still here'); "
            "sys.stdout.flush(); os.write(3, b'ok')")
    read_end, write_end = os.pipe()
    done = subprocess.run([sys.executable, "-c", code.replace("os.write(3,", f"os.write({write_end},")],
                          pass_fds=(write_end,), cwd=Path(__file__).resolve().parents[3], capture_output=True)
    os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert os.read(read_end, 10) == b"ok" and done.stdout == b""  # its output went nowhere, not to the screen
    os.close(read_end)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_killed_child_ends_the_reply_with_an_engine_error(talker, tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    backend = ProcessBackend.start(profile_from_sources(str(talker)), None, log=log, threads=1)
    try:
        assert log.exists()  # the child's output goes to the log, not over a full-screen UI
        assert backend.pid is not None and backend.alive
        os.kill(backend.pid, signal.SIGKILL)
        with pytest.raises(EngineDiedError, match=r"engine process was killed \(SIGKILL: by another program"):
            list(backend.chat(MESSAGES, PARAMS))
        assert not backend.alive  # the app loads the profile again (app.ui.engine_control.EngineControl.on_reply_finished)
    finally:
        backend.close()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_child_that_ends_while_idle_is_told_at_once(talker) -> None:
    """Killed while no reply streamed, the engine was noticed only when the next prompt failed
    (a tester): a watcher on the process's sentinel says so as it ends, and on close too."""
    import threading

    backend = ProcessBackend.start(profile_from_sources(str(talker)), None, threads=1)
    ended = threading.Event()
    try:
        backend.when_it_ends(ended.set)
        assert not ended.wait(0.3)  # alive: nothing said
        assert backend.pid is not None
        os.kill(backend.pid, signal.SIGKILL)
        assert ended.wait(10) and not backend.alive
    finally:
        backend.close()
    closed = ProcessBackend.start(profile_from_sources(str(talker)), None, threads=1)
    told = threading.Event()
    closed.when_it_ends(told.set)
    closed.close()
    assert told.wait(10)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP")
def test_a_child_that_stops_answering_is_ended_and_said_to_hang(talker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child stopped (SIGSTOP) or wedged held the engine for good: Esc, a switch and ctrl+q waited on
    the reply's reader, and F5 froze the UI on its answer (a hostile tester's). Told to stop, a reply
    now has STOP_WAIT_S to end, and F5's request CONTROL_WAIT_S to be answered."""
    import engine.child.backend as backend_module

    monkeypatch.setattr(backend_module, "STOP_WAIT_S", 1.0)
    monkeypatch.setattr(backend_module, "CONTROL_WAIT_S", 0.5)
    for ask in ("reply", "switch"):
        backend = ProcessBackend.start(profile_from_sources(str(talker)), None, threads=1)
        try:
            assert backend.pid is not None
            os.kill(backend.pid, signal.SIGSTOP)
            began = time.monotonic()
            if ask == "reply":
                reply = backend.chat(MESSAGES, PARAMS)
                threading.Timer(0.3, backend.interrupt).start()  # Esc, from the keyboard's thread
                with pytest.raises(EngineDiedError, match=r"did not stop the reply within \d+ s of being asked "
                                                          "and was not working"):
                    list(reply)
            else:
                with pytest.raises(EngineDiedError, match="did not answer within 0.5 s"):
                    backend.set_speculation(False)
            assert time.monotonic() - began < 8 and not backend.alive  # ended, so the app loads it again
        finally:
            backend.close()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP")
def test_a_child_still_working_when_told_to_stop_is_waited_for(talker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A healthy child slow to end a reply (a draft reading a long prompt on a slow CPU, a compile on a
    card) is not ended as hung while it uses the CPU (a review's): here it reads as working."""
    import itertools

    import engine.child.backend as backend_module

    monkeypatch.setattr(backend_module, "STOP_WAIT_S", 0.5)
    backend = ProcessBackend.start(profile_from_sources(str(talker)), None, threads=1)
    try:
        seconds = itertools.count(0.0, 1.0)
        monkeypatch.setattr(ProcessBackend, "_cpu_seconds", lambda self: next(seconds))  # a second a look
        assert backend.pid is not None
        os.kill(backend.pid, signal.SIGSTOP)
        reply = backend.chat(MESSAGES, PARAMS)
        threading.Timer(0.3, backend.interrupt).start()
        threading.Timer(2.5, os.kill, (backend.pid, signal.SIGCONT)).start()  # five waits later it answers
        events = list(reply)
        assert events[-1].finish_reason == "cancelled" and backend.alive
    finally:
        backend.close()


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups")
def test_a_stopped_load_ends_the_child_and_what_it_started(talker) -> None:
    """Esc during a load (app.ui.loading): the child and its process group (a download's pip, here a
    `sleep` put in that group) end at once, and the load raises LoadStoppedError naming the profile."""
    import multiprocessing
    import subprocess

    stop = threading.Event()
    started: list[subprocess.Popen[bytes]] = []
    before = {p.pid for p in multiprocessing.active_children()}  # the module's backend has a child too

    def progress(stage: str, fraction: float | None) -> None:
        if started:
            return
        child = next(p for p in multiprocessing.active_children()
                     if p.name.startswith("specchat-engine-") and p.pid not in before)
        assert child.pid is not None and os.getpgid(child.pid) == child.pid  # a group of its own
        group = child.pid
        started.append(subprocess.Popen(["sleep", "300"], preexec_fn=lambda: os.setpgid(0, group)))
        stop.set()

    t0 = time.monotonic()
    with pytest.raises(LoadStoppedError, match="Stopped loading cli"):
        ProcessBackend.start(profile_from_sources(str(talker)), None, progress, threads=1, stop=stop)
    assert time.monotonic() - t0 < 30
    assert started and started[0].wait(timeout=10) == -signal.SIGKILL
    assert not [p for p in multiprocessing.active_children() if p.pid not in before]


def test_a_switch_behind_a_lesson_is_refused_not_waited_for(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """F5 runs on the UI's thread: behind a drafter's lesson (which may take a second or more) it
    waited for all of it (a review's). It now waits CONTROL_TURN_S for its turn."""
    import engine.child.backend as backend_module
    from engine.errors import EngineError

    monkeypatch.setattr(backend_module, "CONTROL_TURN_S", 0.2)
    assert backend._control_lock.acquire()  # a lesson holds the pipe
    try:
        began = time.monotonic()
        with pytest.raises(EngineError, match="busy handing the drafter earlier chats; try again"):
            backend.set_speculation(False)
        assert time.monotonic() - began < 2
    finally:
        backend._control_lock.release()
    backend.set_speculation(True)  # its turn: answered


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_dead_child_is_reaped_once_and_its_end_said_with_its_signal(talker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed mid-reply with its end watched (the app's when_it_ends), the child was reaped by two threads:
    the loser's waitpid got ECHILD and the reply ended "the engine process exited (code None)", saved into
    the history (a hostile tester's). Here another thread reaps it first and is slow to come back with
    what it read, as a thread waiting for the GIL is; the reply's reader (this thread) comes second."""
    real_waitpid = os.waitpid

    def racing_waitpid(pid: int, options: int) -> tuple[int, int]:
        if threading.current_thread() is threading.main_thread():
            time.sleep(0.2)  # the reply's reader comes second
            return real_waitpid(pid, options)
        got = real_waitpid(pid, options)
        if got[0] == pid:
            time.sleep(0.5)  # read, not yet stored
        return got

    backend = ProcessBackend.start(profile_from_sources(str(talker)), None, threads=1)
    try:
        ended = threading.Event()
        backend.when_it_ends(ended.set)
        reply = backend.chat(MESSAGES, GenerationParams(max_new_tokens=100_000, stop_token_ids=(10_000,)))
        next(reply)
        monkeypatch.setattr(os, "waitpid", racing_waitpid)
        assert backend.pid is not None
        os.kill(backend.pid, signal.SIGKILL)
        with pytest.raises(EngineDiedError) as died:
            list(reply)
        assert "engine process was killed (SIGKILL" in str(died.value) and "None" not in str(died.value)
        assert ended.wait(10) and not backend.alive
    finally:
        backend.close()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGSEGV")
def test_a_crashed_child_is_said_to_crash_and_leaves_its_report_in_the_log(talker, tmp_path: Path) -> None:
    """`kill -SEGV` mid-reply read "the engine process was killed", and the log was empty, so none was kept
    as engine.log.1 when the app loaded the engine again (a hostile tester's). The child's faulthandler now
    writes its stacks to the log, and the error names the signal and the log."""
    log = tmp_path / "engine.log"
    backend = ProcessBackend.start(profile_from_sources(str(talker)), None, log=log, threads=1)
    try:
        reply = backend.chat(MESSAGES, GenerationParams(max_new_tokens=100_000, stop_token_ids=(10_000,)))
        next(reply)
        assert backend.pid is not None
        os.kill(backend.pid, signal.SIGSEGV)
        with pytest.raises(EngineDiedError) as died:
            list(reply)
        said = str(died.value)
        assert "crashed (SIGSEGV)" in said and "the conversation is kept" in said and str(log) in said
        assert "engine.log.1" in said
    finally:
        backend.close()
    report = log.read_text()
    assert "Segmentation fault" in report
    again = ProcessBackend.start(profile_from_sources(str(talker)), None, log=log, threads=1)  # the app's reload
    again.close()
    assert (tmp_path / "engine.log.1").read_text() == report


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_child_that_dies_while_loading_says_so(talker) -> None:
    """Killed during the app's reload, the load failed with "the engine process was killed; the conversation
    is kept" (a hostile tester's): no conversation is at stake in a load, and it did not say it was loading."""
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}  # the module's backend has a child too
    killed: list[int] = []

    def progress(stage: str, fraction: float | None) -> None:
        if not killed:
            child = next(p for p in multiprocessing.active_children()
                         if p.name.startswith("specchat-engine-") and p.pid not in before)
            assert child.pid is not None
            killed.append(child.pid)
            os.kill(child.pid, signal.SIGKILL)

    with pytest.raises(EngineDiedError) as died:
        ProcessBackend.start(profile_from_sources(str(talker)), None, progress, threads=1)
    said = str(died.value)
    assert killed and said.startswith("the engine process was killed (SIGKILL") and "while loading cli" in said
    assert "conversation" not in said


@pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP")
def test_closing_ends_a_stopped_child_soon_and_its_reply_as_closed(talker, monkeypatch: pytest.MonkeyPatch) -> None:
    """ctrl+q with the engine stopped (SIGSTOP) mid-reply waited out STOP_WAIT_S on a blank screen, and the
    reply was saved as failed: "did not stop the reply within 10 s of being asked ... and was ended", though
    the user simply quit (a hostile tester's). Closing gives the child CLOSE_ANSWER_S, not STOP_WAIT_S nor
    CLOSE_WAIT_S, and the reply ends as closed, not as a failure."""
    import engine.child.backend as backend_module
    from engine.errors import EngineClosedError

    monkeypatch.setattr(backend_module, "STOP_WAIT_S", 600.0)
    monkeypatch.setattr(backend_module, "CLOSE_WAIT_S", 600.0)
    backend = ProcessBackend.start(profile_from_sources(str(talker)), None, threads=1)
    try:
        reply = backend.chat(MESSAGES, GenerationParams(max_new_tokens=100_000, stop_token_ids=(10_000,)))
        next(reply)
        assert backend.pid is not None
        os.kill(backend.pid, signal.SIGSTOP)
        began = time.monotonic()
        threading.Timer(0.3, backend.closing).start()  # the app closes (app.ui.engine_host.EngineHost.close)
        with pytest.raises(EngineClosedError):
            list(reply)
        assert time.monotonic() - began < 60 and not backend.alive
    finally:
        backend.close()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP")
def test_close_ends_a_stopped_idle_child_without_waiting_it_out(talker) -> None:
    """Closing an idle child that does not answer (stopped) waited CLOSE_WAIT_S (10 s) before killing it; a
    child that is not working is ended after CLOSE_ANSWER_S (1 s), and a healthy one still exits of itself."""
    healthy = ProcessBackend.start(profile_from_sources(str(talker)), None, threads=1)
    healthy.close()
    assert healthy._end.code == 0  # freed its models and exited, not killed
    backend = ProcessBackend.start(profile_from_sources(str(talker)), None, threads=1)
    assert backend.pid is not None
    os.kill(backend.pid, signal.SIGSTOP)
    began = time.monotonic()
    backend.close()
    assert time.monotonic() - began < 5 and not backend.alive
