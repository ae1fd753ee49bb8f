"""A decoder layer as the lean forward runs it: its weights as tensors, and one layer's maths.

:class:`LayerParts` holds what :class:`~engine.model.lean.LeanForward` needs of a layer: the two
RMS norms and four projections, q/k/v and gate/up each joined into one matmul where the kernel
allows. A projection that is a plain ``nn.Linear`` or an int4 layer on torch's kernel is a
:class:`Proj` (tensors and ints, no closure); one on specchat's CPU kernel, or bitsandbytes', is a
callable. :func:`static_layer` is one layer of a pass over the static cache, written as a pure
function of its tensors, so that ``torch.compile`` compiles it **once for every layer**
(regional compilation: dynamo guards on the tensors' shapes, not on which layer they belong to)
instead of unrolling the whole model into one graph: pocket's 30 layers compile in the time of
one (:class:`engine.model.compiled.CompiledPass`). Each call also normalises its output for the
next layer (``next_norm``), so the residual add and the next layer's norm stay one fused kernel
across the boundary, as they are in a whole-model graph.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.quant.int4 import Int4Linear, int4_product, joint_bias


class Proj(NamedTuple):
    """A linear layer as tensors: ``weight`` ``[N, K]`` and no ``table`` (dense), or torch's int4
    kernel's ``packed`` codes in ``weight`` with its scales and zeros in ``table``."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    table: torch.Tensor | None = None
    group: int = 0
    planes: int = 1
    k: int = 0  # the int4 kernel's input width (before the planes' repeat)
    widen: bool = True  # int4: the result in x's dtype, else in the kernel's bf16


Projection = Proj | Callable[..., torch.Tensor]


def project(p: Projection, x: torch.Tensor) -> torch.Tensor:
    """``p`` applied to ``x`` ``[..., K]``: ``[..., N]``."""
    if not isinstance(p, Proj):
        return p(x)
    if p.table is None:
        return F.linear(x, p.weight, p.bias)
    return int4_product(x, p.weight, p.table, p.group, p.planes, p.k, p.bias, p.widen)


class LayerParts(NamedTuple):
    """One decoder layer's norms and projections. ``folded``: every projection runs on specchat's
    CPU kernel, so ``qkv`` and ``gate_up`` take the un-normalised stream (their pre-norms folded
    in), ``down`` takes ``gate_up``'s output as it is (``silu(gate)·up`` computed as it quantizes
    its input) and ``o`` and ``down`` add into the stream in place (``residual=``): seven ops a
    layer fewer, the same arithmetic in plain steps and verify passes alike."""

    norm1: torch.Tensor
    eps1: float
    norm2: torch.Tensor
    eps2: float
    qkv: Projection
    o: Projection
    gate_up: Projection
    down: Projection
    inter: int
    folded: bool


class Dims(NamedTuple):
    """The attention's shape: query and key heads, head width, the score scale, q and k's width."""

    n_heads: int
    n_kv: int
    head_dim: int
    scale: float
    qk_width: int


def layer_parts(layer: nn.Module, residual: torch.dtype) -> LayerParts:
    """The :class:`LayerParts` of a transformers decoder layer. ``residual``: the residual stream's
    dtype; an int4 o/down layer's bf16 result is added to it as it is where the sum's dtype stays
    ``residual`` (float32, bfloat16)."""
    attn, mlp = layer.self_attn, layer.mlp
    promotes = residual in (torch.float32, torch.bfloat16)
    norm1, eps1 = layer.input_layernorm.weight, float(layer.input_layernorm.variance_epsilon)
    norm2, eps2 = layer.post_attention_layernorm.weight, float(layer.post_attention_layernorm.variance_epsilon)
    projections = [attn.q_proj, attn.k_proj, attn.v_proj]
    inter = int(mlp.gate_proj.out_features)
    if residual == torch.float32 and Int4Linear.folds([*projections, attn.o_proj, mlp.gate_proj, mlp.up_proj,
                                                       mlp.down_proj]):
        return LayerParts(norm1, eps1, norm2, eps2, _joint(projections, (norm1, eps1)), Int4Linear.fuse([attn.o_proj]),
                          _joint([mlp.gate_proj, mlp.up_proj], (norm2, eps2)),
                          Int4Linear.fuse([mlp.down_proj], gated=True), inter, True)
    return LayerParts(norm1, eps1, norm2, eps2, _fused(projections) or _separate(projections),
                      single(attn.o_proj, widen=not promotes), _fused([mlp.gate_proj, mlp.up_proj])
                      or _separate([mlp.gate_proj, mlp.up_proj]), single(mlp.down_proj, widen=not promotes),
                      inter, False)


def single(module: nn.Module, widen: bool = True) -> Projection:
    """One layer's projection without nn.Module's hook dispatch (the lean part). ``widen=False``:
    its output is only ever added to the residual stream, so an int4 layer may hand back its
    kernel's bf16 result (the sum promotes it: the same numbers, one copy fewer)."""
    if isinstance(module, Int4Linear):
        return _int4_proj([module], widen) if module.kernel == "torch" else Int4Linear.fuse([module], widen=widen)
    if type(module) is nn.Linear:
        return Proj(module.weight.detach(), module.bias.detach() if module.bias is not None else None)
    return module.forward


def _int4_proj(layers: list[Int4Linear], widen: bool = True) -> Proj:
    """Int4 layers on torch's kernel joined into one :class:`Proj` (:meth:`Int4Linear.join`)."""
    packed, table = Int4Linear.join(layers)
    first = layers[0]
    return Proj(packed, joint_bias(layers), table, first.group_size, first.planes, first.in_features, widen)


def _fused(modules: list[nn.Module]) -> Projection | None:
    """One matmul for projections that read the same input, sharing their storage; None if the
    layers are of a kind that cannot be joined (bitsandbytes; int4 layers whose packing does not
    split at their boundaries)."""
    if any(isinstance(m, Int4Linear) for m in modules):
        if not Int4Linear.can_fuse(modules):
            return None
        if modules[0].kernel == "torch":  # type: ignore[union-attr]
            return _int4_proj(modules)  # type: ignore[arg-type]
        return Int4Linear.fuse(modules)  # type: ignore[arg-type]
    if not all(type(m) is nn.Linear for m in modules):
        return None
    weight = torch.cat([m.weight.detach() for m in modules])
    bias = joint_bias(modules)
    offset = 0
    for m in modules:  # the layers keep working, as views into the joint weight
        rows = m.out_features
        m.weight = nn.Parameter(weight[offset : offset + rows], requires_grad=False)
        offset += rows
    return Proj(weight, bias)


def _joint(layers: list[Int4Linear], norm: tuple[torch.Tensor, float]) -> Callable[..., torch.Tensor]:
    """``f(x [1, T, K]) -> [1, T, sum N]``: layers reading one normalised input on specchat's
    kernel, one call for each run of layers with the same plane count (a Q4_K_M file stores
    some ``v_proj`` in 6 bits: q and k join, v writes its columns of the same output)."""
    runs: list[list[Int4Linear]] = []
    for layer in layers:
        if runs and Int4Linear.can_fuse([runs[-1][0], layer]):
            runs[-1].append(layer)
        else:
            runs.append([layer])
    if len(runs) == 1:
        return Int4Linear.fuse(layers, norm=norm)
    calls = [(Int4Linear.fuse(run, norm=norm), sum(int(l.out_features) for l in run)) for run in runs]
    width = sum(n for _, n in calls)

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.new_empty((*x.shape[:-1], width), dtype=torch.float32)
        start = 0
        for call, n in calls:
            call(x, out=y[..., start : start + n])
            start += n
        return y

    f.parts = [call for call, _ in calls]  # type: ignore[attr-defined]  # for engine.model.cpu_layer
    return f


def _separate(modules: list[nn.Module]) -> Callable[[torch.Tensor], torch.Tensor]:
    calls = [single(m) for m in modules]
    return lambda x: torch.cat([project(c, x) for c in calls], dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm in one call of torch's kernel (which computes in float32 whatever
    ``x``'s dtype). In float32 bit for bit transformers' (200 random rows here); in half
    precision it rounds once where transformers rounds twice (before and after the weight), one
    unit in the last place on a quarter of the outputs, for one kernel on a card instead of eight
    (a norm was 16 of a layer's 31 ops: scripts/pass_ops.py). Every pass of specchat's own,
    plain or speculative, eager or captured, takes this norm, so they agree with each other."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def qkv_rope(p: LayerParts, d: Dims, x: torch.Tensor, h: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's queries, keys and values for the stream ``x`` ``[1, T, hidden]`` (``h``: ``x``
    normalised by the layer's first norm; a folded layer normalises itself), rope applied to q and
    k at once (elementwise, so the same numbers as one at a time; ``sin`` already signed,
    :func:`engine.model.lean._signed_sin`): ``[1, heads, T, d]``, ``[1, kv_heads, T, d]`` twice."""
    t = x.shape[1]
    qkv = project(p.qkv, x if p.folded else h)
    qk = qkv[..., : d.qk_width].view(1, t, d.n_heads + d.n_kv, d.head_dim).transpose(1, 2)
    turned = qk.roll(d.head_dim // 2, dims=-1)
    if qk.is_cuda:  # a kernel fewer; the CPU rounds the product apart, as specchat's C attention step does
        qk = torch.addcmul(qk * cos, turned, sin)
    else:
        qk = qk * cos + turned * sin
    q, k = qk.split((d.n_heads, d.n_kv), dim=1)
    return q, k, qkv[..., d.qk_width :].view(1, t, d.n_kv, d.head_dim).transpose(1, 2)


def finish_layer(p: LayerParts, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """The rest of a layer after attention: ``x + o(a)``, then the MLP with its residual add
    (``x`` ``[1, T, hidden]``, ``a`` ``[1, T, heads·d]``; the new stream ``[1, T, hidden]``)."""
    if p.folded:
        x = p.o(a, residual=x)  # type: ignore[operator, call-arg]
        return p.down(p.gate_up(x), residual=x)  # type: ignore[operator, call-arg]
    x = x + project(p.o, a)
    gate, up = project(p.gate_up, rms_norm(x, p.norm2, p.eps2)).split((p.inter, p.inter), dim=-1)
    return x + project(p.down, F.silu(gate) * up)


def static_layer(x: torch.Tensor, h: torch.Tensor, p: LayerParts, d: Dims, keys: torch.Tensor, values: torch.Tensor,
                 positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                 next_norm: torch.Tensor, next_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer of a pass over the static cache (:meth:`engine.model.lean.LeanForward.static_pass`).

    Args:
        x: ``[1, T, hidden]`` the residual stream; ``h`` the same normalised by this layer's first
            norm (``next_norm`` of the layer before).
        keys, values: this layer's whole cache buffers ``[1, kv_heads, window, d]``; the new keys
            and values are written at ``positions`` ``[T]``.
        cos, sin: ``[1, 1, T, d]`` rope at ``positions`` (``sin`` signed).
        mask: ``[G·T, length]`` in ``x``'s dtype, 0 where a key is visible and ``-inf`` where not
            (what SDPA makes of a bool mask at every call: made once a pass here), row ``g·T + i``
            row ``i``'s (``G`` query heads a key head); attention reads the first ``length`` keys.
        next_norm, next_eps: the norm the stream meets next (the next layer's first, or the final).
    Returns:
        The new stream ``[1, T, hidden]`` and it normalised by ``next_norm``.

    With grouped query heads the ``G`` query heads of a key head become ``G·T`` rows of one call
    over that key head (``[1, kv_heads, G·T, d]``): the same numbers as ``enable_gqa``, and a
    masked call that SDPA's memory-efficient kernel takes on a card (it takes no GQA).
    """
    t = x.shape[1]
    q, k, v = qkv_rope(p, d, x, h, cos, sin)
    keys.index_copy_(2, positions, k)
    values.index_copy_(2, positions, v)
    group = d.n_heads // d.n_kv
    q = q.reshape(1, d.n_kv, group * t, d.head_dim)
    length = mask.shape[1]
    a = F.scaled_dot_product_attention(q, keys[:, :, :length], values[:, :, :length], attn_mask=mask, scale=d.scale)
    x = finish_layer(p, x, a.reshape(1, d.n_heads, t, d.head_dim).transpose(1, 2).reshape(1, t, -1))
    return x, rms_norm(x, next_norm, next_eps)


def varying_sizes(x: torch.Tensor, h: torch.Tensor, p: LayerParts, d: Dims, keys: torch.Tensor, values: torch.Tensor,
                  positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                  *rest: object) -> None:
    """Mark for ``torch.compile`` the sizes of :func:`static_layer`'s arguments that vary between
    calls: the new tokens ``T`` where above one, and the keys attended over. Every other size and
    every int (the weights', the cache's, the heads') stays fixed, so one compile serves a model's
    layers for ``T = 1`` and one for every ``T`` from two (:class:`engine.model.compiled.CompiledPass`
    compiles with automatic dynamic shapes off); with every size symbolic, a width that happened to
    equal a head count at the first compile tied the two together and compiled again later."""
    import torch._dynamo

    mark = torch._dynamo.maybe_mark_dynamic
    if x.shape[1] > 1:
        for tensor, dim in ((x, 1), (h, 1), (positions, 0), (cos, 2), (sin, 2), (mask, 0)):
            mark(tensor, dim)
    mark(mask, 1)
