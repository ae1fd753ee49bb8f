"""Host syncs in the hot loop (issue 23, item 5): one device-to-host transfer per drafting call
and per verify pass, token ids copied from pinned memory without blocking, and a round timed
by device marks (CUDA events) with one wait instead of four ``torch.cuda.synchronize``.

Stand-ins on the CPU: the tensor methods that read a value back to the host are counted
(on CUDA each one waits for the card), and a card is faked for the device's own calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.decode.drafters import ModelDrafter
from engine.events import GenerationParams, SamplingParams
from engine.model import device as device_module
from engine.model.device import Device
from tests.tiny import noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))
READ_BACKS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")


class Transfers:
    """Counts the calls that copy a tensor's value to the host."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in READ_BACKS:
            real = getattr(torch.Tensor, name)

            def counted(self_: torch.Tensor, *a: object, _real=real, _name=name, **k: object) -> object:  # type: ignore[no-untyped-def]
                self.calls.append(_name)
                return _real(self_, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, seed=4),
                                      SamplingParams(temperature=0.7)], ids=["greedy", "seeded", "sampled"])
def test_drafting_k_tokens_reads_back_once(monkeypatch: pytest.MonkeyPatch, sampling: SamplingParams) -> None:
    from engine.decode.sampling import make_randomness

    target = tiny_llama(seed=1)
    drafter = ModelDrafter(noisy_copy(target, 0.05, seed=2), CPU)
    context = [5, 6, 7, 8, 9, 10]
    generator = make_randomness(sampling, len(context), 96, CPU)
    drafter.prefill(context)
    transfers = Transfers(monkeypatch)
    draft = drafter.propose(context, 6, sampling, generator)
    assert transfers.calls == ["tolist"]  # not one per drafted token
    assert len(draft.tokens) == 6 and all(isinstance(t, int) for t in draft.tokens)
    monkeypatch.undo()
    assert drafter.runner.ids == [*context, *draft.tokens[:-1]]  # the runner knows what it holds


def test_a_greedy_draft_is_the_one_token_at_a_time_argmax() -> None:
    target = tiny_llama(seed=1)
    draft_model = noisy_copy(target, 0.05, seed=2)
    drafter = ModelDrafter(draft_model, CPU)
    context = [5, 6, 7, 8]
    draft = drafter.propose(context, 5, SamplingParams(), None)
    seq = list(context)
    for _ in range(5):
        with torch.no_grad():
            seq.append(int(draft_model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert list(draft.tokens) == seq[len(context):]


@dataclass(frozen=True)
class CountingDevice(Device):
    """The CPU, counting the clock and sync calls a decoding round makes."""

    counts: dict[str, int] = field(default_factory=dict)

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def synchronize(self) -> None:
        self._count("synchronize")
        super().synchronize()

    def mark(self):  # type: ignore[no-untyped-def]
        self._count("mark")
        return super().mark()

    def seconds_between(self, marks):  # type: ignore[no-untyped-def]
        self._count("seconds_between")
        return super().seconds_between(marks)


def test_a_round_is_timed_by_marks_and_waits_once(monkeypatch: pytest.MonkeyPatch) -> None:
    target = tiny_llama(seed=1)
    device = CountingDevice(torch.device("cpu"))
    decoder = SpecDecoder(target, device, ModelDrafter(noisy_copy(target, 0.05, seed=2), device))
    events = list(decoder.generate([5, 6, 7, 8, 9], GenerationParams(max_new_tokens=12, k=3)))
    rounds = len(events)
    assert device.counts.get("synchronize", 0) == 0  # was four a round (Device.now)
    assert device.counts["mark"] == 4 * rounds + 2 and device.counts["seconds_between"] == rounds + 1
    stats = events[-1].stats
    assert stats.prefill_s >= 0 and stats.draft_s >= 0 and stats.verify_s > 0


def test_a_plain_round_reads_back_once(monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = SpecDecoder(tiny_llama(seed=1), CPU)
    steps = decoder.generate([5, 6, 7, 8, 9], GenerationParams(max_new_tokens=3))
    next(steps)  # the prefill and the first round
    transfers = Transfers(monkeypatch)
    next(steps)
    assert transfers.calls == ["tolist"]


class FakeEvent:
    log: list[str] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = len(FakeEvent.log)

    def record(self) -> None:
        FakeEvent.log.append("record")

    def synchronize(self) -> None:
        FakeEvent.log.append("synchronize")

    def elapsed_time(self, other: "FakeEvent") -> float:
        return 1000.0 * (other.at - self.at)  # milliseconds


def test_on_a_card_marks_are_events_and_only_the_last_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: pytest.fail("the whole card was synchronized"))
    card = Device(torch.device("cuda:0"))
    marks = [card.mark() for _ in range(4)]
    assert FakeEvent.log == ["record"] * 4
    assert card.seconds_between(marks) == [1.0, 1.0, 1.0]
    assert FakeEvent.log == ["record"] * 4 + ["synchronize"]
    a, b = CPU.mark(), CPU.mark()
    assert isinstance(a, float) and CPU.seconds_between([a, b])[0] >= 0


class HostCopies:
    """Records what a host-to-card copy does (pinning, the copy and whether it blocks) without a
    card: ``pin_memory`` and ``to`` answer with the tensor itself."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[object] = []

        def pin_memory(tensor: torch.Tensor) -> torch.Tensor:
            self.seen.append("pinned")
            return tensor

        def to(tensor: torch.Tensor, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
            self.seen.append((str(device), non_blocking))
            return tensor

        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
        monkeypatch.setattr(torch.Tensor, "to", to)


def test_ids_go_to_a_card_from_pinned_memory_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = HostCopies(monkeypatch).seen
    ids = device_module.ids_tensor([3, 4, 5], torch.device("cuda:0"))
    assert seen == ["pinned", ("cuda:0", True)] and ids.tolist() == [[3, 4, 5]]
    seen.clear()
    assert CPU.ids_tensor([7]).tolist() == [[7]] and seen == []  # the CPU: a plain tensor, as before


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, seed=4)], ids=["greedy", "seeded"])
def test_a_model_draft_round_reads_back_once(monkeypatch: pytest.MonkeyPatch, sampling: SamplingParams) -> None:
    """Issue 35, item 3: the draft's picks feed the target's pass on the device, and the picks,
    the target's choices and both finiteness flags come back together: one wait a round."""
    target = tiny_llama(seed=1)
    decoder = SpecDecoder(target, CPU, ModelDrafter(noisy_copy(target, 0.05, seed=2), CPU))
    params = GenerationParams(max_new_tokens=20, k=4, sampling=sampling)
    steps = decoder.generate([5, 6, 7, 8, 9], params)
    first = next(steps)  # the prefill and a first round
    got = list(first.token_ids)
    transfers = Transfers(monkeypatch)
    event = next(steps)
    monkeypatch.undo()
    assert event.stats.proposed - first.stats.proposed == 4 and transfers.calls == ["tolist"]
    got += [t for e in [event, *steps] for t in e.token_ids]
    plain = SpecDecoder(target, CPU).generate([5, 6, 7, 8, 9], GenerationParams(max_new_tokens=20, sampling=sampling))
    assert got == [t for e in plain for t in e.token_ids]  # greedy: plain's reply; seeded: plain sampling's


def test_verify_on_device_names_the_draft_before_the_target() -> None:
    from engine.decode.verify import verify_matching_on_device
    from engine.errors import NonFiniteLogitsError

    yes, no = torch.tensor(True), torch.tensor(False)
    picks, choices = torch.tensor([4, 9, 2]), torch.tensor([4, 9, 7, 1])
    drafted, verdict = verify_matching_on_device(choices, yes, picks, yes)
    assert drafted == [4, 9, 2] and (verdict.n_accepted, verdict.next_token) == (2, 7)
    assert verify_matching_on_device(torch.tensor([4, 9, 2, 5]), yes, picks, yes)[1].next_token == 5  # all accepted: the bonus
    with pytest.raises(NonFiniteLogitsError) as raised:
        verify_matching_on_device(choices, no, picks, no)
    assert raised.value.role == "draft"
    with pytest.raises(NonFiniteLogitsError) as raised:
        verify_matching_on_device(choices, no, picks, yes)
    assert raised.value.role == "target"


def test_seeded_noise_goes_to_a_card_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seeded burst asks for a noise row at every step: copied from pageable memory, each copy
    would wait for the steps queued before it, a sync per token."""
    from engine.decode.sampling import GumbelNoise, gumbel_row

    seen = HostCopies(monkeypatch).seen
    row = GumbelNoise(7, start=10, width=96, device=Device(torch.device("cuda:0"))).row(12)
    assert seen == ["pinned", ("cuda:0", True)]
    monkeypatch.undo()
    assert torch.equal(row, gumbel_row(7, 2, 96))
    assert torch.equal(GumbelNoise(7, start=10, width=96, device=CPU).row(12), gumbel_row(7, 2, 96))
