"""A whole tiny GGUF, as llama.cpp writes one: hyperparameters, a byte-level BPE tokenizer and
quantized linear layers, so that transformers' GGUF loader (and so specchat's conversion)
reads it as it reads a real model, in a second."""
from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB_MERGES = 32
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 64, 128, 4, 2, 2


def _byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    stand_in, extra = {}, 0
    for b in range(256):
        if b in printable:
            stand_in[b] = chr(b)
        else:
            stand_in[b] = chr(256 + extra)
            extra += 1
    return [stand_in[b] for b in range(256)]


def write_tiny_gguf(path: Path, *, arch: str = "qwen2", kind: str = "Q4_0", wide: str = "Q8_0",
                    tie: bool = False, seed: int = 0) -> Path:
    """A ``LAYERS``-layer model of ``arch`` (``"qwen2"``: q/k/v biases; ``"llama"``) at ``path``:
    q/k, gate/up in ``kind``, v/o and down in ``wide``, embeddings in F32, an output layer
    of its own unless ``tie``."""
    import gguf

    rng = np.random.default_rng(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    merges = [f"{letters[i % 26]} {letters[(i // 26) % 26]}" for i in range(VOCAB_MERGES)]
    tokens = [*_byte_tokens(), *(m.replace(" ", "") for m in merges)]
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * vocab)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)

    def add(name: str, shape: tuple[int, ...], qtype: str | None = None, scale: float = 0.05) -> None:
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qtype is None:
            writer.add_tensor(name, values)
            return
        raw_type = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(name, gguf.quants.quantize(values, raw_type), raw_dtype=raw_type)

    add("token_embd.weight", (vocab, HIDDEN), scale=0.5)
    add("output_norm.weight", (HIDDEN,), scale=0.1)
    if not tie:
        add("output.weight", (vocab, HIDDEN), wide)
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", (HIDDEN,), scale=0.1)
        add(f"blk.{i}.ffn_norm.weight", (HIDDEN,), scale=0.1)
        add(f"blk.{i}.attn_q.weight", (HIDDEN, HIDDEN), kind)
        add(f"blk.{i}.attn_k.weight", (KV_HEADS * head_dim, HIDDEN), kind)
        add(f"blk.{i}.attn_v.weight", (KV_HEADS * head_dim, HIDDEN), wide)
        add(f"blk.{i}.attn_output.weight", (HIDDEN, HIDDEN), wide)
        add(f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN), kind)
        add(f"blk.{i}.ffn_up.weight", (FFN, HIDDEN), kind)
        add(f"blk.{i}.ffn_down.weight", (HIDDEN, FFN), wide)
        if arch == "qwen2":
            add(f"blk.{i}.attn_q.bias", (HIDDEN,))
            add(f"blk.{i}.attn_k.bias", (KV_HEADS * head_dim,))
            add(f"blk.{i}.attn_v.bias", (KV_HEADS * head_dim,))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
