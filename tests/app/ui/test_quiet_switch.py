"""The real engine in the real app: speculation that does not pay steps aside quietly.

A tiny target with a draft that sleeps on every pass (speculation never pays) runs
in the app as its backend. The engine switches speculation off on the evidence;
the app then shows no notice for it, the HUD and the folded line say it in plain
words, the reply footer gives the one speedup the engine measured (or "too short to
measure"), and the next reply stays plain without a re-probe.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from app.ui.app import SpecChatApp
from app.ui.widgets.chat_view import AssistantMessage
from app.ui.widgets.hud import Hud
from tests.app.helpers import ready, send, wait_for
from tests.tiny import SlowDraft, make_tokenizer, tiny_model

pytestmark = pytest.mark.anyio


def slow_engine(*_: Any) -> Any:
    """A real ChatEngine whose draft is so slow that speculating never pays."""
    from engine.api import EngineInfo
    from engine.chat.session import ChatEngine
    from engine.decode.drafters import ModelDrafter
    from engine.model.device import Device

    cpu = Device(torch.device("cpu"))
    target = tiny_model(1, mpe=256)
    drafter = ModelDrafter(SlowDraft(tiny_model(99, mpe=256), delay_s=0.01), cpu)
    info = EngineInfo(profile="pair", target="tiny", drafter=drafter.name, mode="spec", device="cpu")
    engine = ChatEngine(tokenizer=make_tokenizer(), target_model=target, drafter=drafter, device=cpu, info=info)
    switch = engine.decoder.schedule.switch
    switch.window = 8  # the evidence a switch-off needs, in rounds (32 in the app)
    switch.reprobe_after = switch.max_reprobe_after = 10_000  # no re-probe within this test
    return engine


async def test_speculation_that_does_not_pay_steps_aside_quietly(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app(loader=slow_engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        backend = app.engine.backend
        await send(pilot, "w1 w2 w3")
        await wait_for(pilot, lambda: not app.conversation.generating, timeout=60)
        assert backend.decoder.mode == "plain" and backend.decoder.off_reason  # the engine did step aside
        assert not [n.message for n in app._notifications if n.title == "Engine"]  # and no notice said so
        assert not any("switched off" in n.message for n in app._notifications)
        hud = app.query_one(Hud)
        hud.flush()
        assert "speculation off: not paying here" in str(hud.query_one("#hud-engine").render())
        footer = str(app.query(AssistantMessage).last().query_one(".reply-footer").render())
        stats = app.query(AssistantMessage).last().stats or {}
        assert ("vs plain" in footer) == (stats.get("speedup") is not None)
        if stats.get("speedup") is None:  # either note, said in words (a timing-dependent choice here)
            assert any(note in footer for note in ("too short to measure", "too uncertain to measure"))
        await send(pilot, "w4 w5")
        await wait_for(pilot, lambda: len(app.query(AssistantMessage)) == 2 and not app.conversation.generating,
                       timeout=60)
        second = app.query(AssistantMessage).last()
        assert second.stats is not None and second.stats["proposed"] == 0  # no re-probe at the next reply
        assert "vs plain" not in str(second.query_one(".reply-footer").render())  # plain: no "× vs plain"
        assert not any("switched off" in n.message or "back on" in n.message for n in app._notifications)
