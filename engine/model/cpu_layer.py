"""A decoder layer in one ctypes call on the CPU (``csrc/layer.c``).

With every projection on specchat's CPU kernel and the attention step native
(:attr:`engine.model.lean.LeanForward.native_attention`), a layer is five or six calls
into the same library: the joint q/k/v product (two where a Q4_K_M file keeps some
``v_proj`` in 6 bits), the attention step, ``o``, ``gate_up`` and ``down``. Each went
through Python: the callable's argument checks, a fresh output tensor, ctypes' conversion
of fifteen arguments; about 30 µs a layer on a 2-core Zen 4, a millisecond of coder's
40 ms step and more of its draft's 12. ``specchat_layer`` makes the same calls from C, in
the same order with the same arguments (so the same bits), over pointers gathered once per
layer here and scratch allocated once per pass.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import torch

import engine.quant.cpu_kernel as cpu_kernel
from engine.model import cpu_attention

MAX_RUNS = 4  # q/k/v runs a layer may have (csrc/layer.c's specchat_layer_t.qkv)


class Product(ctypes.Structure):
    """One product as ``csrc/layer.c`` calls it (:func:`engine.quant.cpu_linear.linear`'s ``spec``)."""

    _fields_ = [("kind", ctypes.c_int64), ("codes", ctypes.c_void_p), ("table", ctypes.c_void_p),
                ("stride", ctypes.c_int64), ("bias", ctypes.c_void_p), ("N", ctypes.c_int64), ("K", ctypes.c_int64)]


class Layer(ctypes.Structure):
    """``specchat_layer_t``: a layer's products, pre-norms and attention shape."""

    _fields_ = [("qkv", Product * MAX_RUNS), ("n_qkv", ctypes.c_int64), ("o", Product), ("gate_up", Product),
                ("down", Product), ("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p), ("eps1", ctypes.c_float),
                ("eps2", ctypes.c_float), ("scale", ctypes.c_float), ("H", ctypes.c_int64), ("KV", ctypes.c_int64),
                ("d", ctypes.c_int64)]


def _product(call: Callable[..., Any]) -> Product | None:
    spec = getattr(call, "spec", None)
    return None if spec is None else Product(*spec)


def _norm(call: Callable[..., Any]) -> tuple[int, float] | None:
    """The folded pre-norm's weight pointer and eps of a product made with ``norm=`` (None without one)."""
    ptr, eps, _ = getattr(call, "norm_spec", (None, 0.0, False))
    return None if ptr is None else (int(ptr), float(eps))


def _plain(call: Callable[..., Any], gated: bool) -> bool:
    """Whether a product has no folded norm and is (``gated``) or is not gated."""
    ptr, _, is_gated = getattr(call, "norm_spec", (1, 0.0, not gated))
    return ptr is None and bool(is_gated) == gated


def build(layer: Any, n_heads: int, n_kv: int, head_dim: int, scale: float) -> Layer | None:
    """The :class:`Layer` of a folded :class:`engine.model.lean._Layer` (its callables made by
    :func:`engine.quant.cpu_linear.linear`); None where any part is not of that kind."""
    runs = getattr(layer.qkv, "parts", None) or [layer.qkv]
    products = [_product(c) for c in (*runs, layer.o, layer.gate_up, layer.down)]
    norms = _norm(runs[0]), _norm(layer.gate_up)
    if len(runs) > MAX_RUNS or any(p is None for p in products) or None in norms:
        return None
    # every run normalises x alike (each may hold its own copy of the same weight: the values are equal)
    if any(_norm(c) is None or _norm(c)[1] != norms[0][1] for c in runs):  # type: ignore[index]
        return None
    if not (_plain(layer.o, gated=False) and _plain(layer.down, gated=True)):
        return None
    out = Layer()
    for i, p in enumerate(products[: len(runs)]):
        out.qkv[i] = p
    out.n_qkv = len(runs)
    out.o, out.gate_up, out.down = products[len(runs):]
    (out.norm1, out.eps1), (out.norm2, out.eps2) = norms  # type: ignore[misc]
    out.scale, out.H, out.KV, out.d = scale, n_heads, n_kv, head_dim
    out.keep = (layer.qkv, layer.o, layer.gate_up, layer.down)  # type: ignore[attr-defined]  # the pointers' owners
    return out


def entry() -> Callable[..., int] | None:
    """``specchat_layer`` (:func:`engine.quant.cpu_kernel.layer_step`: made once; None where the library is not)."""
    return cpu_kernel.layer_step()


def run(layers: Sequence[Layer], kv_layers: Sequence[Any], like: torch.Tensor, x: torch.Tensor, start: int,
        cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` fp32 ``[1, T, hidden]`` (contiguous; updated in place and returned) through ``layers``
    for ``T`` new tokens at ``start``, each layer's cache in ``kv_layers`` (a
    :class:`engine.model.kv.GrowingKV`'s layers; ``like``: their empty ``[1, KV, 0, d]``) grown
    and written; ``cos``/``sin`` ``[1, T, d]``: the rotary tables."""
    fn = entry()
    if fn is None:
        raise RuntimeError("specchat's CPU layer step is not available here")
    t = int(x.shape[1])
    first = layers[0]
    width = sum(int(first.qkv[i].N) for i in range(first.n_qkv))
    qkv = torch.empty((t, width), dtype=torch.float32)
    att = torch.empty((t, int(first.H * first.d)), dtype=torch.float32)
    gu = torch.empty((t, int(first.gate_up.N)), dtype=torch.float32)
    cos, sin = cos.reshape(t, -1).contiguous(), sin.reshape(t, -1).contiguous()
    pointers = (x.data_ptr(), t, start, cos.data_ptr(), sin.data_ptr())
    scratch = (qkv.data_ptr(), att.data_ptr(), gu.data_ptr(), torch.get_num_threads())
    for layer, kv in zip(layers, kv_layers):
        keys, values = kv.reserve(t, like)
        if kv is kv_layers[0]:  # every layer's buffers come from the same like
            cpu_attention.check_cache(keys, values)
        failed = fn(ctypes.byref(layer), *pointers, keys.data_ptr(), values.data_ptr(), int(keys.shape[2]), *scratch)
        if failed:
            raise MemoryError(f"specchat's CPU layer step failed ({failed}) for {t} tokens at {start}")
        kv.advance(t)
    return x
