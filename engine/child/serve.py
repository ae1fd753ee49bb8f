"""The child's side: load the profile, then answer requests until told to close or the pipe ends."""
from __future__ import annotations

import os
import signal
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from engine.api import ChatBackend
from engine.child.protocol import (
    ChatRequest, ControlRequest, Info, LearnRequest, Progress, Ready, ReplyEnd, Round, failure,
)

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event as ProcessEvent

    from engine.config.profiles import ModelProfile


def serve(conn: Connection, control: Connection, cancel: "ProcessEvent", profile: "ModelProfile",
          memory_budget: int | None, log: Path | None, threads: int | None = None) -> None:
    """The child's main loop (the target of the spawned process).

    ``log``: a file that takes the child's stdout and stderr; ``threads``: torch's
    intra-op threads (None: torch's default)."""
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
        conn.send(Progress(stage, fraction))

    try:
        with hub_messages_as_progress(progress):
            engine = load_engine(profile, memory_budget=memory_budget, progress=progress)
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        conn.send(failure(exc))
        return
    conn.send(Ready(engine.info))
    threading.Thread(target=_answer_control, args=(engine, control), name="control", daemon=True).start()
    try:
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                return
            if not isinstance(request, ChatRequest):
                return  # CloseRequest
            try:
                for event in engine.chat(request.messages, request.params, cancel):
                    conn.send(Round(event, engine.info))
                conn.send(ReplyEnd(engine.info))
            except Exception as exc:  # noqa: BLE001 - the parent raises it in its thread
                conn.send(failure(exc))
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
    """Point this process's stdout and stderr (file descriptors 1 and 2) at ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
