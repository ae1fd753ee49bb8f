"""The byte estimates behind the memory plan (:mod:`engine.model.plan`): pure arithmetic on configs.

Byte figures are estimated from a model's config before any weight is read, so
that :func:`engine.load.loader.load_engine` can drop the draft (or refuse to
start) instead of running out of memory half way through loading.

* Weights: embeddings, norms, biases and an untied ``lm_head`` stay in the
  compute dtype (bitsandbytes does not quantize them); the linear layers of
  the blocks take ``0.5`` byte/param plus absmax overhead (nf4, double quant:
  one 8-bit absmax per 64 weights and one fp32 per 256 absmax) or ``1``
  byte/param plus one fp32 scale per output row (int8).
* KV cache: ``2 · layers · kv_heads · head_dim · context_length`` values: the whole window,
  which a card's static cache (:class:`engine.model.kv.StaticKV`) allocates at the first pass
  and the CPU's growing one reaches at the end of the window.
* Captured passes (a card's CUDA graphs, :mod:`engine.model.capture`): their private memory
  pool, :func:`estimate_graph_bytes`, counted as resident where passes are captured.
* Activations: a prefill is fed in chunks of :data:`PREFILL_CHUNK` tokens
  (:class:`engine.decode.runner.ModelRunner`), so one block's working set over a
  chunk (hidden states, q/k/v, MLP intermediates), plus attention's worst case
  over a chunk at the end of the window: SDPA's math kernel (where a masked or
  GQA call falls to it) builds fp32 scores and probabilities ``[heads, chunk,
  window]`` and repeats K and V to every query head. Plus fp32 logits for
  K + 1 rows (the runner passes ``logits_to_keep``). Target and draft run one
  after the other, so a plan counts only the larger transient.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import MemoryPlanError
from engine.model.capture import SPANS_HELD
from engine.model.published import PUBLISHED_CONFIGS, published_config

__all__ = ["PUBLISHED_CONFIGS", "published_config"]  # re-exported: the plan's figures are checked against them

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
INT8_BYTES_PER_PARAM = 1.0


def int4_bytes_per_param(group_size: int) -> float:
    """torch's int4 kernels: half a byte a weight plus a bf16 scale and zero per group."""
    return 0.5 + 4 / group_size


PREFILL_CHUNK = 512
"""Tokens a prefill pass feeds at most; longer prompts are fed in chunks of this size."""
GiB = 2**30


def fmt_bytes(n: int | float) -> str:
    """``1.50 GiB``, ``512 MiB``, ``900 B``."""
    for unit, size in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.0f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class ParamCount:
    """Parameters by how they are stored once loaded."""

    embedding: int
    lm_head: int
    linear: int
    linear_rows: int
    other: int

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.linear + self.other


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _head_dim(cfg: Any) -> int:
    head_dim = getattr(cfg, "head_dim", None)
    return int(head_dim) if head_dim else cfg.hidden_size // cfg.num_attention_heads


def _kv_heads(cfg: Any) -> int:
    return int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)


def count_params(config: Any) -> ParamCount:
    """Parameter counts of a dense decoder-only model (Llama, Qwen2, Mistral-like) from its config."""
    cfg = _text_config(config)
    try:
        h, n_layers, vocab = int(cfg.hidden_size), int(cfg.num_hidden_layers), int(cfg.vocab_size)
        inter, n_heads = int(cfg.intermediate_size), int(cfg.num_attention_heads)
    except (AttributeError, TypeError, ValueError) as exc:
        raise MemoryPlanError(
            f"cannot estimate memory for model type {getattr(cfg, 'model_type', '?')!r}: its config lacks {exc}; "
            "set memory_budget generously or use a Llama/Qwen-style model",
            room_helps=False,
        ) from None
    hd, kv = _head_dim(cfg), _kv_heads(cfg)
    q_out, kv_out = n_heads * hd, kv * hd
    qkv_bias = bool(getattr(cfg, "attention_bias", cfg.model_type == "qwen2"))
    o_bias = bool(getattr(cfg, "attention_bias", False))
    mlp_bias = bool(getattr(cfg, "mlp_bias", False))
    linear = h * q_out + 2 * h * kv_out + q_out * h + 3 * h * inter
    rows = q_out + 2 * kv_out + h + 2 * inter + h
    biases = (q_out + 2 * kv_out) * qkv_bias + h * o_bias + (2 * inter + h) * mlp_bias
    other = n_layers * (2 * h + biases) + h
    tied = bool(getattr(config, "tie_word_embeddings", getattr(cfg, "tie_word_embeddings", False)))
    return ParamCount(
        embedding=vocab * h, lm_head=0 if tied else vocab * h,
        linear=n_layers * linear, linear_rows=n_layers * rows, other=other,
    )


def config_dtype(config: Any) -> str:
    """The dtype a checkpoint was saved in (``float32`` when it does not say)."""
    dtype = getattr(config, "dtype", None)
    name = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    return name if name in DTYPE_BYTES else "float32"


def resolve_dtype(
    dtype: str, quantization: str, *, cuda: bool, config: Any | None = None, bf16: bool = True
) -> str:
    """The compute dtype a model will run in: explicit names win; ``auto`` is float32 on the
    CPU and bfloat16 on CUDA, except float16 when the card has no fast bf16 (``bf16``
    False: compute capability below 8.0, see :attr:`engine.model.device.Device.fast_bf16`), for
    bitsandbytes int8 (its matmul casts every input to float16, warning each time), and
    for an unquantized float16 checkpoint. Qwen2.5 was trained in bf16 and its
    activations can overflow float16 (inf/NaN logits); docs/gpu.md says what to do."""
    if dtype != "auto":
        return dtype
    if not cuda:
        return "float32"
    if not bf16 or quantization == "int8":
        return "float16"
    if quantization == "none" and config is not None and config_dtype(config) == "float16":
        return "float16"
    return "bfloat16"


def estimate_weights_bytes(
    config: Any, quantization: str, dtype: str, group_size: int = 32, quantize_head: bool = True
) -> int:
    """Bytes of a model's weights once loaded with ``quantization`` in compute ``dtype``
    (``auto`` = the checkpoint's dtype).

    int4 (:mod:`engine.quant`) packs every block linear and, with
    ``quantize_head``, the output layer; a tied output layer then becomes an
    int4 copy beside the full-precision input embeddings.
    """
    name = config_dtype(config) if dtype == "auto" else dtype
    wbytes = DTYPE_BYTES[name]
    p = count_params(config)
    if quantization == "int4":
        per = int4_bytes_per_param(group_size)
        head = (p.lm_head or p.embedding) * per if quantize_head else p.lm_head * wbytes
        return int((p.embedding + p.other) * wbytes + p.linear * per + head)
    dense = (p.embedding + p.lm_head + p.other) * wbytes
    if quantization == "nf4":
        return int(dense + p.linear * NF4_BYTES_PER_PARAM)
    if quantization == "int8":
        return int(dense + p.linear * INT8_BYTES_PER_PARAM + 4 * p.linear_rows)
    return int(dense + p.linear * wbytes)


def max_positions(config: Any) -> int | None:
    """The model's ``max_position_embeddings`` (None when the config does not say)."""
    value = getattr(_text_config(config), "max_position_embeddings", None)
    try:
        return int(value) if value is not None and int(value) > 0 else None
    except (TypeError, ValueError):
        return None


def context_window(context_length: int | None, *configs: Any) -> int | None:
    """Tokens of prompt + reply a pair can hold: the smallest of the profile's
    ``context_length`` and each model's ``max_position_embeddings`` (None: no limit known)."""
    limits = [n for n in (context_length, *(max_positions(c) for c in configs if c is not None)) if n]
    return min(limits) if limits else None


def estimate_kv_bytes(config: Any, context_length: int, dtype: str) -> int:
    """Bytes of the KV cache for ``context_length`` tokens."""
    cfg = _text_config(config)
    name = config_dtype(config) if dtype == "auto" else dtype
    return 2 * int(cfg.num_hidden_layers) * _kv_heads(cfg) * _head_dim(cfg) * context_length * DTYPE_BYTES[name]


def estimate_attention_bytes(config: Any, context_length: int, dtype: str, chunk: int = PREFILL_CHUNK) -> int:
    """Attention's transient for one prefill chunk at the end of a ``context_length`` window,
    as SDPA's math kernel makes it: fp32 scores and probabilities ``[heads, chunk, window]``
    and K and V repeated to every query head ``[heads, window, head_dim]`` in ``dtype``. The
    flash and memory-efficient kernels need far less; this is the bound the plan keeps."""
    cfg = _text_config(config)
    name = config_dtype(config) if dtype == "auto" else dtype
    rows = min(chunk, context_length)
    heads = int(cfg.num_attention_heads)
    scores = 2 * heads * rows * context_length * 4
    repeated = 2 * heads * context_length * _head_dim(cfg) * DTYPE_BYTES[name] if _kv_heads(cfg) != heads else 0
    return scores + repeated


def estimate_activation_bytes(config: Any, context_length: int, dtype: str, logits_rows: int = 9,
                              chunk: int = PREFILL_CHUNK) -> int:
    """Transient memory of a prefill over ``context_length`` tokens fed in chunks of ``chunk``:
    one block's working set over a chunk, attention's peak (:func:`estimate_attention_bytes`),
    plus ``logits_rows`` rows of fp32 logits (the runner asks only for the rows it needs via
    ``logits_to_keep``; a verify pass needs K + 1)."""
    cfg = _text_config(config)
    name = config_dtype(config) if dtype == "auto" else dtype
    rows = min(chunk, context_length)
    block = rows * (4 * int(cfg.hidden_size) + 3 * int(cfg.intermediate_size)) * DTYPE_BYTES[name]
    logits = min(logits_rows, context_length) * int(cfg.vocab_size) * 4
    return block + estimate_attention_bytes(config, context_length, dtype, chunk) + logits


def estimate_graph_bytes(config: Any, context_length: int, dtype: str, k_max: int) -> int:
    """The memory pool of one runner's captured passes (shapes of :func:`engine.model.capture.capture_shapes`
    at each of the :data:`~engine.model.capture.SPANS_HELD` spans held; they share a pool and never
    run at once): the widest pass's working set (``k_max + 1`` rows of one block, and attention's
    fp32 scores and probabilities over the window as SDPA's math kernel builds them) plus every
    pass's output logits, which stay allocated (fp32, ``keep`` rows each: ``1 + 1 + 2 + … + (k_max + 1)``
    a span)."""

    cfg = _text_config(config)
    name = config_dtype(config) if dtype == "auto" else dtype
    rows = k_max + 1
    block = rows * (4 * int(cfg.hidden_size) + 3 * int(cfg.intermediate_size)) * DTYPE_BYTES[name]
    scores = 2 * int(cfg.num_attention_heads) * rows * context_length * 4
    outputs = SPANS_HELD * (1 + rows * (rows + 1) // 2) * int(cfg.vocab_size) * 4
    return block + scores + outputs


@dataclass(frozen=True)
class ModelEstimate:
    """Estimated bytes of one model at the profile's context length."""

    quantization: str
    dtype: str
    weights_bytes: int
    kv_bytes: int
    activation_bytes: int
    graph_bytes: int = 0
    """The captured passes' pool (0 where passes run eagerly: the CPU)."""

    @property
    def resident_bytes(self) -> int:
        """Weights, KV cache and captured passes: held for as long as the model is loaded."""
        return self.weights_bytes + self.kv_bytes + self.graph_bytes

    @property
    def total_bytes(self) -> int:
        return self.resident_bytes + self.activation_bytes


def estimate_model(
    config: Any, quantization: str, dtype: str, context_length: int, logits_rows: int = 9,
    group_size: int = 32, quantize_head: bool = True, graphs: bool = False,
) -> ModelEstimate:
    """Weights, KV cache and activations of one model (``dtype`` already resolved); with
    ``graphs``, the pool of its captured passes for verify passes of up to ``logits_rows`` rows."""
    return ModelEstimate(
        quantization=quantization,
        dtype=dtype,
        weights_bytes=estimate_weights_bytes(config, quantization, dtype, group_size, quantize_head),
        kv_bytes=estimate_kv_bytes(config, context_length, dtype),
        activation_bytes=estimate_activation_bytes(config, context_length, dtype, logits_rows),
        graph_bytes=estimate_graph_bytes(config, context_length, dtype, logits_rows - 1) if graphs else 0,
    )
