"""An engine child's end in words (engine.child.ending): a crash by its signal, a kill, an exit, never "code None"."""
from __future__ import annotations

import signal
import sys

import pytest

from engine.child.ending import crashed, how_it_ended


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("name", ["SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE"])
def test_a_fault_signal_is_a_crash_named_by_its_signal(name: str) -> None:
    code = -getattr(signal, name)
    assert crashed(code) and how_it_ended(code) == f"crashed ({name})"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_kill_is_not_a_crash_and_says_who_may_have_sent_it() -> None:
    assert not crashed(-signal.SIGKILL)
    assert how_it_ended(-signal.SIGKILL).startswith("was killed (SIGKILL: ") and "memory" in how_it_ended(-signal.SIGKILL)
    assert how_it_ended(-signal.SIGTERM) == "was killed (SIGTERM)"


def test_an_exit_says_its_code_and_an_unknown_end_says_no_code() -> None:
    assert how_it_ended(1) == "exited (code 1)" and not crashed(1)
    assert how_it_ended(None) == "ended" and not crashed(None)


def test_the_one_reaper_waits_for_a_code_another_reaper_stores_late_and_calls_back_once() -> None:
    """multiprocessing's own reaper (a later engine starting) may read the status first and store the
    code a moment later: the end is read after it, not as "code None" (a review: the backend's race
    test left this path untried)."""
    import threading

    from engine.child.ending import ChildEnd

    class LateCode:
        exitcode: int | None = None

        def join(self) -> None:  # another thread reaped it; its code lands 0.2 s later
            threading.Timer(0.2, lambda: setattr(self, "exitcode", -signal.SIGKILL)).start()

    calls: list[int | None] = []
    end = ChildEnd(LateCode())
    end.then(lambda: calls.append(end.code))
    assert end.wait(5) and end.code == -signal.SIGKILL
    end.then(lambda: calls.append(end.code))  # after the end: called at once, on a thread of its own
    for _ in range(500):
        if len(calls) == 2:
            break
        threading.Event().wait(0.01)
    assert calls == [-signal.SIGKILL, -signal.SIGKILL]
