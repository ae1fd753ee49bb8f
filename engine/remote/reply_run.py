"""One streamed reply from a server as it arrives: its text, timings, usage and finish
(:class:`ReplyRun`), read chunk by chunk (:func:`read_reply`), and a model id as it is shown."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.remote.figures import clean_timings, clean_usage
from engine.text_safety import inert

MAX_TOKEN_CHARS = 256
"""More characters than any token spells: a reply longer than ``max_tokens`` times this went
past its budget, however few chunks carried it."""

MODEL_NAME_SHOWN = 80
"""The most of a server's model name shown (its id is sent back whole)."""


def shown_model(name: str) -> str:
    """A model id as the HUD and messages show it: one line, at most :data:`MODEL_NAME_SHOWN`
    characters, its control characters visible (:func:`~engine.text_safety.inert`)."""
    name = " ".join(inert(name).split())
    return name if len(name) <= MODEL_NAME_SHOWN else name[:MODEL_NAME_SHOWN - 1] + "…"


@dataclass
class ReplyRun:
    """One streamed request as it arrives."""

    t0: float = field(default_factory=time.perf_counter)
    t_first: float | None = None
    t_last: float | None = None
    chunks: int = 0
    events: int = 0
    """Payloads the stream carried, with text or without."""
    text: list[str] = field(default_factory=list)
    chars: int = 0
    """Characters in ``text``."""
    finish: str | None = None
    timings: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    over_budget: bool = False
    """The server went on past ``max_tokens`` and was cut there."""
    reasoning_chars: int = 0
    """Characters of a reasoning model's thoughts (``reasoning_content``: not shown, not kept)."""

    budget: int | None = None
    """The ``max_tokens`` the request was sent: a count above it is no count of this reply."""

    @property
    def tokens(self) -> int:
        """Reply tokens: the server's count where it gives one it could have made (at most the
        budget it was sent: a server said 999999 of 256), else content chunks."""
        for source, key in ((self.usage, "completion_tokens"), (self.timings, "predicted_n")):
            if source and isinstance(source.get(key), int) and (self.budget is None or source[key] <= self.budget):
                return int(source[key])
        return self.chunks

    def client_rate(self) -> float | None:
        """Decode tokens/s as seen here: tokens after the first over the time they took."""
        if self.t_first is None or self.t_last is None or self.t_last <= self.t_first or self.tokens < 2:
            return None
        return (self.tokens - 1) / (self.t_last - self.t_first)

    def server_rate(self) -> float | None:
        rate = (self.timings or {}).get("predicted_per_second")
        return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None

    def rate(self) -> float | None:
        """The server's own decode rate where it reports one, else the client's."""
        return self.server_rate() or self.client_rate()


def read_reply(payloads: Iterator[Any], budget: int | None, cancel: threading.Event, run: ReplyRun) -> Iterator[str]:
    """Each piece of reply text in ``payloads`` (the stream's chunks); ``run`` collects timings,
    usage and finish. A server that ignores ``budget`` (``max_tokens``) is cut there: each text
    chunk holds at least one token, so a chunk past that many (or a stream of twice as many
    events) means the server would go on; the reply then ends with finish ``length`` and
    ``run.over_budget`` set."""
    for payload in payloads:
        now = time.perf_counter()
        run.events += 1
        if budget is not None and run.events > 2 * budget + 16:  # events without text, forever
            run.finish, run.over_budget = "length", True
            return
        if isinstance(payload.get("timings"), dict) and payload["timings"]:  # only counts and finite rates
            run.timings = clean_timings(payload["timings"])
        if isinstance(payload.get("usage"), dict) and payload["usage"]:  # only counts a server could make
            run.usage = clean_usage(payload["usage"])
        choices = payload.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            part = choice.get("delta") or choice.get("message") or {}
            text = part.get("content") if isinstance(part, dict) else None
            text = text if isinstance(text, str) else None  # a number or list where the text goes: left out
            thought = part.get("reasoning_content", part.get("reasoning")) if isinstance(part, dict) else None
            if isinstance(thought, str):
                run.reasoning_chars += len(thought)
            if text and budget is not None and run.chunks >= budget:
                run.finish, run.over_budget = "length", True
                return
            over = False
            if text and budget is not None and len(text) > budget * MAX_TOKEN_CHARS - run.chars:
                text, over = text[:budget * MAX_TOKEN_CHARS - run.chars], True  # no budget's tokens spell more
            run.finish = choice.get("finish_reason") or run.finish
            if text:
                run.chunks += 1
                run.t_first = run.t_first or now
                run.t_last = now
                run.text.append(text)
                run.chars += len(text)
                yield text
            if over:
                run.finish, run.over_budget = "length", True
                return
        if cancel.is_set():
            return
