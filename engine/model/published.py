"""Published configs (config.json on the hub) of the models the shipped profiles name, so the
memory estimates in models.toml can be recomputed without hub access
(tests/engine/model/test_memory.py; :mod:`engine.model.memory` re-exports both names)."""
from __future__ import annotations

from typing import Any

PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": dict(
        max_position_embeddings=8192, model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, intermediate_size=1536, tie_word_embeddings=True),
    "Qwen/Qwen2.5-0.5B-Instruct": dict(
        max_position_embeddings=32768, model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, intermediate_size=4864, tie_word_embeddings=True),
    # coder's pair (GGUF files): the sizes their GGUF headers carry; the converted copies say
    # tie_word_embeddings = false only because the GGUF stores the output layer apart.
    "Qwen/Qwen2.5-Coder-1.5B-Instruct": dict(
        max_position_embeddings=32768, model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, intermediate_size=8960, tie_word_embeddings=True),
    "Qwen/Qwen2.5-Coder-0.5B-Instruct": dict(
        max_position_embeddings=32768, model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, intermediate_size=4864, tie_word_embeddings=True),
    "Qwen/Qwen2.5-7B-Instruct": dict(
        max_position_embeddings=32768, model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, intermediate_size=18944, tie_word_embeddings=False),
    "Qwen/Qwen2.5-14B-Instruct": dict(
        max_position_embeddings=32768, model_type="qwen2", hidden_size=5120, num_hidden_layers=48, num_attention_heads=40,
        num_key_value_heads=8, vocab_size=152064, intermediate_size=13824, tie_word_embeddings=False),
    "meta-llama/Llama-3.1-8B-Instruct": dict(
        max_position_embeddings=131072, model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, intermediate_size=14336, tie_word_embeddings=False),
    "meta-llama/Llama-3.2-1B-Instruct": dict(
        max_position_embeddings=131072, model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, intermediate_size=8192, tie_word_embeddings=True,
        head_dim=64),
}


def published_config(repo_id: str) -> Any:
    """A transformers config built from :data:`PUBLISHED_CONFIGS` (no hub access)."""
    from transformers import AutoConfig

    fields = dict(PUBLISHED_CONFIGS[repo_id])
    return AutoConfig.for_model(fields.pop("model_type"), **fields)
