"""Tiny random Llama-style models for fast CPU tests, in memory and saved with a tokenizer.

Logits are made sharp (a large output scale) so that the argmax does not flip
between a one-token pass and a multi-token pass on rounding noise: greedy
equality then tests the algorithm, not floating point.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

if TYPE_CHECKING:
    from engine.chat.session import ChatEngine


def tiny_llama(
    seed: int,
    vocab_size: int = 96,
    hidden_size: int = 32,
    layers: int = 2,
    sharpness: float = 8.0,
    eos_token_id: int | None = None,
) -> LlamaForCausalLM:
    """A random 2-layer Llama with ``vocab_size`` tokens, seeded, in eval mode."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5) if p.dim() > 1 else None
        model.lm_head.weight.mul_(sharpness)
    return model.eval()


def noisy_copy(model: LlamaForCausalLM, noise: float, seed: int) -> LlamaForCausalLM:
    """The same architecture and weights plus Gaussian noise (a draft of chosen quality)."""
    copy = LlamaForCausalLM(model.config)
    copy.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * p.std().clamp(min=1e-3))
    return copy.eval()


class SlowDraft(torch.nn.Module):
    """A draft whose every pass sleeps ``delay_s``: speculation with it never pays.

    A wrapper, so the runner feeds it through its ``forward`` (transformers'
    path; the lean forward does not recognise it)."""

    def __init__(self, model: torch.nn.Module, delay_s: float) -> None:
        super().__init__()
        self.model, self.config, self.delay_s = model, model.config, delay_s

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    def forward(self, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(self.delay_s)
        return self.model(**kwargs)


# -- saved models with a word-level tokenizer (loading, sources, compat, the CLI) --

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


MPE = 96
"""The tiny chat engine's window (max_position_embeddings)."""


def tiny_model(seed: int, mpe: int = MPE) -> LlamaForCausalLM:
    tok_len = len(make_tokenizer())
    cfg = tiny_config(vocab_size=tok_len)
    cfg.max_position_embeddings = mpe
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5) if p.dim() > 1 else None
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def tiny_chat_engine(tokenizer, *, draft: bool = False, context_length: int | None = None, mpe: int = MPE) -> "ChatEngine":  # type: ignore[no-untyped-def]
    """A real ChatEngine on a tiny model with an ``mpe``-token window (n-gram drafter, or a close draft)."""
    from engine.api import EngineInfo
    from engine.model.device import Device
    from engine.decode.drafters import ModelDrafter, NgramDrafter
    from engine.chat.session import ChatEngine

    cpu = Device(torch.device("cpu"))
    target = tiny_model(1, mpe)
    drafter = ModelDrafter(noisy_copy(target, 0.05, seed=2), cpu) if draft else NgramDrafter()
    plan = {"context_length": context_length} if context_length else {}
    info = EngineInfo(profile="t", target="tiny", drafter=drafter.name, mode="spec", device="cpu", plan=plan)
    return ChatEngine(tokenizer=tokenizer, target_model=target, drafter=drafter, device=cpu, info=info)
