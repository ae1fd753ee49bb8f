"""Out-of-memory recovery frees the failed pass's memory before it retries.

A failed forward's frames live on in the exception's traceback, and with them
its activations (pytorch/pytorch#18853). If the decoder dropped the draft and
retried inside the ``except`` block, ``empty_cache()`` could not return that
memory and the retry would run out again. These stand-ins hold a large tensor
in the failing frame and check, through a weakref, that it (and a failed draft
model) is gone both when the device releases memory and when the next pass
starts.
"""
from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field

import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.model.device import Device
from engine.decode.drafters import ModelDrafter
from engine.errors import EngineError
from engine.events import GenerationParams
from tests.tiny import noisy_copy, tiny_llama

PROMPT = [3, 5, 7, 11, 13]


@dataclass
class Probe:
    """Weak references to what a failed pass held; records any still alive."""

    refs: list[tuple[str, weakref.ref]] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    releases: int = 0

    def check(self, when: str) -> None:
        self.leaks += [f"{name} alive at {when}" for name, ref in self.refs if ref() is not None]


@dataclass(frozen=True)
class ProbeDevice(Device):
    """The CPU, with ``release_memory`` standing in for ``torch.cuda.empty_cache``:
    the allocator can only hand back blocks nothing references any more."""

    probe: Probe = field(default_factory=Probe)

    def release_memory(self) -> None:
        gc.collect()  # what Device.release_memory does before empty_cache()
        self.probe.releases += 1
        self.probe.check(f"release_memory #{self.probe.releases}")


class HoldsThenFails(torch.nn.Module):
    """Wraps a model. On the chosen calls its forward allocates an activation
    (16 MiB) and raises CUDA's OOM error with it still in the frame. Every call
    first checks that what earlier failures held is gone."""

    def __init__(self, name: str, model: torch.nn.Module, fail_on: set[int], probe: Probe) -> None:
        super().__init__()
        self.name, self.model, self.config = name, model, model.config
        self.fail_on, self.probe, self.calls = fail_on, probe, 0

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    def forward(self, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.probe.check(f"{self.name} call {self.calls}")
        if self.calls in self.fail_on:
            activation = torch.ones(4 * 1024 * 1024)  # 16 MiB, referenced only by this frame
            self.probe.refs.append((f"{self.name}'s activation", weakref.ref(activation)))
            if self.name == "draft":  # a failed draft is dropped: it must go too
                self.probe.refs.append(("the draft model", weakref.ref(self)))
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return self.model(**kwargs)


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1)


def plain(target: torch.nn.Module, n: int) -> list[int]:
    decoder = SpecDecoder(target, Device(torch.device("cpu")))
    return [t for e in decoder.generate(PROMPT, GenerationParams(max_new_tokens=n)) for t in e.token_ids]


@pytest.mark.parametrize(
    ("fails", "call", "notice"),
    [
        ("target", 1, "out of memory while reading the prompt"),
        ("target", 3, "out of memory while verifying a draft"),
        ("draft", 1, "out of memory while the draft read the prompt"),
        ("draft", 3, "out of memory while drafting"),
    ],
)
def test_the_failed_pass_is_freed_before_the_draft_is_dropped_and_the_pass_retried(
    target: torch.nn.Module, fails: str, call: int, notice: str
) -> None:
    device = ProbeDevice(torch.device("cpu"))
    probe = device.probe
    wrapped_target = HoldsThenFails("target", target, {call} if fails == "target" else set(), probe)
    # The draft wrapper is referenced only by the decoder, so dropping it can free it.
    draft = ModelDrafter(
        HoldsThenFails("draft", noisy_copy(target, 0.05, seed=2), {call} if fails == "draft" else set(), probe),
        device,
    )
    decoder = SpecDecoder(wrapped_target, device, draft, calibrate_every=0)
    del draft
    events = list(decoder.generate(PROMPT, GenerationParams(max_new_tokens=20, k=3)))

    assert probe.refs, "the stand-in never failed"
    assert probe.releases >= 1
    assert probe.leaks == []
    assert [t for e in events for t in e.token_ids] == plain(target, 20)
    assert [e.notice for e in events if e.notice] == [
        f"draft dropped ({notice}); continuing with plain decoding"
    ]
    assert wrapped_target.calls > call  # the target went on (a retry or the next round)


def test_a_target_oom_without_a_draft_raises_without_keeping_the_failed_pass(target: torch.nn.Module) -> None:
    device = ProbeDevice(torch.device("cpu"))
    decoder = SpecDecoder(HoldsThenFails("target", target, {4}, device.probe), device)
    with pytest.raises(EngineError, match="target model ran out of memory") as caught:
        list(decoder.generate(PROMPT, GenerationParams(max_new_tokens=20)))
    # The error the user sees does not chain to the OOM (whose traceback holds the pass).
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    device.probe.check("the error's handler")
    assert device.probe.leaks == []
