"""A prompt lookup on the device (engine/decode/chain_drafts.py: DeviceLookup), so that an n-gram
drafter's rounds chain on a card as a model draft's do: the same proposal as the host's
NgramDrafter for every position of many sequences, and a chained n-gram reply that is plain
decoding's, with a stop token, a second turn and calibration bursts in between."""
from __future__ import annotations

import random

import pytest
import torch

from engine.decode.chain_drafts import DeviceLookup
from engine.decode.decoder import SpecDecoder
from engine.decode.drafters import NgramDrafter, match_key
from engine.events import SamplingParams
from engine.model.capture import RecordingBackend
from engine.model.device import Device
from tests.engine.decode.test_chain import plain, rounds_per_event
from tests.engine.decode.test_plain_burst import reply
from tests.tiny import tiny_llama

CPU = Device(torch.device("cpu"))


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1)


def device_proposal(lookup: DeviceLookup, seq: list[int], k: int) -> tuple[list[int], int]:
    lookup.begin(seq)
    p = torch.tensor(len(seq) - 1)
    drafted, ok, length = lookup.draft(torch.tensor(seq[-2:]), p, k, len(seq) + k)
    assert bool(ok)
    tokens = drafted.tolist()
    kept = tokens[: tokens.index(-1)] if -1 in tokens else tokens
    assert all(t == -1 for t in tokens[len(kept):])  # a cut proposal: nothing after the first gap
    return kept, int(length)


@pytest.mark.parametrize("ngram", [(4, 1), (3, 2), (1, 1)], ids=["4..1", "3..2", "1"])
def test_the_device_lookup_proposes_what_the_host_lookup_does(ngram) -> None:
    rng = random.Random(5)
    host = NgramDrafter(*ngram)
    lookup = DeviceLookup(host, window=400, device=CPU)
    checked = found = 0
    for _ in range(12):
        phrase = [rng.randrange(20) for _ in range(rng.randrange(3, 9))]
        seq: list[int] = []
        while len(seq) < 120:  # text that repeats itself, with noise between the copies
            seq += phrase[: rng.randrange(1, len(phrase) + 1)] if rng.random() < 0.6 else [rng.randrange(20)]
        for end in range(2, len(seq), 3):
            context = seq[:end]
            k = rng.choice([1, 4, 8])
            expected = NgramDrafter(*ngram).propose(context, k, SamplingParams(), None)
            tokens, length = device_proposal(lookup, context, k)
            assert tokens == list(expected.tokens), (context, k)
            if expected.tokens:
                assert match_key(length) == expected.key
                found += 1
            checked += 1
    assert checked > 400 and found > checked // 3  # matches and misses both met


def test_the_device_copy_is_uploaded_where_it_differs_only(monkeypatch) -> None:
    uploads: list[list[int]] = []
    real = Device.ids_tensor
    monkeypatch.setattr(Device, "ids_tensor", lambda self, ids: uploads.append(list(ids)) or real(self, ids))
    lookup = DeviceLookup(NgramDrafter(), window=64, device=CPU)
    lookup.begin([1, 2, 3, 4, 5])
    lookup.ids[5:8] = torch.tensor([6, 7, 8])  # as a chained round writes past the pending token
    lookup.wrote([1, 2, 3, 4, 5], [6, 7, 8])
    lookup.begin([1, 2, 3, 4, 5, 6, 7, 8, 9])  # a burst added 9: only that is uploaded
    assert lookup.ids[:9].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    lookup.begin([1, 2, 9, 9])  # a new chat: from the first difference
    assert lookup.ids[:4].tolist() == [1, 2, 9, 9] and lookup.held == [1, 2, 9, 9]
    assert uploads == [[1, 2, 3, 4, 5], [9], [9, 9]]


REPEATS = [3, 5, 7, 11, 13, 17, 19, 23] * 3 + [3, 5]


@pytest.mark.parametrize("graphs", [True, False], ids=["captured", "eager"])
def test_a_chained_n_gram_reply_is_the_plain_reply(target, graphs) -> None:
    expected = plain(target, REPEATS, max_new_tokens=64)
    device = Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend() if graphs else None)
    decoder = SpecDecoder(target, device, NgramDrafter(), calibrate_every=0)
    decoder.chain = 3
    got, events = reply(decoder, REPEATS, max_new_tokens=64)
    assert got == expected
    assert max(rounds_per_event(events)) == 3  # rounds chained
    stats = events[-1].stats
    assert stats.rounds == stats.target_passes and stats.proposed > 0
    assert stats.accepted == sum(e.sources.count("draft") for e in events)
    assert "chat" in {e.origin for e in events}
    turn = REPEATS + got + [9, 4]
    assert reply(decoder, turn, max_new_tokens=30)[0] == plain(target, turn, max_new_tokens=30)


def test_chained_n_gram_rounds_draft_and_count_as_rounds_a_read_back_do(target, monkeypatch) -> None:
    """With K fixed, a chain's rounds propose what the host lookup would, round for round (the
    device copy follows every round: each one's choices are written past its pending token), and
    they are counted as lookup rounds: free (no draft model's step), keyed by match length."""
    from tests.engine.decode.test_gpu_syncs import Transfers
    from engine.events import GenerationParams

    counts = {}
    for rounds in (1, 3):
        device = Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend())
        decoder = SpecDecoder(target, device, NgramDrafter(), calibrate_every=0, auto_off_window=0)
        decoder.chain = rounds
        got, events = reply(decoder, REPEATS, max_new_tokens=60, k=3)
        stats = events[-1].stats
        counts[rounds] = (got, stats.proposed, stats.accepted)
    assert counts[3] == counts[1] and counts[1][2] > 0

    device = Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend())
    decoder = SpecDecoder(target, device, NgramDrafter(), calibrate_every=0, auto_off_window=0)
    decoder.chain = 3
    reply(decoder, REPEATS, max_new_tokens=30)  # adaptive K: every drafting round chained
    assert decoder.costs.draft_step_s is None  # a lookup's time is no draft model's step
    assert max(decoder.costs.positions) > 1  # keyed by match length, not all under one key

    decoder = SpecDecoder(target, Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend()),
                          NgramDrafter(), calibrate_every=0, auto_off_window=0)
    decoder.chain = 3
    steps = decoder.generate(REPEATS, GenerationParams(max_new_tokens=60, k=3))
    next(steps)
    transfers = Transfers(monkeypatch)
    event = next(steps)
    monkeypatch.undo()
    assert rounds_per_event([event]) and transfers.calls == ["tolist"]  # three rounds, one read-back


def test_a_stop_token_in_a_chained_n_gram_reply_and_calibration_between(target) -> None:
    expected = plain(target, REPEATS, max_new_tokens=60)
    stop = expected[25]
    cut = plain(target, REPEATS, max_new_tokens=60, stop_token_ids=(stop,))
    device = Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend())
    decoder = SpecDecoder(target, device, NgramDrafter(), calibrate_every=3)
    decoder.chain, decoder.burst = 3, 4
    got, events = reply(decoder, REPEATS, max_new_tokens=60, stop_token_ids=(stop,))
    assert got == cut and events[-1].finish_reason == "eos"
    assert decoder.target.ids == REPEATS + got[:-1] and decoder._queued is None
    assert any(set(e.sources) == {"target"} and len(e.token_ids) > 1 for e in events)  # a calibration burst
    turn = REPEATS + got + [6, 6]  # after a chain queued behind was dropped at the stop token
    assert reply(decoder, turn, max_new_tokens=30)[0] == plain(target, turn, max_new_tokens=30)


def test_a_round_that_verified_k_plus_one_tokens_is_no_plain_step_however_little_it_proposed() -> None:
    from engine.decode.cost_model import CostModel

    chained, single = CostModel(), CostModel()
    for _ in range(6):
        chained.observe(0, 0, 0.0, 0.004, 0.0, free=True, fed=5)  # a lookup that found nothing, verified 5 wide
        single.observe(0, 0, 0.0, 0.001, 0.0, free=True)  # a one-token round: the plain step
    assert chained.rounds_since_plain > 0 and single.rounds_since_plain == 0
    assert chained.pass_cost(5) is not None and chained.passes.plain_step_s is None
    assert single.passes.plain_step_s is not None


def test_a_lookup_chain_takes_the_k_its_last_chain_could_use() -> None:
    """Each chained lookup round verifies K + 1 tokens whatever it found: K follows what the last
    chain accepted (twice its best round; 1 after a chain that took nothing), not k_max."""
    from engine.decode.cost_model import CostModel
    from engine.decode.drafters import ModelDrafter
    from engine.decode.schedule import LOOKUP_K_START, Schedule
    from engine.events import GenerationParams

    schedule = Schedule(CostModel(), calibrate_every=0, auto_off_window=0, reprobe_after=64)
    adaptive, fixed = GenerationParams(k_max=16), GenerationParams(k=6)
    lookup = NgramDrafter()
    assert schedule.chain_k(lookup, 16, adaptive) == LOOKUP_K_START < 16
    schedule.chain_read(adaptive, 0)  # nothing taken: a 2-token pass a round
    assert schedule.chain_k(lookup, 16, adaptive) == 1
    schedule.chain_read(adaptive, 1)
    assert schedule.chain_k(lookup, 16, adaptive) == 2
    schedule.chain_read(adaptive, 11)
    assert schedule.chain_k(lookup, 16, adaptive) == 16  # within k_max
    assert schedule.chain_k(lookup, 3, adaptive) == 3  # never past the policy's K (the room left)
    assert schedule.chain_k(lookup, 0, adaptive) == 0  # not drafting
    schedule.chain_read(fixed, 0)
    assert schedule.chain_k(lookup, 6, fixed) == 6  # a K the request fixed stands
    assert schedule.chain_k(ModelDrafter.__new__(ModelDrafter), 5, adaptive) == 5  # a model's K is the cost model's


def test_a_chained_lookup_reply_starts_below_k_max_and_stays_the_plain_reply(target) -> None:
    from engine.decode.schedule import LOOKUP_K_START

    expected = plain(target, REPEATS, max_new_tokens=64)
    device = Device(torch.device("cpu"), static_cache=True, graphs=RecordingBackend())
    decoder = SpecDecoder(target, device, NgramDrafter(), calibrate_every=0, auto_off_window=0)
    decoder.chain = 3
    got, events = reply(decoder, REPEATS, max_new_tokens=64)
    assert got == expected
    chained = [e for e in events if len(rounds_per_event([e])) and max(rounds_per_event([e])) > 1]
    assert chained and chained[0].stats.k == LOOKUP_K_START
    assert all(e.stats.k <= 16 for e in events)
