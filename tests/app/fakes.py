"""A fast, scripted stand-in for the engine, and profiles to load it with."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

from engine.api import EngineInfo
from engine.errors import EngineDiedError, LoadStoppedError
from engine.progress import ProgressFn
from engine.events import NOT_PAYING, OFF_BY_USER, ChatEvent, ChatMessage, GenerationParams, ReplyStats, TextPiece
from engine.config.profiles import ModelProfile, ModelSpec, Profiles

DEFAULT_SCRIPT: tuple[tuple[tuple[str, str], ...], ...] = (
    (("Hello", "draft"), (" there", "draft"), ("!", "target")),
    ((" Here", "draft"), (" is", "draft"), (" code", "target")),
    ((":\n\n```python\n", "draft"), ("print(", "target")),
    (("'hi')\n", "draft"), ("```\n", "target")),
    (("Done", "draft"), (".", "target")),
)
"""Rounds of ``(text, source)`` pieces: draft-accepted tokens, then the target's own."""


def make_profiles() -> Profiles:
    """Two profiles: a model-drafted pair and an n-gram one."""
    fast = ModelProfile(
        name="fast",
        target=ModelSpec("org/Target-1.7B", quantization="nf4"),
        drafter="model",
        draft=ModelSpec("org/Draft-135M"),
        description="Target with a small draft",
        system_prompt="You are terse.",
    )
    lookup = ModelProfile(
        name="lookup",
        target=ModelSpec("org/Target-360M"),
        drafter="ngram",
        k=4,
        description="Prompt-lookup drafting",
    )
    return Profiles({"fast": fast, "lookup": lookup}, default="fast", files=())


class FakeBackend:
    """Implements ``ChatBackend``: yields a scripted reply, a few ms per round."""

    def __init__(
        self,
        profile: ModelProfile,
        *,
        script: Sequence[Sequence[tuple[str, str]]] = DEFAULT_SCRIPT,
        delay: float = 0.005,
        hold_after: int | None = None,
        fallback_reason: str | None = None,
        notice_round: tuple[int, str] | None = None,
        auto_off_round: int | None = None,
    ) -> None:
        self.profile = profile
        self.script = script
        self.delay = delay
        self.hold_after = hold_after
        """Wait after this many rounds until ``release`` or ``cancel`` is set."""
        self.release = threading.Event()
        self.held = threading.Event()
        self.fallback_reason = fallback_reason
        self.notice_round = notice_round
        self.auto_off_round = auto_off_round
        """After this round the engine switches speculation off by itself (quietly, as the engine does)."""
        self.auto_off_reason: str | None = None
        self.speculation = True
        self.closed = False
        self.alive = True
        """False once the engine "died" (:attr:`dies`), as a killed engine process reads."""
        self.dies = threading.Event()
        """Set while a reply is held: the reply ends as the engine process's death ends it."""
        self.calls: list[list[ChatMessage]] = []
        self.learned: list[list[str]] = []
        """What each learn() was given (the suffix drafter's earlier chats)."""
        self.params: list[GenerationParams] = []

    @property
    def info(self) -> EngineInfo:
        drafter = "none" if self.fallback_reason else self.profile.drafter
        mode = "plain" if (self.fallback_reason or not self.speculation) else (
            "ngram" if drafter == "ngram" else "spec")
        return EngineInfo(
            profile=self.profile.name,
            target=self.profile.target.source,
            drafter=drafter,
            mode=mode,  # type: ignore[arg-type]
            device="fake:0",
            quantization=self.profile.target.quantization,
            plan={"summary": "target nf4 + draft fp16 fit with 5.2 GiB to spare", "budget_bytes": 8 * 2**30},
            fallback_reason=self.fallback_reason,  # as the real engine's info: a drop here, a switch below
            off_reason=self.auto_off_reason or (None if self.speculation else OFF_BY_USER),
            target_bytes=1200 * 2**20,
            draft_bytes=None if self.fallback_reason else 270 * 2**20,
            free_bytes=5 * 2**30,
        )

    def _stats(self, rounds: int, tokens: int, accepted: int,
               mode_tokens: tuple[tuple[str, int], ...] = ()) -> ReplyStats:
        proposed = 4 * rounds
        info = self.info
        return ReplyStats(
            mode=info.mode, drafter=info.drafter, k=4, adaptive=self.profile.k is None,
            rounds=rounds, target_passes=rounds, proposed=proposed, accepted=accepted, tokens=tokens,
            alpha=accepted / proposed if proposed else None,
            tau=tokens / rounds if rounds else None,
            per_position=(0.9, 0.7, 0.5, 0.25)[: min(4, rounds + 1)],
            elapsed_s=0.1 * rounds, tokens_per_s=40.0 + rounds, itl_ms=25.0 - rounds,
            plain_tokens_per_s=20.0 if rounds >= 2 else None,
            speedup=(40.0 + rounds) / 20.0 if rounds >= 2 else None,
            speedup_se=0.05 if rounds >= 2 else None,
            speculation_off_reason=None if self.speculation else (self.auto_off_reason or "switched off"),
            mode_tokens=mode_tokens or ((info.mode, tokens),),  # type: ignore[arg-type]
        )

    def chat(
        self,
        messages: Sequence[ChatMessage],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[ChatEvent]:
        assert not self.closed, "chat() on a closed backend"
        self.calls.append(list(messages))
        self.params.append(params)
        tokens = accepted = 0
        modes: dict[str, int] = {}
        for i, round_pieces in enumerate(self.script, start=1):
            if cancel is not None and cancel.is_set():
                yield ChatEvent("", (), (), self._stats(i - 1, tokens, accepted), finish_reason="cancelled")
                return
            time.sleep(self.delay)
            pieces = tuple(TextPiece(t, s) for t, s in round_pieces)  # type: ignore[arg-type]
            tokens += len(pieces)
            accepted += sum(1 for p in pieces if p.source == "draft")
            modes[self.info.mode] = modes.get(self.info.mode, 0) + len(pieces)
            last = i == len(self.script)
            notice = self.notice_round[1] if self.notice_round and self.notice_round[0] == i else None
            if self.auto_off_round == i and self.speculation:
                self.speculation = False
                self.auto_off_reason = NOT_PAYING  # as the engine does: quietly, no notice
            yield ChatEvent(
                "".join(p.text for p in pieces), pieces, tuple(range(len(pieces))),
                self._stats(i, tokens, accepted, tuple(modes.items())), finish_reason="eos" if last else None,
                notice=notice,
            )
            if self.hold_after == i and not last:
                self.held.set()
                while not self.release.is_set() and not (cancel is not None and cancel.is_set()):
                    if self.dies.is_set():
                        self.alive = False
                        raise EngineDiedError("the engine process was killed; the conversation is kept")
                    time.sleep(0.005)

    def set_speculation(self, enabled: bool) -> None:
        self.speculation = enabled
        self.auto_off_reason = None

    def learn(self, texts: Sequence[str]) -> None:
        self.learned.append(list(texts))

    def close(self) -> None:
        self.closed = True


class FakeLoader:
    """``loader(profile, budget, progress)`` that reports progress and hands out FakeBackends."""

    def __init__(self, **backend_kwargs: object) -> None:
        self.backend_kwargs = backend_kwargs
        self.backends: list[FakeBackend] = []
        self.error: Exception | None = None
        self.budgets: list[int | None] = []
        self.gate: threading.Event | None = None
        """When set to an Event, loading waits for it (a model still loading)."""

    def __call__(self, profile: ModelProfile, memory_budget: int | None, progress: ProgressFn,
                 stop: threading.Event | None = None) -> FakeBackend:
        self.budgets.append(memory_budget)
        progress("reading config", 0.0)
        progress("loading target weights", 0.5)
        if self.gate is not None:
            deadline = time.monotonic() + 10
            while not self.gate.wait(0.01) and time.monotonic() < deadline:
                if stop is not None and stop.is_set():  # as the real loader: its process ends at once
                    raise LoadStoppedError(f"Stopped loading {profile.name}.")
        if self.error is not None:
            raise self.error
        progress("loading draft weights", 1.0)
        backend = FakeBackend(profile, **self.backend_kwargs)  # type: ignore[arg-type]
        self.backends.append(backend)
        return backend


def with_k(profile: ModelProfile, k: int | None) -> ModelProfile:
    return replace(profile, k=k)
