"""The main chat flow: load, send, stream, stop, switch profile."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from app.ui.app import SpecChatApp
from app.ui.screens.help import HelpScreen, help_markdown
from app.ui.screens.profiles import ProfilePicker
from app.ui.widgets.prompt import PromptArea
from engine.errors import EngineDiedError, EngineError, ModelSourceError
from engine.events import ChatEvent
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from app.ui.widgets.hud import Hud
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, send_held, wait_for

pytestmark = pytest.mark.anyio


async def test_prompt_streams_reply_and_updates_hud(make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        hud = app.query_one(Hud)
        assert hud.stats is None
        await send(pilot, "Say hello")
        await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage))
        reply = app.query_one(AssistantMessage)
        assert reply.text.startswith("Hello there! Here is code")
        assert reply.finish_reason == "eos"
        assert [m.text for m in app.query(UserMessage)] == ["Say hello"]
        assert hud.stats is not None and hud.stats.rounds == 5
        assert hud.stats.speedup == pytest.approx(45 / 20)
        assert len(hud.round_accepted) == 5
        # The backend saw the profile's system prompt and the prompt.
        messages = loader.backends[0].calls[0]
        assert [(m.role, m.content) for m in messages] == [("system", "You are terse."), ("user", "Say hello")]


async def test_hud_is_live_mid_reply(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=2)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        backend = await send_held(pilot, loader, "hi")
        await wait_for(pilot, lambda: app.query_one(Hud).stats is not None and app.query_one(Hud).stats.rounds == 2)
        hud = app.query_one(Hud)
        assert hud.live and app.conversation.generating
        assert app.query_one(AssistantMessage).text == "Hello there! Here is code"
        hud.flush()
        stats_text = str(hud.query_one("#hud-stats").render())
        assert "live" in stats_text and "2.10×" in stats_text and "42.0" in stats_text
        backend.release.set()
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert "last reply" in str(hud.query_one("#hud-stats").render())


async def test_a_new_chat_started_while_a_reply_streams_shows_no_live_figures(
        make_app: Callable[..., SpecChatApp]) -> None:
    """ctrl+n (or a chat from F3) while a reply streamed left the HUD on "live", every figure "—",
    and the status line on "live", until the next reply (a hostile tester)."""
    loader = FakeLoader(hold_after=2)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        backend = await send_held(pilot, loader, "hi")
        hud = app.query_one(Hud)
        await wait_for(pilot, lambda: hud.live and hud.stats is not None)
        await app.action_new_chat()
        await pilot.pause()
        hud.flush()
        assert not hud.live
        assert "no new reply yet" in str(hud.query_one("#hud-stats").render())
        assert "live" not in str(hud.query_one("#hud-line").render())
        backend.release.set()


async def test_escape_keeps_partial_reply_and_engine_stays_ready(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        backend = await send_held(pilot, loader, "first")
        await wait_for(pilot, lambda: app.query_one(AssistantMessage).text == "Hello there!")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.conversation.generating)
        stopped = app.query_one(AssistantMessage)
        assert stopped.finish_reason == "cancelled" and stopped.has_class("-stopped")
        assert stopped.text == "Hello there!"
        assert "stopped" in str(stopped.query_one(".reply-footer").render())
        # A second prompt works and the backend sees the partial reply as history.
        backend.hold_after = None
        await send(pilot, "second")
        await wait_for(pilot, lambda: not app.conversation.generating and len(app.query(AssistantMessage)) == 2)
        assert app.query(AssistantMessage).last().finish_reason == "eos"
        assert [(m.role, m.content) for m in backend.calls[1]][1:] == [
            ("user", "first"), ("assistant", "Hello there!"), ("user", "second")]


async def test_escape_does_nothing_when_idle(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        assert not app.check_action("stop", ())
        await pilot.press("escape")
        assert app.engine.backend is not None and not app.conversation.generating


async def test_ctrl_c_stops_a_reply_as_esc_does_after_copying_a_selection(make_app: Callable[..., SpecChatApp]) -> None:
    """ollama's users stop a reply with ctrl+c. Text selected in the prompt box is copied
    instead (the reply goes on); with nothing to stop, Textual's word on how to quit."""
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+c")
        assert any("ctrl+q" in n.message for n in app._notifications)  # idle: how to quit
        backend = await send_held(pilot, loader, "first")
        await wait_for(pilot, lambda: app.query_one(AssistantMessage).text == "Hello there!")
        prompt = app.query_one(PromptArea)
        prompt.insert("keep this")
        prompt.select_all()
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.clipboard == "keep this" and app.conversation.generating  # copied, the reply goes on
        prompt.move_cursor((0, 0))  # nothing selected now
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not app.conversation.generating)
        stopped = app.query_one(AssistantMessage)
        assert stopped.finish_reason == "cancelled" and stopped.text == "Hello there!"
        assert prompt.text == "keep this"
        backend.release.set()


async def test_switch_profile_closes_old_backend_and_keeps_conversation(
    make_app: Callable[..., SpecChatApp], loader: FakeLoader
) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "question one")
        await wait_for(pilot, lambda: not app.conversation.generating)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker))
        await pilot.press("down", "enter")  # "fast" is current and first; "lookup" is next
        await wait_for(pilot, lambda: len(loader.backends) == 2 and app.engine.backend is loader.backends[1])
        old, new = loader.backends
        assert old.closed and not new.closed
        assert app.engine.profile is not None and app.engine.profile.name == "lookup"
        await send(pilot, "question two")
        await wait_for(pilot, lambda: not app.conversation.generating and len(new.calls) == 1)
        roles = [(m.role, m.content) for m in new.calls[0]]
        assert roles[0] == ("user", "question one") and roles[-1] == ("user", "question two")
        assert new.params[0].k == 4  # the lookup profile's fixed K
        assert len(app.query(UserMessage)) == 2


async def test_refused_draft_shows_notice_and_reason(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(fallback_reason="draft tokenizer differs from the target's")
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.pause()
        assert any("tokenizer differs" in n.message for n in app._notifications)
        hud = app.query_one(Hud)
        hud.flush()
        engine_text = str(hud.query_one("#hud-engine").render())
        assert "plain decoding" in engine_text and "tokenizer differs" in engine_text
        # the header named the dropped draft model as if it ran (a hostile tester's)
        assert "fast · " in app.sub_title and app.sub_title.endswith("(drafter dropped: plain decoding)")
        assert "←" not in app.sub_title


async def test_loader_error_is_a_notice_not_a_crash(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader()
    loader.error = ModelSourceError("model org/Target-1.7B not found [check the name]")
    app = make_app(loader=loader)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: not app.engine.loading)
        assert app.engine.backend is None
        assert any("[check the name]" in n.message for n in app._notifications)
        # "F2 picks another profile" read as if this one could not be tried again (a hostile tester's)
        assert any("No model is loaded: F2 loads fast again or picks another profile." in n.message
                   for n in app._notifications)
        await send(pilot, "anyone there?")
        await pilot.pause()
        assert not app.query(UserMessage)
        assert any("No model is loaded" in n.message for n in app._notifications)
        # Recover: a working load after the failure.
        loader.error = None
        app.switch_profile("lookup")
        await ready(pilot)


async def test_unknown_profile_name_is_a_notice(make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app(profile="nope")
    async with app.run_test() as pilot:
        await pilot.pause()
        assert app.engine.backend is None and not loader.backends
        assert any("unknown profile 'nope'" in n.message for n in app._notifications)


async def test_generation_error_marks_reply_failed(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        backend = (await ready(pilot)).engine.backend
        assert backend is not None

        def boom(*args: object, **kwargs: object) -> Iterator[ChatEvent]:
            raise EngineError("target ran out of memory")
            yield  # pragma: no cover

        backend.chat = boom  # type: ignore[method-assign]
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert app.query_one(AssistantMessage).finish_reason == "error"
        assert any("out of memory" in n.message for n in app._notifications)


async def test_an_engine_that_died_under_a_reply_is_loaded_again_and_the_chat_goes_on(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    """A killed engine process: the reply fails with what it had, the profile loads again by
    itself (F2 on the same profile said "already loaded" of the dead one), the next prompt works."""
    app = make_app()
    async with app.run_test() as pilot:
        backend = (await ready(pilot)).engine.backend
        assert backend is not None and app.engine.switch_target("fast") is not None

        def killed(*args: object, **kwargs: object) -> Iterator[ChatEvent]:
            backend.alive = False  # type: ignore[attr-defined]
            raise EngineDiedError("the engine process was killed; the conversation is kept")
            yield  # pragma: no cover

        backend.chat = killed  # type: ignore[method-assign]
        await send(pilot, "hi")
        await wait_for(pilot, lambda: len(loader.backends) == 2 and app.engine.backend is loader.backends[1])
        assert app.query_one(AssistantMessage).finish_reason == "error"
        assert any("Loading fast again" in n.message for n in app._notifications)
        assert backend.closed  # type: ignore[attr-defined]
        await send(pilot, "again")
        await wait_for(pilot, lambda: not app.conversation.generating and len(app.query(AssistantMessage)) == 2)
        assert app.query(AssistantMessage)[-1].finish_reason == "eos"
        assert [m.content for m in loader.backends[1].calls[0] if m.role == "user"] == ["hi", "again"]


async def test_a_prompt_queued_behind_a_reply_whose_engine_died_waits_for_the_reload(
        make_app: Callable[..., SpecChatApp]) -> None:
    """It went to the dead engine as the reply failed, failed at once and was saved as an error (a
    hostile tester's): it now waits, says so, and goes out once the profile is loaded again."""
    loader = FakeLoader(hold_after=2)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        first = loader.backends[0]
        await send(pilot, "a long story")
        await wait_for(pilot, first.held.is_set)
        await send(pilot, "and then?")  # queued behind the reply
        loader.gate = threading.Event()  # the reload waits, so the queued prompt is seen waiting
        first.dies.set()
        await wait_for(pilot, lambda: app.engine.loading and len(app.query(AssistantMessage)) == 1)
        await pilot.pause()
        [queued] = app.conversation.queued
        assert queued.border_subtitle == "⧗ waiting for the model to load" and len(first.calls) == 1
        loader.gate.set()
        await wait_for(pilot, lambda: len(loader.backends) == 2)
        loader.backends[1].release.set()  # its reply holds after two rounds too
        await wait_for(pilot, lambda: not app.conversation.generating and len(app.query(AssistantMessage)) == 2)
        replies = list(app.query(AssistantMessage))
        assert [r.finish_reason for r in replies] == ["error", "eos"]
        assert [m.content for m in loader.backends[1].calls[0] if m.role == "user"][-1] == "and then?"


async def test_ctrl_r_kept_while_a_stop_was_on_its_way_waits_for_the_reload_when_the_engine_died(
        make_app: Callable[..., SpecChatApp]) -> None:
    """ctrl+r kept after Esc ran as soon as the reply ended, though the engine had died under it: the
    regenerate went to the dead engine, failed, and was saved as a second failed reply (a review's)."""
    loader = FakeLoader(hold_after=2)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        first = loader.backends[0]
        await send(pilot, "a long story")
        await wait_for(pilot, first.held.is_set)
        app.conversation.after_reply.append(app.conversation.regenerate)  # as when_free keeps ctrl+r
        first.dies.set()
        await wait_for(pilot, lambda: len(loader.backends) == 2 and not app.engine.loading)
        await wait_for(pilot, lambda: len(loader.backends[1].calls) == 1)
        loader.backends[1].release.set()
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert len(first.calls) == 1  # nothing was sent to the dead engine
        replies = list(app.query(AssistantMessage))
        assert [r.finish_reason for r in replies] == ["error", "eos"] and replies[0].has_class("-superseded")


async def test_an_engine_that_died_while_idle_is_loaded_again_before_the_next_prompt(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    """Killed with no reply streaming, the engine was noticed only when the next prompt failed
    ("✗ failed", a tester). Its end now loads the profile again at once; the end of a backend the
    app let go of (a profile switched) is not a death."""
    from app.ui.messages import EngineEnded

    app = make_app()
    async with app.run_test() as pilot:
        backend = (await ready(pilot)).engine.backend
        assert backend is not None
        app.post_message(EngineEnded(loader.backends[0].__class__(app.engine.profile)))  # not the current one
        await pilot.pause()
        assert len(loader.backends) == 1 and not app.engine.loading
        backend.alive = False  # type: ignore[attr-defined]
        app.post_message(EngineEnded(backend))
        await wait_for(pilot, lambda: len(loader.backends) == 2 and app.engine.backend is loader.backends[1])
        assert any("The engine stopped; loading fast again." in n.message for n in app._notifications)
        await send(pilot, "after the death")
        await wait_for(pilot, lambda: not app.conversation.generating and len(app.query(AssistantMessage)) == 1)
        assert app.query_one(AssistantMessage).finish_reason == "eos"


async def test_the_same_profile_picked_again_loads_it_again_only_when_its_engine_died(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        backend = (await ready(pilot)).engine.backend
        refusal = app.engine.switch_target("fast")
        assert getattr(refusal, "text", "") == "fast is already loaded."
        backend.alive = False  # type: ignore[union-attr]
        assert app.engine.switch_target("fast") is app.engine.profiles.get("fast")  # type: ignore[union-attr]


async def test_toggles_speculation_and_token_colours(make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating)
        reply = app.query_one(AssistantMessage)
        assert not reply.has_class("-sources")
        await pilot.press("f4")
        assert reply.has_class("-sources") and app.query_one(Hud).has_class("-legend")
        assert ("Hello there", "draft") in reply.pieces and ("!", "target") in reply.pieces
        await pilot.press("f5")
        assert loader.backends[0].speculation is False
        app.query_one(Hud).flush()
        assert "plain decoding" in str(app.query_one("#hud-engine").render())
        await pilot.press("f5")
        assert loader.backends[0].speculation is True


async def test_speculation_switched_off_with_f5_stays_off_through_a_profile_switch(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    """F5 says "plain decoding until you press F5 again", but every load turned speculation back
    on, unsaid (a tester: through F2 and through the reload after an engine crash)."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press("f5")
        assert loader.backends[0].speculation is False
        app.switch_profile("lookup")
        await wait_for(pilot, lambda: len(loader.backends) == 2 and app.engine.backend is loader.backends[1])
        await pilot.pause()
        assert loader.backends[1].speculation is False and not app.engine.speculation_on
        hud = app.query_one(Hud)
        hud.flush()
        assert "plain decoding" in str(hud.query_one("#hud-engine").render())
        assert any("Speculation stays off, as you set it with F5" in n.message for n in app._notifications)
        assert not any(n.title == "Draft refused" for n in app._notifications)  # nothing was refused
        await pilot.press("f5")
        assert loader.backends[1].speculation is True
        app.switch_profile("fast")
        await wait_for(pilot, lambda: len(loader.backends) == 3 and app.engine.backend is loader.backends[2])
        assert loader.backends[2].speculation is True  # on again: F5 turned it on


async def test_engine_notice_is_shown(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app(loader=FakeLoader(notice_round=(2, "draft dropped after OOM; continuing plain")))
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating)
        assert any("draft dropped" in n.message for n in app._notifications)


async def test_help_lists_bindings(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = help_markdown([("App", list(app.BINDINGS)), ("Prompt", list(PromptArea.BINDINGS))])
        for key in ("`escape`", "`f2`", "`ctrl+n`", "`enter`", "`ctrl+j`"):
            assert key in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_a_load_that_ends_after_the_screens_close_is_closed(make_app: Callable[..., SpecChatApp]) -> None:
    from app.ui.messages import EngineReady, LoadProgress
    from tests.app.fakes import FakeBackend, make_profiles

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
    late = FakeBackend(make_profiles().get("lookup"))
    app.on_load_progress(LoadProgress("loading target weights", 0.5))
    app.on_engine_ready(EngineReady(late, make_profiles().get("lookup")))
    assert late.closed and app.engine.backend is not late


async def test_a_new_or_reopened_chat_shows_no_figures_of_the_chat_left(make_app: Callable[..., SpecChatApp]) -> None:
    """After ctrl+n, the empty chat's HUD still showed the last chat's 'accepted 5% · τ 1.04 · 62.5 tok/s'."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage))
        hud = app.query_one(Hud)
        chat_id = app.conversation.chat_id
        assert hud.stats is not None and "last reply" in str(hud.query_one("#hud-stats").render())
        await app.action_new_chat()
        await pilot.pause()
        assert hud.stats is None and not hud.round_accepted
        assert "last reply" not in str(hud.query_one("#hud-stats").render())
        await send(pilot, "again")
        await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage))
        assert hud.stats is not None and chat_id is not None
        await app.open_chat(chat_id)
        await pilot.pause()
        assert hud.stats is None
