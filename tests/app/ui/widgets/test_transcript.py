"""The transcript as data: saved records back to widgets, the last exchange, and the turns the model sees."""
from __future__ import annotations

from app.store.history import MessageRecord
from app.ui.requests import turns_from
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from app.ui.widgets.transcript import copyable, last_exchange, messages_of, widgets_for
from engine.events import ChatMessage


def record(i: int, role: str, content: str, superseded: bool = False) -> MessageRecord:
    return MessageRecord(i, 1, role, content, "fast" if role == "assistant" else None, None, None,
                         "eos" if role == "assistant" else None, 0.0, superseded)


def reply(text: str, finished: bool = True) -> AssistantMessage:
    return AssistantMessage("fast", text=text, finish_reason="eos" if finished else None)


def test_a_saved_chat_comes_back_with_regenerated_and_edited_exchanges_dimmed() -> None:
    records = [record(1, "user", "first"), record(2, "assistant", "answer one"),
               record(3, "assistant", "answer one, again"),  # regenerated: the one before is superseded
               record(4, "user", "second", superseded=True), record(5, "assistant", "old", superseded=True),
               record(6, "user", "second, edited"), record(7, "assistant", "")]
    widgets = widgets_for(records, show_sources=False)
    assert [(w.role, w.text, w.superseded) for w in widgets] == [
        ("user", "first", False), ("assistant", "answer one", True), ("assistant", "answer one, again", False),
        ("user", "second", True), ("assistant", "old", True), ("user", "second, edited", False),
        ("assistant", "", False)]
    assert turns_from(widgets) == [ChatMessage("user", "first"), ChatMessage("assistant", "answer one, again"),
                                   ChatMessage("user", "second, edited")]  # an empty reply is not a turn


def test_the_last_exchange_is_the_last_prompt_and_the_last_reply_after_it() -> None:
    first, second = UserMessage("a"), UserMessage("b")
    old, new = reply("x"), reply("y")
    assert last_exchange([first, reply("r"), second, old, new]) == (second, new)
    assert last_exchange([first, second]) == (second, None)
    assert last_exchange([reply("orphan")]) is None


def test_only_messages_are_read_and_copied() -> None:
    from textual.widgets import Static

    children = [Static("welcome"), UserMessage("q"), reply("a")]
    assert len(messages_of(children)) == 2
    assert copyable(children) == [("user", "q"), ("assistant", "a")]
