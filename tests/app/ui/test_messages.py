"""The Outbox between a reply's worker and the UI: rounds kept in order, the UI told once per batch."""
from __future__ import annotations

import threading

from app.ui.messages import Outbox
from engine.events import ChatEvent, ReplyStats


def event(text: str) -> ChatEvent:
    return ChatEvent(text=text, pieces=(), token_ids=(), stats=ReplyStats())


def test_the_ui_is_told_once_until_it_takes_the_rounds() -> None:
    outbox = Outbox()
    assert outbox.put(event("a")) is True
    assert outbox.put(event("b")) is False and outbox.put(event("c")) is False
    assert [e.text for e in outbox.take()] == ["a", "b", "c"]
    assert outbox.take() == []
    assert outbox.put(event("d")) is True  # taken: the next round tells the UI again


def test_an_empty_take_also_rearms_the_notice() -> None:
    outbox = Outbox()
    outbox.take()
    assert outbox.put(event("a")) is True


def test_rounds_put_from_threads_are_all_taken_once_each() -> None:
    outbox = Outbox()
    told: list[bool] = []
    taken: list[str] = []

    def worker(n: int) -> None:
        for i in range(200):
            told.append(outbox.put(event(f"{n}:{i}")))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        taken += [e.text for e in outbox.take()]
    for t in threads:
        t.join()
    taken += [e.text for e in outbox.take()]
    assert sorted(taken) == sorted(f"{n}:{i}" for n in range(4) for i in range(200))
    for n in range(4):  # each worker's rounds keep their order
        assert [t for t in taken if t.startswith(f"{n}:")] == [f"{n}:{i}" for i in range(200)]
    assert 1 <= sum(told) <= len(taken)
