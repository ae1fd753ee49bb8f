"""One ctypes call per layer for rope, the KV cache write and attention on the CPU.

At batch size one a layer's attention is a dozen small torch ops (rope's four, the cache
write's two, a transpose, SDPA, which alone costs ~140 µs per call at a few hundred cached
tokens on this machine's 2 cores) around a few microseconds of arithmetic; and a verify pass
ran SDPA once per row to stay row-exact. ``csrc/attention_avx2.c`` does it all in one call,
row-exact by construction (each row and head computed by one thread, the same instructions
whatever the row count): see its header for the maths. Rope there rounds as torch's does, and the
cache holds fp16 (:data:`KV_DTYPE`): the cached keys are the torch path's, rounded to fp16 as a
``copy_`` into an fp16 buffer rounds them.
"""
from __future__ import annotations

import torch

import engine.quant.cpu_kernel as cpu_kernel

MAX_HEAD_DIM = 256
KV_DTYPE = torch.float16
"""What the step's cache holds: fp16, half fp32's bytes (read back exactly, in fp32 arithmetic); from a few
hundred cached tokens on, reading the cache is most of the step."""


def check_cache(keys: torch.Tensor, values: torch.Tensor) -> None:
    """Refuse a cache the step cannot read (it takes :data:`KV_DTYPE`, contiguous)."""
    if keys.dtype != KV_DTYPE or values.dtype != KV_DTYPE or not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError(f"specchat's CPU attention step reads a contiguous {KV_DTYPE} cache, not "
                         f"{keys.dtype}/{values.dtype}: reserve its buffers with a {KV_DTYPE} like")


def available(n_heads: int, n_kv: int, head_dim: int) -> bool:
    """Whether the attention step takes this shape on this machine."""
    return (head_dim % 8 == 0 and head_dim <= MAX_HEAD_DIM and n_kv > 0 and n_heads % n_kv == 0
            and cpu_kernel.attention() is not None)


def attention_step(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, cos: torch.Tensor,
                   sin: torch.Tensor, n_heads: int, n_kv: int, scale: float) -> torch.Tensor:
    """Attention for ``T`` new tokens at positions ``start .. start + T - 1``.

    Args:
        qkv: fp32 ``[1, T, (H + 2·KV)·d]``, contiguous: q heads, k heads, v heads (roped in place).
        keys, values: the layer's cache buffers fp16 ``[1, KV, cap, d]``, contiguous, holding
            ``start`` tokens and room for ``T`` more (written here).
        cos, sin: the rotary tables fp32 ``[1, T, d]``.
    Returns:
        fp32 ``[1, T, H·d]``: each row's attention over the ``start + t + 1`` keys up to it.
    """
    fn = cpu_kernel.attention()
    if fn is None:
        raise RuntimeError("specchat's CPU attention step is not available here")
    check_cache(keys, values)
    t, head_dim, cap = int(qkv.shape[1]), int(keys.shape[-1]), int(keys.shape[2])
    cos, sin = cos.reshape(t, head_dim).contiguous(), sin.reshape(t, head_dim).contiguous()
    out = torch.empty((1, t, n_heads * head_dim), dtype=torch.float32)
    if fn(qkv.data_ptr(), t, start, cos.data_ptr(), sin.data_ptr(), keys.data_ptr(), values.data_ptr(), cap,
          n_heads, n_kv, head_dim, scale, out.data_ptr(), torch.get_num_threads(), 1):
        raise MemoryError(f"specchat's attention step could not get scratch memory for {start + t} keys")
    return out
