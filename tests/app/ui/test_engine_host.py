"""The engine host: which profile loads first, which switches are refused and why, and its state."""
from __future__ import annotations

from dataclasses import replace

import pytest

from app.ui.engine_host import EngineHost, ProfileChoice, Refusal
from engine.config.profiles import profile_from_sources
from engine.errors import ProfileError
from tests.app.fakes import FakeBackend, FakeLoader, make_profiles


def host(choice: ProfileChoice | None = None, loader: FakeLoader | None = None) -> EngineHost:
    made = EngineHost(choice or ProfileChoice(), loader=loader or FakeLoader(), profiles_loader=make_profiles)
    assert made.read_profiles() is None
    return made


def test_the_first_profile_is_the_named_one_else_the_default() -> None:
    assert host(ProfileChoice(name="lookup")).initial_profile().name == "lookup"  # type: ignore[union-attr]
    assert host().initial_profile().name == "fast"  # type: ignore[union-attr]


def test_target_and_server_choices_come_before_any_name() -> None:
    server = replace(make_profiles().get("lookup"), name="the-server")
    assert host(ProfileChoice(name="lookup", server_profile=server)).initial_profile() is server
    made = host(ProfileChoice(name="lookup", target="org/Some-1B", draft="none")).initial_profile()
    assert made == profile_from_sources("org/Some-1B", "none")


def test_an_unknown_name_is_a_refusal_that_lists_the_known_ones() -> None:
    refusal = host(ProfileChoice(name="nope")).initial_profile()
    assert isinstance(refusal, Refusal) and refusal.severity == "error"
    assert "nope" in refusal.text and "fast" in refusal.text and "lookup" in refusal.text


def test_a_profiles_file_that_cannot_be_read_is_a_refusal_not_a_traceback() -> None:
    def broken() -> None:
        raise ProfileError("models.toml, line 3: expected '='")

    made = EngineHost(ProfileChoice(), profiles_loader=broken)  # type: ignore[arg-type]
    refusal = made.read_profiles()
    assert refusal == Refusal("models.toml, line 3: expected '='", "error", "Profiles")
    assert made.profiles is None and made.initial_profile() is None


def test_switches_are_refused_with_the_reason() -> None:
    made = host()
    made.profiles = None
    assert made.switch_target("fast") == Refusal("No profiles are available.")
    made = host()
    made.begin_load(made.profiles.get("fast"))  # type: ignore[union-attr]
    assert "still loading" in made.switch_target("lookup").text  # type: ignore[union-attr]
    made.ready(FakeBackend(made.profiles.get("fast")), made.profiles.get("fast"))  # type: ignore[union-attr]
    assert made.switch_target("fast") == Refusal("fast is already loaded.", "information")
    unknown = made.switch_target("nope")
    assert isinstance(unknown, Refusal) and unknown.title == "Profile"
    assert made.switch_target("lookup") == made.profiles.get("lookup")  # type: ignore[union-attr]


def test_a_profile_that_cannot_run_here_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.load.availability as availability

    monkeypatch.setattr(availability, "cuda_present", lambda: False)
    made = host()
    made.profiles = type(made.profiles)(  # type: ignore[misc,union-attr]
        {**made.profiles.profiles, "big": replace(made.profiles.get("lookup"), name="big", device="cuda")},  # type: ignore[union-attr]
        default="fast", files=())
    refusal = made.switch_target("big")
    assert isinstance(refusal, Refusal) and refusal.text.startswith("big cannot run here: ")
    assert "CUDA" in refusal.text and made.unavailable_profiles().keys() == {"big"}


def test_a_load_replaces_the_backend_only_when_ready() -> None:
    loader = FakeLoader()
    made = host(loader=loader)
    fast, lookup = made.profiles.get("fast"), made.profiles.get("lookup")  # type: ignore[union-attr]
    first = made.load(fast, *made.begin_load(fast), lambda *_: None)
    made.ready(first.backend, first.profile)  # type: ignore[union-attr]
    old, old_profile = made.begin_load(lookup)
    assert made.loading and made.backend is None and old is first.backend and old_profile == fast  # type: ignore[union-attr]
    second = made.load(lookup, old, old_profile, lambda *_: None)
    assert old.closed  # type: ignore[union-attr]
    made.ready(second.backend, second.profile)  # type: ignore[union-attr]
    assert not made.loading and made.profile == lookup and made.speculation_on


def test_speculation_toggles_from_what_the_engine_says() -> None:
    made = host()
    fast = made.profiles.get("fast")  # type: ignore[union-attr]
    backend = FakeBackend(fast)
    made.ready(backend, fast)
    was_on, info = made.toggle_speculation()
    assert was_on and info.mode == "plain" and not made.speculation_on
    backend.speculation = False  # as if the engine had switched itself off
    was_on, info = made.toggle_speculation()
    assert not was_on and info.mode != "plain" and made.speculation_on


def test_close_closes_the_backend_once() -> None:
    made = host()
    fast = made.profiles.get("fast")  # type: ignore[union-attr]
    backend = FakeBackend(fast)
    made.ready(backend, fast)
    made.close()
    assert backend.closed and made.backend is None
    made.close()


@pytest.mark.parametrize("switching", [False, True])
def test_close_tells_the_pair_holding_the_reply_the_app_closes_before_waiting_for_it(switching: bool) -> None:
    """ctrl+q with the engine stopped mid-reply waited for the reply's reader, which gave the child STOP_WAIT_S
    (10 s, on a blank screen): the backend is told the app closes first (engine.child.backend's closing),
    so that its reader ends a child that does not answer soon. During a switch the reply ends on the old
    pair (``backend`` is None then), which is told too (a review's)."""
    import threading

    made = host()
    fast = made.profiles.get("fast")  # type: ignore[union-attr]
    backend = FakeBackend(fast)
    told = threading.Event()
    backend.closing = told.set  # type: ignore[attr-defined]
    made.ready(backend, fast)
    if switching:
        made.begin_load(made.profiles.get("lookup"))  # type: ignore[union-attr,arg-type]
        assert made.backend is None
    streaming = threading.Event()

    def reply() -> None:  # a reply whose child ends it only once told the app closes
        with made.lock:
            streaming.set()
            told.wait(10)

    worker = threading.Thread(target=reply)
    worker.start()
    assert streaming.wait(10)
    made.close()
    worker.join()
    assert told.is_set() and backend.closed


def test_a_left_out_user_profile_is_a_warning_and_the_rest_load(tmp_path, monkeypatch) -> None:
    from engine.config.models_file import load_profiles

    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path))
    (tmp_path / "models.toml").write_text('[profiles.bad]\ntarget = "a/b"\ndrafter = "eagle"\n')
    made = EngineHost(ProfileChoice(), profiles_loader=load_profiles)
    refusal = made.read_profiles()
    assert refusal is not None and refusal.severity == "warning" and refusal.title == "Profiles"
    assert refusal.text.startswith(f"profile 'bad' in {tmp_path / 'models.toml'} line 1 is disabled: unknown drafter")
    assert made.initial_profile().name == "pocket"  # type: ignore[union-attr]
