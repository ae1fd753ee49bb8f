"""Tiny random Llama-style models for fast CPU tests.

Logits are made sharp (a large output scale) so that the argmax does not flip
between a one-token pass and a multi-token pass on rounding noise: greedy
equality then tests the algorithm, not floating point.
"""
from __future__ import annotations

import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


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
