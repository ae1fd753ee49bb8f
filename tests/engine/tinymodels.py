"""Tiny saved models and tokenizers for the loading, sources and compat tests.

A word-level tokenizer over a few made-up words and a 2-layer Llama small
enough to save, load and quantize in well under a second.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ("<unk>", "<s>", "</s>")
WORDS = tuple(f"w{i}" for i in range(61))
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<s>{% endif %}"
)


def make_tokenizer(words: Sequence[str] = WORDS, *, eos: str = "</s>", shuffle_seed: int | None = None) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: specials first, then ``words`` (optionally in a shuffled id order)."""
    tokens = list(SPECIALS) + list(words)
    if shuffle_seed is not None:
        body = tokens[len(SPECIALS):]
        order = torch.randperm(len(body), generator=torch.Generator().manual_seed(shuffle_seed)).tolist()
        tokens = list(SPECIALS) + [body[i] for i in order]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token=eos, pad_token=eos
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(vocab_size: int = 64, hidden_size: int = 64, tie: bool = True) -> LlamaConfig:
    """A 2-layer Llama config (hidden 64: a size bitsandbytes quantizes)."""
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )


def save_tiny(path: Path, *, seed: int = 0, tokenizer: PreTrainedTokenizerFast | None = None,
              tie: bool = True) -> Path:
    """Save a random tiny Llama plus tokenizer to ``path`` with save_pretrained; return ``path``."""
    tokenizer = tokenizer or make_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(vocab_size=len(tokenizer), tie=tie)).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
