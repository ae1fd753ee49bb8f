"""Switching profiles never leaves the app without a model; unavailable profiles say why."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace

import pytest
from textual.pilot import Pilot
from textual.widgets import OptionList

from app.ui.app import SpecChatApp
from app.cli import main
from app.ui.screens.profiles import ProfilePicker
from app.ui.widgets.chat_view import AssistantMessage
from engine.progress import ProgressFn
from engine.errors import MemoryPlanError, ModelSourceError
from engine.config.profiles import ModelProfile, Profiles
from tests.app.fakes import FakeBackend, FakeLoader, make_profiles
from tests.app.helpers import ready, send, send_held, wait_for

pytestmark = pytest.mark.anyio


class ScriptedLoader:
    """Hands out FakeBackends; ``failures[name]`` lists errors for that profile's next loads."""

    def __init__(self, failures: dict[str, list[Exception]] | None = None) -> None:
        self.failures = failures or {}
        self.loads: list[tuple[str, list[str]]] = []  # (profile, backends open at that moment)
        self.backends: list[FakeBackend] = []

    def __call__(self, profile: ModelProfile, budget: int | None, progress: ProgressFn, stop: object) -> FakeBackend:
        self.loads.append((profile.name, [b.profile.name for b in self.backends if not b.closed]))
        progress("loading", 0.5)
        pending = self.failures.get(profile.name)
        if pending:
            raise pending.pop(0)
        backend = FakeBackend(profile)
        self.backends.append(backend)
        return backend


def with_cuda_profile() -> Profiles:
    base = make_profiles()
    big = replace(base.get("lookup"), name="gpu-big", device="cuda", description="needs a card")
    return Profiles({**base.profiles, "gpu-big": big}, default="fast", files=())


async def switch(pilot, app: SpecChatApp, name: str) -> None:  # type: ignore[no-untyped-def]
    app.switch_profile(name)
    await wait_for(pilot, lambda: not app.engine.loading)


async def test_a_failed_switch_keeps_the_old_model_loaded(make_app: Callable[..., SpecChatApp]) -> None:
    loader = ScriptedLoader({"lookup": [ModelSourceError("org/Target-360M is not in the local cache and "
                                                         "the hub could not be reached")]})
    app = make_app(loader=loader)
    async with app.run_test() as pilot:
        await ready(pilot)
        old = app.engine.backend
        await switch(pilot, app, "lookup")
        assert loader.loads[-1] == ("lookup", ["fast"])  # loaded next to the old one
        assert app.engine.backend is old and not old.closed and app.engine.profile.name == "fast"  # type: ignore[union-attr]
        assert any("Still using fast" in n.message for n in app._notifications)
        await send(pilot, "still there?")
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert old.calls  # type: ignore[union-attr]


async def test_a_switch_that_fits_closes_the_old_one_only_when_ready(make_app: Callable[..., SpecChatApp]) -> None:
    loader = ScriptedLoader()
    app = make_app(loader=loader)
    async with app.run_test() as pilot:
        await ready(pilot)
        old = app.engine.backend
        await switch(pilot, app, "lookup")
        assert loader.loads[-1] == ("lookup", ["fast"])
        assert old.closed and app.engine.backend is loader.backends[-1] and app.engine.profile.name == "lookup"  # type: ignore[union-attr]


async def test_no_room_unloads_first_then_reloads_the_old_profile(make_app: Callable[..., SpecChatApp]) -> None:
    no_room = MemoryPlanError("the target does not fit: it needs about 9 GiB but only 4 GiB is available")
    loader = ScriptedLoader({"lookup": [no_room, ModelSourceError("download failed")]})
    app = make_app(loader=loader)
    async with app.run_test() as pilot:
        await ready(pilot)
        first = app.engine.backend
        await switch(pilot, app, "lookup")
        assert [name for name, _ in loader.loads] == ["fast", "lookup", "lookup", "fast"]
        assert loader.loads[2] == ("lookup", [])  # the old one was closed before the second try
        assert first.closed and app.engine.backend is loader.backends[-1] and app.engine.profile.name == "fast"  # type: ignore[union-attr]
        assert any("download failed" in n.message and "Still using fast" in n.message for n in app._notifications)


async def test_no_room_then_success_switches(make_app: Callable[..., SpecChatApp]) -> None:
    loader = ScriptedLoader({"lookup": [MemoryPlanError("does not fit")]})
    app = make_app(loader=loader)
    async with app.run_test() as pilot:
        await ready(pilot)
        await switch(pilot, app, "lookup")
        assert app.engine.profile.name == "lookup" and app.engine.backend is loader.backends[-1]  # type: ignore[union-attr]
        assert [b.closed for b in loader.backends] == [True, False]


async def test_cuda_profiles_are_marked_unavailable_and_not_loaded(make_app: Callable[..., SpecChatApp],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECCHAT_DEVICE", raising=False)
    loader = ScriptedLoader()
    app = make_app(loader=loader, profiles_loader=with_cuda_profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker))
        options = app.screen.query_one(OptionList)
        option = options.get_option("gpu-big")
        assert option.disabled and "unavailable: needs a CUDA GPU" in str(option.prompt)
        assert not options.get_option("lookup").disabled
        await pilot.press("escape")
        await switch(pilot, app, "gpu-big")
        assert [name for name, _ in loader.loads] == ["fast"] and app.engine.profile.name == "fast"  # type: ignore[union-attr]
        assert any("gpu-big cannot run here" in n.message for n in app._notifications)


def test_profiles_command_marks_cuda_profiles(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECCHAT_DEVICE", raising=False)
    assert main(["profiles", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["profiles"]}
    assert rows["pocket"]["available"] and rows["pocket"]["unavailable_reason"] is None
    assert not rows["qwen2.5-7b"]["available"] and "CUDA" in rows["qwen2.5-7b"]["unavailable_reason"]
    assert main(["profiles"]) == 0
    assert "unavailable here: needs a CUDA GPU" in capsys.readouterr().out


async def test_an_over_long_chat_is_fitted_with_a_notice(make_app: Callable[..., SpecChatApp]) -> None:
    """A real ChatEngine on a tiny model with a 96-token window, behind the app."""
    from app.ui.widgets.chat_view import AssistantMessage
    from tests.tiny import make_tokenizer, tiny_chat_engine as engine

    engines: list[object] = []

    def loader(profile: ModelProfile, budget: int | None, progress: ProgressFn, stop: object):  # type: ignore[no-untyped-def]
        engines.append(engine(make_tokenizer()))
        return engines[-1]

    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        for turn in range(3):
            await send(pilot, " ".join(f"w{(turn * 7 + i) % 60}" for i in range(30)))
            await wait_for(pilot, lambda: not app.conversation.generating, timeout=60)
        replies = list(app.query(AssistantMessage))
        assert replies[0].finish_reason in ("context", "eos")
        assert any("earlier message" in n.message and "96-token context window" in n.message
                   for n in app._notifications)
        assert replies[-1].stats is not None and replies[-1].stats["truncated_turns"] >= 2


async def switching_to_lookup(pilot: Pilot, app: SpecChatApp, loader: FakeLoader) -> FakeBackend:
    """The app ready on fast, then a switch to lookup held loading (``loader.gate``); the old backend."""
    await ready(pilot)
    old = app.engine.backend
    loader.gate = threading.Event()
    app.switch_profile("lookup")
    await wait_for(pilot, lambda: app.engine.loading)
    return old  # type: ignore[return-value]


async def test_esc_stops_a_switch_and_the_old_model_stays(make_app: Callable[..., SpecChatApp],
                                                        loader: FakeLoader) -> None:
    """A switch to a profile that downloads gigabytes can be stopped: F2 meanwhile says how, Esc
    stops it, and the pair loaded before answers the next prompt."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        old = await switching_to_lookup(pilot, app, loader)
        refusal = app.engine.switch_target("fast")
        assert not isinstance(refusal, ModelProfile) and "Esc stops it" in refusal.text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.engine.loading)
        await pilot.pause()
        assert app.engine.backend is old and not old.closed and app.engine.profile.name == "fast"
        notes = {n.title: n.message for n in app._notifications}
        assert notes["Loading stopped"] == "Stopped loading lookup.\nStill using fast; F2 picks another profile."
        loader.gate.set()
        await send(pilot, "still there?")
        await wait_for(pilot, lambda: len(old.calls) == 1)


async def test_a_switch_stopped_after_the_old_engine_died_loads_the_old_profile_again(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    """The old pair's process killed while a switch loaded: Esc said "Still using fast" with no engine
    running, and the next prompt failed (a hostile tester's)."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        old = await switching_to_lookup(pilot, app, loader)
        old.alive = False  # killed meanwhile: nobody heard, a load was replacing it
        await pilot.press("escape")
        notes = lambda: {n.title: n.message for n in app._notifications}  # noqa: E731
        await wait_for(pilot, lambda: "Loading stopped" in notes())
        assert notes()["Loading stopped"] == "Stopped loading lookup.\nThe engine of fast had stopped meanwhile; loading it again."
        loader.gate.set()
        await wait_for(pilot, lambda: not app.engine.loading and app.engine.backend is not None
                       and app.engine.backend is not old)
        assert app.engine.profile.name == "fast" and old.closed
        await send(pilot, "still there?")
        await wait_for(pilot, lambda: len(app.engine.backend.calls) == 1)


async def test_a_profile_that_downloads_asks_first_and_says_how_much(make_app: Callable[..., SpecChatApp],
                                                                    loader: FakeLoader) -> None:
    """F2 lists what a first use downloads; picking such a profile asks before it starts, and
    n keeps the models loaded (a reviewer's 6.2 GB download began at once, with no way back)."""
    from app.ui.screens.edit import ConfirmScreen

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        app.engine.download_of = (  # type: ignore[method-assign]
            lambda profile: "about 6.20 GB" if profile.name == "lookup" else None)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker))
        listed = app.screen.query_one(OptionList)
        assert "first use downloads about 6.20 GB" in str(listed.get_option("lookup").prompt)
        assert "downloads" not in str(listed.get_option("fast").prompt)
        listed.highlighted = 1
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "lookup's first use downloads about 6.20 GB" in str(app.screen.query_one(".dialog-title").render())
        await pilot.press("n")
        await pilot.pause()
        assert not app.engine.loading and app.engine.profile.name == "fast" and len(loader.backends) == 1
        app.switch_profile("lookup")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("enter")  # Enter downloads, as the hint says
        await wait_for(pilot, lambda: app.engine.profile.name == "lookup" and not app.engine.loading)
        assert len(loader.backends) == 2


async def test_a_switch_during_a_reply_says_it_stopped_the_reply(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=2)
    app = make_app(loader=loader)
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        await send_held(pilot, loader, "a long essay")
        app.switch_profile("lookup")
        await wait_for(pilot, lambda: not app.engine.loading and not app.conversation.generating)
        said = [n.message for n in app._notifications]
        assert "Stopped the reply to load lookup; ctrl+r asks again once it is ready." in said


async def answered_then_switching(pilot: Pilot, app: SpecChatApp, loader: FakeLoader) -> None:
    """A prompt answered on fast, then a switch to lookup held loading (:func:`switching_to_lookup`)."""
    await ready(pilot)
    await send(pilot, "first question")
    await wait_for(pilot, lambda: not app.conversation.generating)
    await switching_to_lookup(pilot, app, loader)


async def test_ctrl_r_during_a_switch_answers_again_once_the_new_model_is_ready_and_f5_says_why_it_waits(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    """During a switch ctrl+r and F5 said "No model is loaded yet." while the HUD said the old pair stays
    until the new one is ready, and Enter queued a prompt meanwhile (a hostile tester's)."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await answered_then_switching(pilot, app, loader)
        await pilot.press("ctrl+r", "f5")
        messages = lambda: [n.message for n in app._notifications]  # noqa: E731
        await wait_for(pilot, lambda: "ctrl+r answers again once lookup is ready." in messages())
        assert "lookup is loading: F5 switches speculation once it is ready." in messages()
        assert "No model is loaded yet." not in messages()
        loader.gate.set()
        await wait_for(pilot, lambda: len(loader.backends) == 2 and len(loader.backends[1].calls) == 1)
        await wait_for(pilot, lambda: not app.conversation.generating)
        replies = list(app.query(AssistantMessage))
        assert len(replies) == 2 and replies[0].has_class("-superseded")


async def test_ctrl_r_kept_for_a_load_that_fails_is_said_not_dropped_silently(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await answered_then_switching(pilot, app, loader)
        await pilot.press("ctrl+r")
        loader.error = ModelSourceError("lookup's model is gone")
        loader.gate.set()
        await wait_for(pilot, lambda: any("ctrl+r was not run" in n.message for n in app._notifications))
        assert app.conversation.after_reply == []
