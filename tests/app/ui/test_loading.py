"""A switch in place (app.ui.loading.load_beside): never ends without a model unless even the old one fails."""
from __future__ import annotations

import threading
import time

import pytest

from app.ui.loading import abandonable, load_beside
from app.ui.messages import EngineFailed, EngineReady
from engine.config.profiles import ModelProfile
from engine.errors import LoadStoppedError, MemoryPlanError, ModelSourceError
from tests.app.fakes import FakeBackend, make_profiles

FAST = make_profiles().get("fast")
LOOKUP = make_profiles().get("lookup")


class Loader:
    """Fails for the profiles named in ``failing`` (each failure used once, in order)."""

    def __init__(self, *failing: tuple[str, Exception]) -> None:
        self.failing = list(failing)
        self.loaded: list[str] = []
        self.stopped: list[bool] = []
        """Whether its stop was set when each load began."""
        self.stages: list[str] = []

    def __call__(self, profile: ModelProfile, budget: int | None, progress: object, stop: threading.Event) -> FakeBackend:
        self.loaded.append(profile.name)
        self.stopped.append(stop.is_set())
        if self.failing and self.failing[0][0] == profile.name:
            raise self.failing.pop(0)[1]
        return FakeBackend(profile)

    def progress(self, stage: str, fraction: float | None) -> None:
        self.stages.append(stage)


def test_the_new_pair_loads_beside_the_old_which_is_closed_after() -> None:
    loader, old = Loader(), FakeBackend(FAST)
    answer = load_beside(loader, None, LOOKUP, old, FAST, loader.progress)
    assert isinstance(answer, EngineReady) and answer.profile == LOOKUP and old.closed


def test_a_failure_that_is_not_about_room_keeps_the_old_pair() -> None:
    loader, old = Loader(("lookup", ModelSourceError("org/Target-360M: not found on the hub"))), FakeBackend(FAST)
    answer = load_beside(loader, None, LOOKUP, old, FAST, loader.progress)
    assert isinstance(answer, EngineFailed) and answer.restored == (old, FAST) and not old.closed
    assert answer.error == "org/Target-360M: not found on the hub"


def test_no_room_beside_the_old_pair_unloads_it_first() -> None:
    loader, old = Loader(("lookup", MemoryPlanError("the pair needs 9 GiB, 6 GiB free"))), FakeBackend(FAST)
    answer = load_beside(loader, None, LOOKUP, old, FAST, loader.progress)
    assert isinstance(answer, EngineReady) and old.closed and loader.loaded == ["lookup", "lookup"]
    assert "lookup does not fit next to fast: unloading it first" in loader.stages


def test_no_room_even_alone_loads_the_old_pair_again() -> None:
    loader = Loader(("lookup", MemoryPlanError("9 GiB needed")), ("lookup", MemoryPlanError("still 9 GiB needed")))
    answer = load_beside(loader, None, LOOKUP, FakeBackend(FAST), FAST, loader.progress)
    assert isinstance(answer, EngineFailed) and answer.error == "still 9 GiB needed"
    assert answer.restored is not None and answer.restored[1] == FAST and loader.loaded == ["lookup", "lookup", "fast"]


def test_when_even_the_old_pair_fails_the_message_says_both() -> None:
    loader = Loader(("lookup", MemoryPlanError("9 GiB needed")), ("lookup", MemoryPlanError("still 9 GiB")),
                    ("fast", RuntimeError("disk gone")))
    answer = load_beside(loader, None, LOOKUP, FakeBackend(FAST), FAST, loader.progress)
    assert isinstance(answer, EngineFailed) and answer.restored is None
    assert answer.error == "still 9 GiB. Reloading fast failed too: RuntimeError: disk gone"


def test_a_first_load_that_fails_leaves_nothing() -> None:
    loader = Loader(("fast", ValueError("bad value")))
    answer = load_beside(loader, None, FAST, None, None, loader.progress)
    assert isinstance(answer, EngineFailed) and answer.restored is None and answer.error == "ValueError: bad value"


def test_a_stopped_load_keeps_the_old_pair() -> None:
    loader, old = Loader(("lookup", LoadStoppedError("Stopped loading lookup."))), FakeBackend(FAST)
    answer = load_beside(loader, None, LOOKUP, old, FAST, loader.progress, threading.Event())
    assert isinstance(answer, EngineFailed) and answer.stopped and answer.error == "Stopped loading lookup."
    assert answer.restored == (old, FAST) and not old.closed


def test_a_load_stopped_after_the_old_pair_made_room_loads_the_old_pair_again_unstopped() -> None:
    """The stop was for the new profile: the way back to the old one is not stopped by it."""
    stop = threading.Event()
    loader = Loader(("lookup", MemoryPlanError("does not fit")), ("lookup", LoadStoppedError("Stopped loading lookup.")))
    old = FakeBackend(FAST)
    stop.set()  # as Esc during the second try
    answer = load_beside(loader, None, LOOKUP, old, FAST, loader.progress, stop)
    assert isinstance(answer, EngineFailed) and answer.stopped and old.closed
    assert answer.restored is not None and answer.restored[1] == FAST and not answer.restored[0].closed
    assert loader.loaded == ["lookup", "lookup", "fast"] and loader.stopped == [True, True, False]


def test_the_ui_process_loads_a_local_profile_and_lists_profiles_without_importing_torch() -> None:
    """torch stays in the engine's child: in the UI process its 100k+ objects made each full
    garbage collection 125-210 ms while a reply streamed (app.ui.collector)."""
    import subprocess
    import sys
    from pathlib import Path

    code = """
import sys
from app.ui import loading
from app.ui.engine_host import EngineHost, ProfileChoice
from engine.child import backend
from engine.config.models_file import load_profiles
started = []
backend.ProcessBackend.start = classmethod(lambda cls, profile, *a, **k: started.append(profile.name) or "child")
assert loading.default_loader(load_profiles(None).get("pocket"), None, lambda stage, fraction: None,
                              __import__("threading").Event()) == "child"
host = EngineHost(ProfileChoice())
assert host.read_profiles() is None and host.unavailable_profiles() is not None
assert started == ["pocket"]
print("torch" in sys.modules)
"""
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_an_abandonable_load_answers_its_backend_or_raises_its_error() -> None:
    backend = FakeBackend(FAST)
    assert abandonable(lambda: backend, threading.Event(), "stopped") is backend

    def failing() -> FakeBackend:
        raise ModelSourceError("no server at that address")

    with pytest.raises(ModelSourceError, match="no server"):
        abandonable(failing, threading.Event(), "stopped")


def test_a_stopped_load_is_left_at_once_and_what_it_brings_later_is_closed() -> None:
    """A server profile's connect against a server that never answers took its probes' timeouts
    (10 s each) whatever Esc said: the wait ends as the stop comes, and a backend the connect
    still brings afterwards is closed (it would hold a connection no one uses)."""
    release, came = threading.Event(), FakeBackend(LOOKUP)
    stop = threading.Event()

    def slow() -> FakeBackend:
        release.wait(10)
        return came

    threading.Timer(0.1, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(LoadStoppedError, match="Stopped loading lookup"):
        abandonable(slow, stop, "Stopped loading lookup.")
    assert time.monotonic() - t0 < 1.0 and not came.closed
    release.set()
    deadline = time.monotonic() + 5
    while not came.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert came.closed


def test_a_stop_that_comes_as_the_load_ends_still_stops_it() -> None:
    stop, came = threading.Event(), FakeBackend(LOOKUP)

    def answered_as_esc_came() -> FakeBackend:
        stop.set()
        return came

    with pytest.raises(LoadStoppedError):
        abandonable(answered_as_esc_came, stop, "stopped")
    assert came.closed


def test_a_profile_over_its_own_budget_keeps_the_old_pair_loaded() -> None:
    """Unloading cannot help a profile whose budget is the limit: it was unloaded, and the old
    pair (coder: 15 s) loaded again, for the same refusal."""
    refusal = MemoryPlanError("the target does not fit the memory budget of 572 MiB", room_helps=False)
    loader, old = Loader(("lookup", refusal)), FakeBackend(FAST)
    answer = load_beside(loader, None, LOOKUP, old, FAST, loader.progress)
    assert isinstance(answer, EngineFailed) and answer.restored == (old, FAST) and not old.closed
    assert loader.loaded == ["lookup"]


def test_esc_during_the_way_back_does_not_leave_the_app_without_a_model() -> None:
    stop = threading.Event()

    class EscOnTheWayBack(Loader):
        def __call__(self, profile, budget, progress, given):  # type: ignore[no-untyped-def]
            if profile.name == "fast":
                stop.set()  # Esc pressed while the old profile loads again
                if given.is_set():
                    raise LoadStoppedError("Stopped loading fast.")
            return super().__call__(profile, budget, progress, given)

    loader = EscOnTheWayBack(("lookup", MemoryPlanError("does not fit")), ("lookup", MemoryPlanError("still not.")))
    answer = load_beside(loader, None, LOOKUP, FakeBackend(FAST), FAST, loader.progress, stop)
    assert isinstance(answer, EngineFailed) and answer.restored is not None and answer.restored[1] == FAST
    assert answer.error == "still not."


def test_the_two_failures_are_joined_with_one_full_stop() -> None:
    loader = Loader(("lookup", MemoryPlanError("9 GiB needed")), ("lookup", LoadStoppedError("Stopped loading lookup.")),
                    ("fast", RuntimeError("disk gone")))
    answer = load_beside(loader, None, LOOKUP, FakeBackend(FAST), FAST, loader.progress)
    assert isinstance(answer, EngineFailed)
    assert answer.error == "Stopped loading lookup. Reloading fast failed too: RuntimeError: disk gone"


def test_quitting_stops_the_way_back_too() -> None:
    """Esc does not stop the old pair loading again, but quitting must: the app's close waited
    for the whole reload on a blank screen."""
    quitting = threading.Event()

    class QuitOnTheWayBack(Loader):
        def __call__(self, profile, budget, progress, given):  # type: ignore[no-untyped-def]
            if profile.name == "fast":
                quitting.set()  # the app closes while the old profile loads again
                if given.is_set():
                    raise LoadStoppedError("Stopped loading fast.")
            return super().__call__(profile, budget, progress, given)

    loader = QuitOnTheWayBack(("lookup", MemoryPlanError("does not fit")), ("lookup", MemoryPlanError("still not.")))
    answer = load_beside(loader, None, LOOKUP, FakeBackend(FAST), FAST, loader.progress, threading.Event(),
                         quitting=quitting)
    assert isinstance(answer, EngineFailed) and answer.restored is None
    assert answer.error == "still not. Reloading fast failed too: Stopped loading fast."
