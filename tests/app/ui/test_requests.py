"""What a reply request carries: the profile's settings, the system prompt first, and only the turns that count."""
from __future__ import annotations

from app.ui.requests import build_messages, generation_params, turns_from
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from engine.events import ChatMessage
from tests.app.fakes import make_profiles


def reply(text: str, finished: bool = True) -> AssistantMessage:
    return AssistantMessage("fast", text=text, finish_reason="eos" if finished else None)


def test_generation_params_follow_profile() -> None:
    profiles = make_profiles()
    adaptive = generation_params(profiles.get("fast"))
    assert adaptive.k is None and (adaptive.k_min, adaptive.k_max) == (1, 8) and adaptive.max_new_tokens == 512
    fixed = generation_params(profiles.get("lookup"), max_new_tokens=64)
    assert fixed.k == 4 and fixed.max_new_tokens == 64 and fixed.sampling.greedy


def test_messages_put_system_prompt_first() -> None:
    turns = [ChatMessage("user", "hi")]
    assert build_messages(None, turns) == turns
    assert build_messages("Be brief.", turns)[0] == ChatMessage("system", "Be brief.")


def test_waiting_prompts_and_the_reply_being_written_are_not_turns() -> None:
    queued = UserMessage("later")
    queued.set_waiting("waiting for the reply above")
    widgets = [UserMessage("now"), reply("partial", finished=False), queued]
    assert turns_from(widgets) == [ChatMessage("user", "now")]
    queued.set_waiting(None)
    assert turns_from(widgets)[-1] == ChatMessage("user", "later")
