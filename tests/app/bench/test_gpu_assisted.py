"""``hf-assisted`` on a pair whose output layers differ in width (Qwen2.5-7B's 152,064 rows against
0.5B's 151,936) gets both tokenizers, or is skipped with a note; it never aborts the bench
(issue 23, item 7). Stand-in: a tiny draft with 16 padding rows in its head."""
from __future__ import annotations

import torch

import app.bench.run as bench
from app.bench.methods import Method
from engine.model.device import Device
from tests.tiny import make_tokenizer, tiny_llama

CPU = Device(torch.device("cpu"))
METHODS = [Method("plain", 0), Method("hf-plain"), Method("hf-assisted"), Method("hf-assisted-constant", 2)]


def models(tokenizer: object | None, pad_rows: int = 16) -> bench.BenchModels:
    tok = make_tokenizer()
    target = tiny_llama(seed=1, vocab_size=len(tok), eos_token_id=tok.eos_token_id)
    draft = tiny_llama(seed=2, vocab_size=len(tok) + pad_rows, eos_token_id=tok.eos_token_id)
    return bench.BenchModels(target=target, device=CPU, draft=draft, tokenizer=tokenizer and tok,
                             stop_ids=(tok.eos_token_id,), max_new_tokens=8)


def test_without_tokenizers_the_assisted_methods_are_skipped_with_a_note() -> None:
    methods, notes = bench.plan_assisted(models(None), METHODS)
    assert [m.name for m in methods] == ["plain", "hf-plain"]
    assert len(notes) == 1 and notes[0].startswith("hf-assisted, hf-assisted-constant skipped")
    assert "differ in width (64 vs 80)" in notes[0]


def test_with_the_tokenizer_the_assisted_methods_run_and_match_hf_plain() -> None:
    m = models(True)
    methods, notes = bench.plan_assisted(m, METHODS)
    assert methods == METHODS and "assistant_tokenizer" in notes[0]
    kwargs = bench._hf_kwargs(m, Method("hf-assisted"))
    assert kwargs["tokenizer"] is m.tokenizer and kwargs["assistant_tokenizer"] is m.tokenizer
    ids = tuple(m.tokenizer("w1 w2 w3 w4")["input_ids"])  # type: ignore[misc]
    prompt = bench.BenchPrompt("p", "chat", ids)
    runs = bench.run_bench(m, [prompt], methods, repeats=1)
    tokens = {r.method: r.tokens for r in runs if r.repeat == 0}
    assert tokens["hf-assisted"] == tokens["hf-plain"] == tokens["hf-assisted-constant"]
    assert len(tokens["hf-plain"]) > 0


def test_a_pair_of_equal_widths_is_left_as_it_was() -> None:
    m = models(True, pad_rows=0)
    assert bench.plan_assisted(m, METHODS) == (METHODS, [])
    assert "assistant_tokenizer" not in bench._hf_kwargs(m, Method("hf-assisted"))  # transformers refuses it there
