"""The suffix drafter: the index answers as a naive search would, drafts follow the evidence,
what was forgotten is never proposed, and output stays exactly plain decoding's."""
from __future__ import annotations

import random

import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.decode.drafters import match_key
from engine.decode.suffix import GLOBAL_KEY, LOCAL_MARGIN, MIN_MATCH, SuffixDrafter, SuffixIndex
from engine.events import GenerationParams, SamplingParams
from engine.model.device import Device
from tests.engine.decode.test_decoder import PROMPTS, decode, plain
from tests.tiny import tiny_llama

CPU = Device(torch.device("cpu"))
GREEDY = SamplingParams()


def naive_order(corpus: list[int]) -> list[int]:
    return sorted(range(len(corpus)), key=lambda i: corpus[i:])


@pytest.mark.parametrize("seed", range(20))
def test_the_suffix_array_is_the_sorted_suffixes(seed: int) -> None:
    rng = random.Random(seed)
    docs = [[rng.randrange(4) for _ in range(rng.randrange(1, 30))] for _ in range(rng.randrange(1, 5))]
    index = SuffixIndex(docs)
    corpus = index.corpus.tolist()
    assert index.order.tolist() == naive_order(corpus)
    assert corpus.count(-1) == 1 and min(corpus) == -len(docs)  # each document ends with its own separator


@pytest.mark.parametrize("seed", range(10))
def test_find_and_the_longest_match_agree_with_a_naive_search(seed: int) -> None:
    rng = random.Random(100 + seed)
    docs = [[rng.randrange(3) for _ in range(40)] for _ in range(3)]
    index = SuffixIndex(docs)
    context = [rng.randrange(3) for _ in range(12)]

    def occurs(pattern: list[int]) -> int:
        return sum(doc[i:i + len(pattern)] == pattern for doc in docs for i in range(len(doc) - len(pattern) + 1))

    for m in range(1, 6):
        lo, hi = index.find(context[-m:])
        assert hi - lo == occurs(context[-m:])
    m, lo, hi = index.longest_match(context)
    assert occurs(context[-m:]) == hi - lo > 0 and (m == len(context) or occurs(context[-m - 1:]) == 0)


def test_a_continuation_follows_the_most_frequent_path_and_stops_at_a_fork() -> None:
    docs = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7], [1, 2, 3, 4, 5, 6], [9, 2, 3, 4, 8]]
    index = SuffixIndex(docs)
    m, lo, hi = index.longest_match([0, 1, 2, 3])
    assert m == 3 and hi - lo == 3
    # 4 and 5 follow every time, then 6 (2 of 3: share 0.67) still passes MIN_SHARE.
    assert index.continuation(m, lo, hi, 8) == [4, 5, 6]
    m, lo, hi = index.longest_match([7, 2, 3])
    assert m == 2 and index.continuation(m, lo, hi, 8) == [4, 5, 6]
    lone = SuffixIndex([[5, 5, 1], [5, 5, 2], [5, 5, 3], [5, 5, 4]])
    m, lo, hi = lone.longest_match([5, 5])
    assert lone.continuation(m, lo, hi, 4) == []  # four ways on, none with a third of the evidence


def test_the_newest_documents_are_kept_within_the_bound() -> None:
    index = SuffixIndex([[1] * 10, [2] * 10, [3] * 10], max_tokens=23)
    assert index.documents == 2 and set(index.corpus.tolist()) - {-1, -2} == {2, 3}
    assert index.nbytes == index.corpus.nbytes + index.order.nbytes


def test_the_same_ask_in_another_chat_is_drafted_from_the_earlier_answer() -> None:
    earlier = [50, 51, 52, 53, 54, 55, 56, 57, 58, 59]
    drafter = SuffixDrafter([[7, 8, 9] + earlier])
    draft = drafter.propose([1, 2, 7, 8, 9, 50, 51, 52], 8, GREEDY, None)
    assert draft.tokens == (53, 54, 55, 56, 57, 58) and draft.key == GLOBAL_KEY + match_key(6)
    assert drafter.propose([0, 9, 50, 51], 8, GREEDY, None).tokens == (52, 53, 54)  # at most as long as its match
    assert drafter.propose([1, 2, 3, 4], 8, GREEDY, None).tokens == ()  # no match, no draft


def test_a_short_chance_match_in_the_history_drafts_nothing() -> None:
    drafter = SuffixDrafter([[1, 2, 40, 41, 42]])
    assert drafter.propose([9, 9, 1, 2], 4, GREEDY, None).tokens == ()  # 2 < MIN_MATCH tokens
    assert MIN_MATCH == 3


def test_forgotten_chats_are_never_proposed_and_recent_replies_are() -> None:
    drafter = SuffixDrafter([[10, 11, 12, 13, 14, 15]])
    assert drafter.propose([10, 11, 12], 3, GREEDY, None).tokens == (13, 14, 15)
    drafter.learn([])  # the chat was deleted
    assert drafter.propose([10, 11, 12], 3, GREEDY, None).tokens == ()
    drafter.remember([20, 21, 22, 23, 24, 25])  # a reply finished since
    assert drafter.propose([5, 20, 21, 22], 3, GREEDY, None).tokens == (23, 24, 25)
    drafter.learn([[30, 31, 32, 33]])  # the history now holds that reply: the recent index is cleared
    assert drafter.propose([5, 20, 21, 22], 3, GREEDY, None).tokens == ()


def test_the_conversation_wins_when_its_match_is_as_long() -> None:
    drafter = SuffixDrafter([[1, 2, 3, 4, 90, 91]])
    context = [1, 2, 3, 4, 70, 71, 0, 1, 2, 3, 4]
    drafter.prefill(context)
    assert drafter.propose(context, 2, GREEDY, None).tokens == (70, 71)


def test_an_earlier_chat_replaces_this_chats_copy_only_on_a_clearly_longer_match() -> None:
    """A history match one token longer than the conversation's is often a common phrase: the
    conversation's copy stays unless the earlier chat's match is LOCAL_MARGIN tokens longer."""
    context = [1, 2, 3, 4, 70, 71, 5, 6, 0, 1, 2, 3, 4]  # this chat matches its last 4 tokens
    one_longer = SuffixDrafter([[0, 1, 2, 3, 4, 90, 91, 92]])  # 5 tokens
    one_longer.prefill(context)
    assert one_longer.propose(context, 2, GREEDY, None).tokens == (70, 71)
    clearly_longer = SuffixDrafter([[5, 6, 0, 1, 2, 3, 4, 90, 91, 92]])  # 7 tokens: 4 + LOCAL_MARGIN + 1
    clearly_longer.prefill(context)
    assert clearly_longer.propose(context, 2, GREEDY, None).tokens == (90, 91)
    assert LOCAL_MARGIN == 2


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1)


@pytest.mark.parametrize("k", [1, 4, None])
def test_greedy_suffix_equals_plain(target: torch.nn.Module, k: int | None) -> None:
    history = [plain(target, p, max_new_tokens=40) for p in PROMPTS]  # earlier chats: the same asks answered
    for prompt in PROMPTS:
        expected = plain(target, prompt, max_new_tokens=40)
        drafter = SuffixDrafter(history)
        got, events = decode(SpecDecoder(target, CPU, drafter), prompt, GenerationParams(max_new_tokens=40, k=k))
        assert got == expected
    assert events[-1].stats.accepted > 0  # the history was drafted from, and accepted


def test_seeded_suffix_is_the_plain_reply(target: torch.nn.Module) -> None:
    sampling = SamplingParams(temperature=1.0, seed=7)
    params = GenerationParams(max_new_tokens=30, sampling=sampling)
    for prompt in PROMPTS:
        expected = decode(SpecDecoder(target, CPU), prompt, params)[0]
        drafter = SuffixDrafter([expected])
        assert decode(SpecDecoder(target, CPU, drafter), prompt, params)[0] == expected


@pytest.mark.parametrize("seed", range(5))
def test_a_match_carried_forward_as_the_context_grows_is_the_longest_match(seed: int) -> None:
    rng = random.Random(200 + seed)
    docs = [[rng.randrange(3) for _ in range(60)] for _ in range(3)]
    drafter = SuffixDrafter(docs)
    context = [rng.randrange(3)]
    while len(context) < 30:
        context += [rng.randrange(3) for _ in range(rng.randrange(1, 4))]  # a round accepts a few tokens
        assert drafter._match(drafter.history, context) == drafter.history.longest_match(context)


def test_a_long_copy_from_this_chat_is_not_interrupted_by_an_earlier_chat() -> None:
    run = list(range(40, 60))  # 20 tokens, copied here, and longer in an earlier chat with another ending
    drafter = SuffixDrafter([[1, 2, *run, 7, 7, 7]])
    context = [*run, 90, 91, 1, 2, *run]
    drafter.prefill(context)
    assert drafter.propose(context, 3, GREEDY, None).tokens == (90, 91, 1)


def test_drafts_say_who_proposed_them() -> None:
    drafter = SuffixDrafter([[7, 8, 9, 50, 51, 52, 53]])
    assert drafter.propose([1, 7, 8, 9, 50], 2, GREEDY, None).origin == "history"
    context = [1, 2, 3, 4, 70, 71, 0, 1, 2, 3, 4]
    drafter.prefill(context)
    assert drafter.propose(context, 2, GREEDY, None).origin == "chat"


def test_each_round_names_its_drafter_and_the_figures_split_by_it(target: torch.nn.Module) -> None:
    """A reply that repeats an earlier chat's answer and then its own text: rounds drafted from
    earlier chats and from this chat are counted apart, and the split adds up to the whole."""
    prompt = PROMPTS[0]
    answer = plain(target, prompt, max_new_tokens=40)
    drafter = SuffixDrafter([prompt + answer])
    got, events = decode(SpecDecoder(target, CPU, drafter), prompt, GenerationParams(max_new_tokens=40))
    assert got == answer
    stats = events[-1].stats
    origins = {o.origin: o for o in stats.by_origin}
    assert "history" in origins and origins["history"].accepted > 0
    for event in events:
        assert event.origin in (None, "chat", "history")
        if "draft" in event.sources:  # an accepted draft token: its round names who drafted it
            assert event.origin is not None
    drafted = [e for e in events if e.origin is not None]
    assert sum(o.rounds for o in stats.by_origin) == len(drafted) == stats.rounds - stats.plain_rounds
    assert sum(o.proposed for o in stats.by_origin) == stats.proposed
    assert sum(o.accepted for o in stats.by_origin) == stats.accepted
    for origin, figures in origins.items():
        mine = [e for e in drafted if e.origin == origin]
        assert figures.tokens == sum(len(e.token_ids) for e in mine)
        assert figures.tau == figures.tokens / len(mine)
        assert figures.accepted == sum(s == "draft" for e in mine for s in e.sources)
    assert stats.to_dict()["by_origin"] == [
        {"origin": o.origin, "rounds": o.rounds, "proposed": o.proposed, "accepted": o.accepted, "tokens": o.tokens}
        for o in stats.by_origin]
