"""The Conversation widget: one chat's transcript, queue, reply stream and HUD fold, driven directly."""
from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from app.ui.app import SpecChatApp
from app.ui.messages import ReplyFinished
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from app.ui.widgets.hud import Hud
from engine.events import ChatEvent, ChatMessage
from tests.app.fakes import FakeLoader
from tests.app.helpers import ready, send, send_held, wait_for

pytestmark = pytest.mark.anyio


async def test_prompts_queue_while_the_model_loads_and_go_out_in_order(make_app: Callable[..., SpecChatApp],
                                                                      loader: FakeLoader) -> None:
    loader.gate = threading.Event()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        conversation = app.conversation
        conversation.queue_prompt("first")
        conversation.queue_prompt("second")
        assert [w.text for w in conversation.queued] == ["first", "second"]
        assert all(w.waiting for w in conversation.queued) and conversation.turns() == []
        loader.gate.set()
        await ready(pilot)
        await wait_for(pilot, lambda: len(loader.backends[0].calls) == 2 and not conversation.generating)
        second_request = loader.backends[0].calls[1]
        assert [m.content for m in second_request if m.role == "user"] == ["first", "second"]
        assert second_request[-2].role == "assistant"  # the first reply, read off the transcript


async def test_a_new_chat_puts_unsent_prompts_back_in_the_box(make_app: Callable[..., SpecChatApp],
                                                              loader: FakeLoader) -> None:
    loader.gate = threading.Event()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        conversation = app.conversation
        conversation.queue_prompt("keep me")
        await conversation.new_chat()
        assert conversation.queued == [] and conversation.prompt.text == "keep me"
        assert not conversation.chat_log.query(UserMessage)
        loader.gate.set()
        await ready(pilot)


async def test_regenerate_sends_the_prompt_again_without_the_earlier_reply(make_app: Callable[..., SpecChatApp],
                                                                          loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        conversation.send_prompt("hi")
        await wait_for(pilot, lambda: not conversation.generating)
        first = conversation.query_one(AssistantMessage)
        conversation.regenerate()
        await wait_for(pilot, lambda: len(conversation.query(AssistantMessage)) == 2 and not conversation.generating)
        assert first.superseded
        sent = loader.backends[0].calls[-1]
        assert [m for m in sent if m.role != "system"] == [ChatMessage("user", "hi")]
        assert [t.role for t in conversation.turns()] == ["user", "assistant"]


async def test_an_edited_prompt_replaces_the_exchange_it_edits(make_app: Callable[..., SpecChatApp],
                                                              loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        conversation.send_prompt("hi")
        await wait_for(pilot, lambda: not conversation.generating)
        last = conversation.last_exchange()
        assert last is not None
        conversation.ask_edited(*last, "hello\n")
        await wait_for(pilot, lambda: len(conversation.query(AssistantMessage)) == 2 and not conversation.generating)
        assert last[0].superseded and last[1] is not None and last[1].superseded
        assert [m.content for m in loader.backends[0].calls[-1] if m.role == "user"] == ["hello"]


async def test_the_hud_folds_to_one_line_below_110_columns_unless_chosen(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        conversation.fit_hud(100)
        assert conversation.hud.has_class("-line")
        conversation.fit_hud(140)
        assert not conversation.hud.has_class("-line")
        conversation.toggle_hud(140)  # the user's choice holds at any width
        conversation.fit_hud(200)
        assert conversation.hud.has_class("-line")


async def test_message_sent_while_loading_waits_and_goes_out_when_ready(
    make_app: Callable[..., SpecChatApp], loader: FakeLoader
) -> None:
    loader.gate = threading.Event()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.engine.loading)
        await send(pilot, "early question")
        await pilot.pause()
        waiting = app.query_one(UserMessage)
        assert waiting.has_class("-queued") and "waiting for the model to load" in str(waiting.border_subtitle)
        assert app.conversation.prompt.text == "" and not app.query(AssistantMessage)
        loader.gate.set()
        await wait_for(pilot, lambda: loader.backends and len(loader.backends[0].calls) == 1 and not app.conversation.generating)
        assert not waiting.has_class("-queued") and not waiting.border_subtitle
        assert loader.backends[0].calls[0][-1].content == "early question"
        assert app.query_one(AssistantMessage).finish_reason == "eos"


async def test_prompt_sent_while_a_reply_streams_follows_it(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        backend = await send_held(pilot, loader, "one")
        await send(pilot, "two")
        await pilot.pause()
        assert app.query(UserMessage).last().has_class("-queued") and len(backend.calls) == 1
        backend.hold_after = None
        backend.release.set()
        await wait_for(pilot, lambda: len(backend.calls) == 2 and not app.conversation.generating)
        # The transcript keeps its order: you, reply, you, reply.
        kinds = [type(w).__name__ for w in app.conversation.chat_log.children]
        assert kinds == ["UserMessage", "AssistantMessage", "UserMessage", "AssistantMessage"]
        assert [(m.role, m.content) for m in backend.calls[1]][-3:] == [
            ("user", "one"), ("assistant", app.query(AssistantMessage).first().text), ("user", "two")]


async def test_failed_load_returns_waiting_prompts_to_the_box(make_app: Callable[..., SpecChatApp],
                                                             loader: FakeLoader) -> None:
    from engine.errors import ModelSourceError

    loader.gate = threading.Event()
    loader.error = ModelSourceError("no such model")
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.engine.loading)
        await send(pilot, "keep me")
        loader.gate.set()
        await wait_for(pilot, lambda: not app.engine.loading)
        await pilot.pause()
        assert app.conversation.prompt.text == "keep me" and not app.query(UserMessage)


async def test_callbacks_after_the_screens_close_do_nothing(make_app: Callable[..., SpecChatApp]) -> None:
    """Messages and paint timers may still run while the app shuts down: they must not raise.
    (The HUD's refresh timer belongs to the Conversation and stops with it; CI once saw it
    fire with no screen left when the App owned it.)"""
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, loader.backends[0].held.is_set)
        await wait_for(pilot, lambda: app.query_one(AssistantMessage).text == "Hello there!")
        conversation = app.conversation
        widget, reply_id = conversation.stream.widget, conversation.stream.reply_id
        widget_stats = app.query_one(Hud).stats
    assert app.screen_stack == [] and widget is not None
    conversation.stream.widget = widget  # as if the last round were still waiting to be painted
    conversation.stream.outbox.put(ChatEvent(text="late", pieces=(), token_ids=(), stats=widget_stats))
    await conversation.paint_rounds(reply_id)
    await conversation.on_reply_finished(ReplyFinished(reply_id, "stop", None, None))


async def notices(pilot) -> list[str]:  # type: ignore[no-untyped-def]
    """The notices shown so far (a widget's notice reaches the app a message later)."""
    await pilot.pause()
    return [n.message for n in pilot.app._notifications]


def kinds(app: SpecChatApp) -> list[str]:
    return [type(w).__name__ for w in app.conversation.chat_log.children]


async def replied(pilot, text: str) -> None:  # type: ignore[no-untyped-def]
    await send(pilot, text)
    await wait_for(pilot, lambda: not pilot.app.conversation.generating
                   and pilot.app.query(AssistantMessage).last().finish_reason)


def saved_chat(app: SpecChatApp) -> int:
    assert app.archive.saver is not None and app.archive.saver.flush(5) and app.conversation.chat_id is not None
    return app.conversation.chat_id


async def test_a_prompt_is_shown_sent_with_the_system_prompt_and_saved_under_its_first_line(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        assert kinds(app) == ["Static"]  # the welcome text
        conversation.prompt.insert("Plan a trip\nin May\n\n")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not conversation.generating and app.query(AssistantMessage))
        assert kinds(app) == ["UserMessage", "AssistantMessage"]
        assert loader.backends[0].calls[0] == [ChatMessage("system", "You are terse."),
                                               ChatMessage("user", "Plan a trip\nin May")]
        reply = app.query_one(AssistantMessage)
        assert conversation.messages() == [("user", "Plan a trip\nin May"), ("assistant", reply.text)]
        chat = app.archive.history.get_chat(saved_chat(app))  # type: ignore[union-attr]
        assert chat is not None and (chat.title, chat.profile, chat.message_count) == ("Plan a trip", "fast", 2)


async def test_with_no_model_the_prompt_goes_back_to_the_box(make_app: Callable[..., SpecChatApp],
                                                             loader: FakeLoader) -> None:
    from engine.errors import ModelSourceError

    loader.error = ModelSourceError("no such model")
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: not app.engine.loading)
        await send(pilot, "anyone there?")
        await pilot.pause()
        assert app.conversation.prompt.text == "anyone there?" and not app.query(UserMessage)
        assert "No model is loaded: press F2 to pick a profile." in (await notices(pilot))
        assert app.conversation.prompt.prompts == ["anyone there?"]  # Up still recalls it


async def test_a_stopped_reply_keeps_its_text_and_the_next_prompt_goes_out(
        make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        backend = await send_held(pilot, loader, "one")
        backend.hold_after = None
        await send(pilot, "two")
        await wait_for(pilot, lambda: conversation.queued and app.query_one(AssistantMessage).text == "Hello there!")
        conversation.stop_reply()
        await wait_for(pilot, lambda: len(backend.calls) == 2 and not conversation.generating)
        first = app.query(AssistantMessage).first()
        assert first.finish_reason == "cancelled" and first.text == "Hello there!"
        assert [(m.role, m.content) for m in backend.calls[1]][1:] == [
            ("user", "one"), ("assistant", "Hello there!"), ("user", "two")]


async def test_a_new_chat_drops_the_streaming_reply_and_returns_queued_prompts_before_the_draft(
        make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        await send(pilot, "one")
        await wait_for(pilot, loader.backends[0].held.is_set)
        await send(pilot, "two")
        await send(pilot, "three")
        conversation.prompt.insert("half typed")
        await conversation.new_chat()
        assert conversation.prompt.text == "two\nthree\nhalf typed" and conversation.queued == []
        assert not conversation.generating and conversation.chat_id is None and kinds(app) == ["Static"]
        assert "New chat." in (await notices(pilot))
        await wait_for(pilot, lambda: not app.engine.lock.locked())  # the old reply was cancelled
        await pilot.pause()
        assert kinds(app) == ["Static"] and len(loader.backends[0].calls) == 1  # nothing of it came back


async def test_a_saved_chat_opens_with_its_system_prompt_and_earlier_answers_dimmed(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        history = app.archive.history
        assert history is not None
        chat_id = history.create_chat("Formal", "fast", system_prompt="Be formal.")
        history.add_message(chat_id, "user", "q1")
        history.add_message(chat_id, "assistant", "a1", pieces=[("a", "draft"), ("1", "target")], finish_reason="eos")
        edited = history.add_message(chat_id, "user", "q2")
        history.add_message(chat_id, "assistant", "a2", finish_reason="eos")
        history.mark_superseded(chat_id, edited)
        history.add_message(chat_id, "user", "q2, better")
        history.add_message(chat_id, "assistant", "first answer", finish_reason="eos")
        history.add_message(chat_id, "assistant", "second answer", finish_reason=None)  # regenerated, then cut off
        conversation = app.conversation
        chat = await conversation.open_chat(chat_id)
        assert chat is not None and chat.title == "Formal" and conversation.chat_id == chat_id
        shown = [(w.text, w.superseded) for w in conversation.chat_log.children]  # type: ignore[attr-defined]
        assert shown == [("q1", False), ("a1", False), ("q2", True), ("a2", True), ("q2, better", False),
                         ("first answer", True), ("second answer", False)]
        assert app.query(AssistantMessage).last().finish_reason == "unfinished"  # its end never saved (app.ui.widgets.chat_view.UNFINISHED)
        assert app.query(AssistantMessage).first().pieces == [("a", "draft"), ("1", "target")]
        assert conversation.system_prompt == "Be formal."
        await replied(pilot, "q3")
        assert [(m.role, m.content) for m in loader.backends[0].calls[-1]] == [
            ("system", "Be formal."), ("user", "q1"), ("assistant", "a1"), ("user", "q2, better"),
            ("assistant", "second answer"), ("user", "q3")]


async def test_a_chat_that_is_gone_or_empty(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        await replied(pilot, "keep this on screen")
        assert await conversation.open_chat(999) is None
        assert "That chat no longer exists." in (await notices(pilot))
        assert kinds(app) == ["UserMessage", "AssistantMessage"]
        empty = app.archive.history.create_chat("Empty", "fast")  # type: ignore[union-attr]
        assert await conversation.open_chat(empty) is not None
        assert kinds(app) == ["Static"] and conversation.chat_id == empty


async def test_the_chats_system_prompt_follows_the_profile_or_replaces_it(make_app: Callable[..., SpecChatApp],
                                                                          loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        conversation.set_system_prompt("You are terse.\n")  # the profile's own text: follow the profile
        assert conversation.chat_system_prompt is None and (await notices(pilot))[-1] == "System prompt set."
        conversation.set_system_prompt("")
        assert conversation.chat_system_prompt == "" and conversation.system_prompt is None
        assert (await notices(pilot))[-1] == "No system prompt for this chat."
        await replied(pilot, "hi")
        assert [m.role for m in loader.backends[0].calls[0]] == ["user"]
        chat_id = saved_chat(app)
        conversation.set_system_prompt("  Be formal.  ")
        assert conversation.system_prompt == "Be formal." and app.archive.saver.flush(5)  # type: ignore[union-attr]
        assert app.archive.history.get_chat(chat_id).system_prompt == "Be formal."  # type: ignore[union-attr]
        await conversation.new_chat()
        assert conversation.system_prompt == "You are terse."


async def test_the_open_chat_deleted_elsewhere_and_a_profile_change(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        await replied(pilot, "first")
        chat_id = saved_chat(app)
        conversation.profile_changed("fast")  # the same profile loaded again: nothing to save
        assert app.archive.saver.unsaved_settings() == 0  # type: ignore[union-attr]
        conversation.profile_changed("lookup")
        assert app.archive.saver.flush(5)  # type: ignore[union-attr]
        assert app.archive.history.get_chat(chat_id).profile == "lookup"  # type: ignore[union-attr]
        assert not await conversation.chat_deleted(chat_id + 1)
        assert conversation.chat_id == chat_id and kinds(app) == ["UserMessage", "AssistantMessage"]
        assert await conversation.chat_deleted(chat_id)
        await pilot.pause()
        assert conversation.chat_id is None and kinds(app) == ["Static"]  # the welcome: a new, empty chat
        assert (await notices(pilot))[-1] == "Deleted the open chat; this is a new one."
        # nothing left to answer again: ctrl+r once re-saved the deleted transcript's prompt a second time
        await pilot.press("ctrl+r")
        assert (await notices(pilot))[-1] == "No prompt yet."
        await replied(pilot, "second")
        new_id = saved_chat(app)
        assert new_id != chat_id
        assert [m.role for m in app.archive.history.messages(new_id)] == ["user", "assistant"]  # type: ignore[union-attr]


async def test_the_last_exchange_waits_for_the_reply_and_needs_a_prompt(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        assert conversation.last_exchange() is None and (await notices(pilot))[-1] == "No prompt yet."
        await send(pilot, "hi")
        await wait_for(pilot, loader.backends[0].held.is_set)
        conversation.regenerate()
        assert (await notices(pilot))[-1] == "Wait for the reply to finish (or press Esc to stop it)."
        user = app.query_one(UserMessage)
        conversation.ask_edited(user, None, "hello again")
        assert conversation.prompt.text == "hello again" and not user.superseded
        assert (await notices(pilot))[-1] == "The model is busy: your edited prompt is back in the box."
        loader.backends[0].release.set()
        await wait_for(pilot, lambda: not conversation.generating)
        assert len(loader.backends[0].calls) == 1 and conversation.last_exchange() == (
            user, app.query_one(AssistantMessage))


async def test_the_colour_view_switches_every_reply_and_the_next_one(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        await replied(pilot, "one")
        conversation.show_sources = True
        assert app.query_one(AssistantMessage).has_class("-sources") and conversation.hud.has_class("-legend")
        await replied(pilot, "two")
        assert all(r.has_class("-sources") for r in app.query(AssistantMessage))
        conversation.show_sources = False
        assert not any(r.has_class("-sources") for r in app.query(AssistantMessage))
        assert not conversation.hud.has_class("-legend")


async def test_a_private_chat_is_not_saved_and_asks_the_engine_not_to_learn(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        pair = app.sub_title
        assert pair.startswith("fast · ")  # the profile and its models, as before
        await app.run_action("new_chat(True)")
        await pilot.pause()
        assert app.sub_title == f"private chat · {pair}" and "Private chat" in str(app.query_one("#welcome").render())
        await replied(pilot, "a secret plan")
        await replied(pilot, "and its second step")
        backend = loader.backends[0]
        assert [p.private for p in backend.params] == [True, True]
        assert len(backend.calls[1]) == 4  # the private chat is still one conversation
        assert app.archive.saver is not None and app.archive.saver.flush(5)
        assert app.conversation.chat_id is None and app.archive.history.list_chats() == []  # type: ignore[union-attr]
        await pilot.press("ctrl+n")  # an ordinary chat again
        await pilot.pause()
        assert app.sub_title == pair and "Private chat" not in str(app.query_one("#welcome").render())
        await replied(pilot, "an open question")
        assert backend.params[-1].private is False
        chats = app.archive.history.list_chats()  # type: ignore[union-attr]
        assert saved_chat(app) and [c.title for c in chats] == ["an open question"]


async def test_leaving_a_private_chat_takes_its_prompts_out_of_recall(
        make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(hold_after=1)
    app = make_app(loader=loader)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        backend = loader.backends[0]
        backend.hold_after = None  # this reply runs through
        await replied(pilot, "an open question")
        backend.hold_after = 1
        await app.run_action("new_chat(True)")
        await pilot.pause()
        await send(pilot, "a secret")
        await wait_for(pilot, loader.backends[0].held.is_set)
        await send(pilot, "a second secret")  # waits behind the reply
        conversation = app.conversation
        assert conversation.prompt.prompts == ["an open question", "a secret", "a second secret"]
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert conversation.prompt.prompts == ["an open question"]  # Up no longer recalls them
        assert conversation.prompt.text == "a second secret"  # the unsent one is not lost
        assert any("unsent prompts are back in the box" in n for n in await notices(pilot))


async def test_a_delete_during_a_private_chat_keeps_its_prompts_apart(make_app: Callable[..., SpecChatApp]) -> None:
    """Deleting a saved chat's prompts from Up's recall merged neighbours that became equal, and the
    private chat's mark slipped: its prompt stayed recalled after it ended (a review's)."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        conversation = app.conversation
        conversation.prompt.set_history(["a", "x", "a"])
        await conversation.new_chat(private=True)
        conversation.prompt.remember("private p")
        conversation.forget_prompts(["x"])
        assert conversation.prompt.prompts == ["a", "private p"]
        await conversation.new_chat()  # the private chat ends: its prompts leave the recall
        assert conversation.prompt.prompts == ["a"]
