"""ChatEngine (engine.chat.session): the context window, fitted chats, refused messages, finish reason "context",
and one engine asked for two replies at once."""
from __future__ import annotations

import dataclasses
import gc
import threading

import pytest
import torch

from engine.model.device import Device
from engine.errors import ContextLengthError, EngineBusyError
from engine.events import ChatMessage, GenerationParams
from engine.model.memory import context_window
from engine.model.plan import plan_memory
from engine.config.profiles import ModelProfile, ModelSpec
from engine.chat.session import ChatEngine
from tests.tiny import MPE, WORDS, make_tokenizer, tiny_config
from tests.tiny import tiny_chat_engine as engine

CPU = Device(torch.device("cpu"))


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return make_tokenizer()


# Stop ids that never occur: the random model may emit EOS early otherwise.
PARAMS = GenerationParams(max_new_tokens=12, k=3, stop_token_ids=(10_000,))


def words(n: int, start: int = 0) -> str:
    return " ".join(WORDS[(start + i) % len(WORDS)] for i in range(n))


def reply(eng: ChatEngine, messages: list[ChatMessage], params: GenerationParams = PARAMS) -> tuple[list[int], list]:  # type: ignore[type-arg]
    events = list(eng.chat(messages, params))
    return [t for e in events for t in e.token_ids], events


def test_window_is_the_smaller_of_the_profile_and_the_model(tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert engine(tokenizer).window == MPE
    assert engine(tokenizer, context_length=40).window == 40
    assert engine(tokenizer, context_length=4096).window == MPE
    draft_limited = engine(tokenizer, draft=True)
    assert draft_limited.decoder.window == MPE
    assert context_window(None) is None and context_window(100, None) == 100


def test_memory_plan_reserves_for_the_window_used() -> None:
    cfg = tiny_config()
    cfg.max_position_embeddings = 256
    profile = ModelProfile(name="p", target=ModelSpec("x"), drafter="none", context_length=8192)
    plan = plan_memory(cfg, None, profile, free_bytes=8 * 2**30)
    assert plan.context_length == 256
    longer = plan_memory(cfg, None, ModelProfile(name="p", target=ModelSpec("x"), drafter="none", context_length=256),
                         free_bytes=8 * 2**30)
    assert plan.target.kv_bytes == longer.target.kv_bytes


def test_a_message_too_long_alone_is_refused_before_any_prefill(tokenizer) -> None:  # type: ignore[no-untyped-def]
    eng = engine(tokenizer)
    with pytest.raises(ContextLengthError, match="too long"):
        eng.chat([ChatMessage("system", "w1 w2"), ChatMessage("user", words(MPE))], PARAMS)
    assert len(eng.decoder.target) == 0  # nothing was read by the model
    with pytest.raises(ContextLengthError):  # token ids straight to the decoder: refused too
        list(eng.generate_ids(list(range(3, 3 + MPE)), PARAMS))
    ids, events = reply(eng, [ChatMessage("user", "w1 w2 w3")])  # the engine still works
    assert events[-1].finish_reason == "length" and len(ids) == PARAMS.max_new_tokens


def test_a_system_prompt_too_long_is_named_not_the_short_message(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A 66,015-token system prompt and a 2-token message: "the message is too long ... shorten it"
    (a hostile tester, who had typed two words)."""
    eng = engine(tokenizer)
    with pytest.raises(ContextLengthError, match=r"^the system prompt is too long: \d+ of the \d+ tokens with the "
                                                 r"message, .*; shorten the system prompt$"):
        eng.chat([ChatMessage("system", words(MPE)), ChatMessage("user", "w1 w2")], PARAMS)
    with pytest.raises(ContextLengthError, match=r"^the message is too long: \d+ tokens with the system prompt \(\d+ of"):
        eng.chat([ChatMessage("system", "w1 w2"), ChatMessage("user", words(MPE))], PARAMS)


def test_a_long_chat_drops_the_oldest_turns_and_says_so(tokenizer) -> None:  # type: ignore[no-untyped-def]
    eng = engine(tokenizer)
    system = ChatMessage("system", "w0 w1 w2")
    history: list[ChatMessage] = []
    for turn in range(8):
        history += [ChatMessage("user", words(8, turn)), ChatMessage("assistant", words(6, turn + 20))]
    messages = [system, *history, ChatMessage("user", words(5, 40))]
    assert len(eng.prompt_ids(messages)) > MPE
    ids, dropped = eng.fit(messages, PARAMS)
    assert dropped > 0 and dropped % 2 == 0  # whole turns: a kept history starts with a user message
    kept = [system, *history[dropped:], messages[-1]]
    assert ids == eng.prompt_ids(kept)
    assert len(ids) + PARAMS.max_new_tokens <= MPE
    assert len(ids) <= MPE // 2 < len(eng.prompt_ids([system, *history[dropped - 2:], messages[-1]]))  # to half the window
    out, events = reply(eng, messages)
    assert events[0].notice is not None and f"{dropped} earlier messages left out" in events[0].notice
    assert all(e.stats.truncated_turns == dropped for e in events)
    assert events[-1].stats.to_dict()["truncated_turns"] == dropped
    fresh_ids, _ = reply(engine(tokenizer), kept)
    assert out == fresh_ids  # exactly the reply to the kept turns


def test_later_turns_keep_the_cut_while_it_fits_so_the_cache_reads_only_the_new_turn(tokenizer) -> None:  # type: ignore[no-untyped-def]
    eng = engine(tokenizer)
    system = ChatMessage("system", "w0 w1 w2")
    messages = [system]
    for turn in range(8):
        messages += [ChatMessage("user", words(8, turn)), ChatMessage("assistant", words(6, turn + 20))]
    messages.append(ChatMessage("user", words(5, 40)))
    first, dropped = eng.fit(messages, PARAMS)
    out, _ = reply(eng, messages)
    cuts = [dropped]
    for turn in range(6):  # each turn: the reply and a short question
        messages += [ChatMessage("assistant", " ".join(f"w{t % 90 + 3}" for t in out[:4])), ChatMessage("user", words(3, turn))]
        ids, cut = eng.fit(messages, PARAMS)
        if cut == cuts[-1]:  # the same start: the last prompt, which the cache holds, begins this one
            assert ids[: len(first)] == first == eng.decoder.target.ids[: len(first)]
        else:  # a new cut: down to half the window again
            assert cut > cuts[-1] and len(ids) <= MPE // 2
        cuts.append(cut)
        first = ids
        out, _ = reply(eng, messages)
    assert len(set(cuts)) < len(cuts)  # turns that kept a cut
    assert len(set(cuts)) >= 2  # and one that had to cut again


@pytest.mark.parametrize("draft", [False, True])
def test_generation_stops_with_finish_reason_context(tokenizer, draft: bool) -> None:  # type: ignore[no-untyped-def]
    eng = engine(tokenizer, draft=draft, context_length=48)
    prompt = eng.prompt_ids([ChatMessage("user", words(30))])
    params = GenerationParams(max_new_tokens=200, k=4, stop_token_ids=(10_000,))
    events = list(eng.generate_ids(prompt, params))
    produced = sum(len(e.token_ids) for e in events)
    assert events[-1].finish_reason == "context"
    assert len(prompt) + produced == 48
    assert eng.decoder.target.cached_length() <= 47  # no position at or past the window was fed
    plain = engine(tokenizer, context_length=48)
    plain.set_speculation(False)
    same = [t for e in plain.generate_ids(prompt, params) for t in e.token_ids]
    assert [t for e in events for t in e.token_ids] == same


def test_two_threads_on_one_engine_one_is_refused(tokenizer) -> None:  # type: ignore[no-untyped-def]
    eng = engine(tokenizer, draft=True)
    messages = [ChatMessage("user", "w3 w4 w5 w6")]
    expected, _ = reply(eng, messages)
    first_round = threading.Event()
    go_on = threading.Event()
    result: dict[str, object] = {}

    def first() -> None:
        it = eng.chat(messages, PARAMS)
        ids = list(next(it).token_ids)
        first_round.set()
        go_on.wait(10)
        ids += [t for e in it for t in e.token_ids]
        result["first"] = ids

    def second() -> None:
        try:
            result["second"] = reply(eng, [ChatMessage("user", "w9 w8")])[0]
        except EngineBusyError as exc:
            result["second"] = exc

    a = threading.Thread(target=first)
    a.start()
    assert first_round.wait(10)
    b = threading.Thread(target=second)
    b.start()
    b.join(10)
    go_on.set()
    a.join(10)
    assert isinstance(result["second"], EngineBusyError) and "another thread" in str(result["second"])
    assert result["first"] == expected
    assert reply(eng, messages)[0] == expected


def test_free_running_threads_never_mix_their_replies(tokenizer) -> None:  # type: ignore[no-untyped-def]
    eng = engine(tokenizer, draft=True)
    prompts = [[ChatMessage("user", words(4, 7 * i))] for i in range(4)]
    expected = [reply(eng, p)[0] for p in prompts]
    results: list[object] = [None] * 4

    def run(i: int) -> None:
        try:
            results[i] = reply(eng, prompts[i])[0]
        except EngineBusyError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for i, got in enumerate(results):
        assert isinstance(got, EngineBusyError) or got == expected[i]
    assert reply(eng, prompts[0])[0] == expected[0]


def test_an_abandoned_generator_leaves_the_engine_consistent(tokenizer) -> None:  # type: ignore[no-untyped-def]
    eng = engine(tokenizer, draft=True)
    a = [ChatMessage("user", "w3 w4 w5 w6")]
    b = [ChatMessage("user", "w20 w21 w22")]
    expected_a, expected_b = reply(eng, a)[0], reply(eng, b)[0]
    it = eng.chat(a, PARAMS)
    next(it)
    del it  # dropped mid-reply without close()
    gc.collect()
    assert reply(eng, b)[0] == expected_b
    stale = eng.chat(a, PARAMS)
    next(stale)
    assert reply(eng, b)[0] == expected_b  # the same thread takes over an abandoned reply
    with pytest.raises(EngineBusyError, match="abandoned"):
        next(stale)
    assert reply(eng, a)[0] == expected_a
    never_started = eng.chat(a, PARAMS)
    del never_started
    done: dict[str, object] = {}
    t = threading.Thread(target=lambda: done.setdefault("ids", reply(eng, b)[0]))
    t.start()
    t.join(10)
    assert done["ids"] == expected_b


def test_a_suffix_drafter_learns_earlier_chats_and_remembers_each_reply(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from engine.decode.suffix import SuffixDrafter

    eng = engine(tokenizer)
    drafter = SuffixDrafter()
    eng.decoder.drafter = drafter  # the loader's choice for drafter = "suffix"
    eng.learn([words(6), "", words(4, start=10)])
    assert drafter.history.documents == 2  # empty messages are skipped
    assert drafter.history.corpus.tolist()[:6] == tokenizer.encode(words(6), add_special_tokens=False)
    ids, _ = reply(eng, [ChatMessage("user", words(5))])
    assert drafter.recent.documents == 1 and drafter.recent.corpus.tolist()[:-1] == ids
    eng.learn([])  # the history as it is now: empty
    assert drafter.history.documents == 0 and drafter.recent.documents == 0


def test_a_private_reply_is_not_remembered(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from engine.decode.suffix import SuffixDrafter

    eng = engine(tokenizer)
    drafter = SuffixDrafter()
    eng.decoder.drafter = drafter
    private = dataclasses.replace(PARAMS, private=True)
    ids, _ = reply(eng, [ChatMessage("user", words(5))], private)
    assert ids and drafter.recent.documents == 0  # nothing a later chat could be drafted from
    assert reply(eng, [ChatMessage("user", words(5))])[0] == ids  # the same reply, private or not
    assert drafter.recent.documents == 1


def test_learning_is_nothing_for_other_drafters(tokenizer) -> None:  # type: ignore[no-untyped-def]
    eng = engine(tokenizer)
    eng.learn([words(6)])  # the n-gram drafter keeps nothing across chats
    assert reply(eng, [ChatMessage("user", words(5))])[0]


def test_a_drafter_dropped_while_decoding_leaves_the_info_of_plain_decoding(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """After an out-of-memory drop the HUD named the freed draft model and the plan of the pair."""
    eng = engine(tokenizer)
    plan = {"choice": "target+ngram", "reason": "", "available_bytes": 1000, "planned_bytes": 300,
            "headroom_bytes": 700, "target": {"total_bytes": 250}, "draft": None}
    eng._info = dataclasses.replace(eng._info, plan=plan, draft_bytes=50)
    assert eng.info.drafter != "none"
    eng.decoder.drop_drafter("out of memory while drafting")
    info = eng.info
    assert (info.mode, info.drafter, info.draft_bytes, info.fallback_reason) == (
        "plain", "none", 0, "out of memory while drafting")
    assert (info.plan["choice"], info.plan["planned_bytes"], info.plan["headroom_bytes"]) == ("target", 250, 750)
    assert info.plan["reason"] == "out of memory while drafting"


def test_a_drop_and_a_switch_off_are_two_reasons_the_drop_is_never_hidden(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """--json's fallback_reason read "not paying here" over the draft dropped for memory at load:
    the engine's info named one reason where there were two."""
    from engine.events import NOT_PAYING, OFF_BY_USER

    eng = engine(tokenizer)
    dropped = "draft model dropped: target + draft need about 3.18 GiB but only 2.48 GiB is available"
    eng._info = dataclasses.replace(eng._info, fallback_reason=dropped)
    eng.decoder.off_reason = NOT_PAYING  # as the automatic switch-off leaves it
    assert (eng.info.fallback_reason, eng.info.off_reason) == (dropped, NOT_PAYING)
    eng.set_speculation(False)
    assert (eng.info.fallback_reason, eng.info.off_reason, eng.info.mode) == (dropped, OFF_BY_USER, "plain")
    eng.set_speculation(True)
    assert eng.info.off_reason is None and eng.info.fallback_reason == dropped


def test_a_stop_string_inside_a_round_ends_the_ids_where_plain_decoding_ends_them(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A round of several accepted tokens kept those after the stop string in ``token_ids`` (and in
    what the suffix drafter remembers); plain decoding ends at the token that completed it."""
    eng = engine(tokenizer, draft=True)
    messages = [ChatMessage("user", words(6))]
    params = dataclasses.replace(PARAMS, max_new_tokens=24, k=4)
    ids, events = reply(eng, messages, params)
    ends, n = set(), 0
    for event in events:
        n += len(event.token_ids)
        ends.add(n)  # a round's last token is ids[n - 1]
    mid_round = 0
    for j in range(1, len(ids) - 1):
        stop = tokenizer.decode([ids[j]]).strip()
        if not stop:
            continue
        with_stop = dataclasses.replace(params, stop_strings=(stop,))
        eng.set_speculation(False)
        plain, plain_events = reply(eng, messages, with_stop)
        eng.set_speculation(True)
        spec, spec_events = reply(eng, messages, with_stop)
        assert spec == plain and "".join(e.text for e in spec_events) == "".join(e.text for e in plain_events)
        assert spec_events[-1].finish_reason == plain_events[-1].finish_reason
        mid_round += plain_events[-1].finish_reason == "stop" and len(plain) not in ends
    assert mid_round > 0  # the case the test is for: a stop string completed before its round's last token


def test_a_stopped_or_failed_reply_is_not_remembered_for_later_chats(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A chat deleted while its reply streams stops the reply; its text came back into the suffix
    drafter after the drafter was taught the history without it (a hostile tester's)."""
    eng = engine(tokenizer)
    remembered: list[list[int]] = []
    eng._remember = lambda reply: remembered.append(list(reply))  # type: ignore[method-assign]
    cancel = threading.Event()
    events = eng.chat([ChatMessage("user", words(5))], PARAMS, cancel)
    next(events)
    cancel.set()
    assert list(events)[-1].finish_reason == "cancelled" and remembered == []
    reply(eng, [ChatMessage("user", words(5))])
    assert len(remembered) == 1  # a reply that ended by itself is
