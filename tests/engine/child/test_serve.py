"""The child's loop, run in a thread over pipes with a fake engine: the typed messages it answers with."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

import engine.child.serve as serve_module
import engine.fetch.hublog as hublog
import engine.load.loader as loader
from engine.api import EngineInfo
from engine.child.protocol import (
    ChatRequest, CloseRequest, Failure, Info, LearnRequest, Progress, Ready, ReplyEnd, Round, SpeculationRequest,
)
from engine.config.profiles import ModelProfile, ModelSpec
from engine.errors import EngineError, ModelSourceError
from engine.events import ChatEvent, ChatMessage, GenerationParams, ReplyStats
from tests.conftest import REPO

PROFILE = ModelProfile(name="fake", target=ModelSpec("org/fake"), drafter="ngram")
MESSAGES = [ChatMessage("user", "hi")]
PARAMS = GenerationParams(max_new_tokens=3)


def event(text: str, finish: str | None = None) -> ChatEvent:
    return ChatEvent(text=text, pieces=(), token_ids=(len(text),), stats=ReplyStats(), finish_reason=finish)  # type: ignore[arg-type]


@dataclass
class FakeEngine:
    """A ChatBackend that answers "Hel", "lo"; ``fail_after`` raises after that many events."""

    info: EngineInfo = field(default_factory=lambda: EngineInfo("fake", "org/fake", "n-gram", "ngram", "cpu"))
    asked: list[tuple[Any, Any, Any]] = field(default_factory=list)
    fail_after: int | None = None
    hold: threading.Event | None = None  # the reply waits on it after its first event
    refuse_switch: bool = False
    closed: bool = False
    learned: list[list[str]] = field(default_factory=list)

    def chat(self, messages: Any, params: Any, cancel: Any = None) -> Iterator[ChatEvent]:
        self.asked.append((messages, params, cancel))
        for i, (text, finish) in enumerate([("Hel", None), ("lo", "eos")]):
            if self.fail_after == i:
                raise EngineError("the target ran out of memory")
            yield event(text, finish)
            if self.hold is not None:
                assert self.hold.wait(10)

    def set_speculation(self, enabled: bool) -> None:
        if self.refuse_switch:
            raise EngineError("speculation cannot be switched on this engine")
        self.info = replace(self.info, mode="ngram" if enabled else "plain")

    def learn(self, texts: list[str]) -> None:
        self.learned.append(texts)

    def close(self) -> None:
        self.closed = True


@dataclass
class Child:
    """serve() in a thread, and the parent's ends of its two pipes."""

    conn: Connection
    control: Connection
    thread: threading.Thread
    cancel: threading.Event

    def recv(self) -> Any:
        assert self.conn.poll(10), "the child sent nothing"
        return self.conn.recv()

    def ask(self, enabled: bool) -> Any:
        self.control.send(SpeculationRequest(enabled))
        assert self.control.poll(10), "the control thread did not answer"
        return self.control.recv()

    def ended(self) -> bool:
        self.thread.join(10)
        return not self.thread.is_alive()


@pytest.fixture
def signals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """signal.signal works on the main thread only: record what serve() asks of it instead."""
    calls: list[tuple[Any, ...]] = []
    fake = types.SimpleNamespace(signal=lambda *args: calls.append(args), SIGINT="SIGINT", SIG_IGN="SIG_IGN")
    monkeypatch.setattr(serve_module, "signal", fake)
    monkeypatch.setattr(hublog, "quiet_transformers", lambda: None)  # leaves transformers' logging alone
    return calls


def start(monkeypatch: pytest.MonkeyPatch, load: Any) -> Child:
    monkeypatch.setattr(loader, "load_engine", load)
    conn, child_conn = Pipe()
    control, child_control = Pipe()
    cancel = threading.Event()
    thread = threading.Thread(target=serve_module.serve,
                              args=(child_conn, child_control, cancel, PROFILE, 123, None), daemon=True)
    thread.start()
    return Child(conn, control, thread, cancel)


def loads(engine: FakeEngine, seen: list[tuple[Any, ...]] | None = None) -> Any:
    def load_engine(profile: ModelProfile, memory_budget: int | None = None, progress: Any = None) -> FakeEngine:
        if seen is not None:
            seen.append((profile, memory_budget))
        progress("loading target", 0.5)
        logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 4s [Retry 1/5].")
        return engine
    return load_engine


def test_load_reply_switch_and_close(monkeypatch: pytest.MonkeyPatch, signals: list[tuple[Any, ...]]) -> None:
    engine, seen = FakeEngine(), []
    child = start(monkeypatch, loads(engine, seen))
    assert child.recv() == Progress("loading target", 0.5)
    assert child.recv() == Progress("hub unreachable: retry 1 of 5 in 4 s", None)  # the hub's retries, as progress
    assert child.recv() == Ready(engine.info)
    assert seen == [(PROFILE, 123)] and signals == [("SIGINT", "SIG_IGN")]

    child.conn.send(ChatRequest(MESSAGES, PARAMS))
    assert child.recv() == Round((event("Hel"),), engine.info)  # the first round at once
    assert child.recv() == Round((event("lo", "eos"),), engine.info)  # the last at once
    assert child.recv() == ReplyEnd(engine.info)
    assert engine.asked == [(MESSAGES, PARAMS, child.cancel)]  # the shared cancel event reaches the engine

    answer = child.ask(False)
    assert isinstance(answer, Info) and answer.info.mode == "plain" and engine.info.mode == "plain"
    child.control.send(LearnRequest(["an earlier prompt", "its reply"]))  # the suffix drafter's history
    assert child.control.poll(10) and isinstance(child.control.recv(), Info)
    assert engine.learned == [["an earlier prompt", "its reply"]]

    child.conn.send(CloseRequest())
    assert child.ended() and engine.closed


def test_a_load_error_is_sent_as_a_failure(monkeypatch: pytest.MonkeyPatch, signals: list[tuple[Any, ...]]) -> None:
    def load_engine(profile: ModelProfile, memory_budget: int | None = None, progress: Any = None) -> Any:
        raise ModelSourceError("model not found: org/fake (check the name)")

    child = start(monkeypatch, load_engine)
    message = child.recv()
    assert isinstance(message, Failure) and isinstance(message.error, ModelSourceError)
    assert str(message.error) == "model not found: org/fake (check the name)"
    assert child.ended()  # nothing was loaded: the child is done


def test_an_error_mid_reply_ends_that_reply_only(monkeypatch: pytest.MonkeyPatch, signals: list[tuple[Any, ...]]) -> None:
    engine = FakeEngine(fail_after=1)
    child = start(monkeypatch, loads(engine))
    while not isinstance(child.recv(), Ready):
        pass
    child.conn.send(ChatRequest(MESSAGES, PARAMS))
    assert child.recv() == Round((event("Hel"),), engine.info)
    failure = child.recv()
    assert isinstance(failure, Failure) and str(failure.error) == "the target ran out of memory"
    engine.fail_after = None
    child.conn.send(ChatRequest(MESSAGES, PARAMS))  # the engine answers the next request
    assert [type(child.recv()) for _ in range(3)] == [Round, Round, ReplyEnd]
    child.conn.close()  # the parent went away: the child frees the engine and ends
    assert child.ended() and engine.closed


def test_the_control_pipe_answers_while_a_reply_streams(monkeypatch: pytest.MonkeyPatch,
                                                       signals: list[tuple[Any, ...]]) -> None:
    hold = threading.Event()
    engine = FakeEngine(hold=hold)
    child = start(monkeypatch, loads(engine))
    while not isinstance(child.recv(), Ready):
        pass
    child.conn.send(ChatRequest(MESSAGES, PARAMS))
    assert isinstance(child.recv(), Round)
    answer = child.ask(False)  # the reply is held mid-way: the answer comes from the control thread
    assert isinstance(answer, Info) and answer.info.mode == "plain"
    hold.set()
    last = child.recv()
    assert isinstance(last, Round) and last.info.mode == "plain"  # every message carries the info as it is now
    assert child.recv() == ReplyEnd(engine.info)
    engine.refuse_switch = True
    refused = child.ask(True)
    assert isinstance(refused, Failure) and str(refused.error) == "speculation cannot be switched on this engine"
    child.conn.send(CloseRequest())
    assert child.ended() and engine.closed


def test_the_childs_output_goes_to_its_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "engine.log"
    code = ("import os, sys; from pathlib import Path; from engine.child.serve import _redirect_output; "
            f"_redirect_output(Path({str(log)!r})); print('to stdout', flush=True); "
            "print('to stderr', file=sys.stderr, flush=True); os.write(2, b'raw fd 2\\n')")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""
    assert log.read_text().splitlines() == ["to stdout", "to stderr", "raw fd 2"]
    again = subprocess.run([sys.executable, "-c", code.replace("to stdout", "the next engine")], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert log.read_text().splitlines() == ["the next engine", "to stderr", "raw fd 2"]
    kept = log.with_name("engine.log.1")  # the engine before's log (a crash report), kept once
    assert kept.read_text().splitlines() == ["to stdout", "to stderr", "raw fd 2"]


def test_rounds_go_out_together_the_first_and_the_last_at_once() -> None:
    """A message a round cost the app's reader a wake-up and an unpickling each (pocket: 140 a
    second); the rounds of SEND_EVERY_S travel in one message, none is dropped or reordered."""
    from engine.child.serve import SEND_EVERY_S, RoundBatch

    class Pipe:
        def __init__(self) -> None:
            self.sent: list[Round] = []

        def send(self, message: Round) -> None:
            self.sent.append(message)

    engine, pipe = FakeEngine(), Pipe()
    batch = RoundBatch(pipe, engine)  # type: ignore[arg-type]
    step = SEND_EVERY_S / 4.5  # the fifth round after a message is past SEND_EVERY_S
    texts = [f"t{i}" for i in range(12)]
    for i, text in enumerate(texts):
        batch.add(event(text, "eos" if i == len(texts) - 1 else None), now=100.0 + i * step)
    batch.send()  # nothing left: sends nothing
    assert [len(m.events) for m in pipe.sent] == [1, 5, 5, 1]  # first at once, then every SEND_EVERY_S, the end at once
    assert [e.text for m in pipe.sent for e in m.events] == texts
    batch.add(replace(event("note"), notice="draft dropped"), now=200.0)
    assert pipe.sent[-1].events[-1].notice == "draft dropped"  # a notice is not kept waiting


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process states read from /proc")
def test_the_childs_group_ends_when_its_parent_is_killed(tmp_path) -> None:
    """A terminal closed during a load killed the app but left its engine child, in a process group
    of its own, downloading on its own (a hostile reviewer's). The child's watch ends its group."""
    import time

    root = Path(__file__).resolve().parents[3]
    pids = tmp_path / "pids"
    child = ("import os, sys, subprocess, time; sys.path.insert(0, %r)\n"
             "from engine.child.serve import own_group_ending_with_parent\n"
             "own_group_ending_with_parent(0.1)\n"
             "grandchild = subprocess.Popen(['sleep', '300'])\n"
             "open(%r, 'w').write(f'{os.getpid()} {grandchild.pid}')\n"
             "time.sleep(300)\n") % (str(root), str(pids))
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(300)"])
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        engine, download = map(int, pids.read_text().split())
        assert os.getpgid(engine) == engine and os.getpgid(download) == engine
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        def alive(pid: int) -> bool:  # a zombie (killed, not yet reaped by whoever adopted it) is dead
            try:
                return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            except (FileNotFoundError, ProcessLookupError):
                return False
        while (alive(engine) or alive(download)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(engine) and not alive(download)
    finally:
        parent.kill()
