"""Weight-only int4 through torch's own kernels: the layout, the layer, the model pass.

Every ``nn.Linear`` of a model's blocks (and the output layer unless
``quantize_head = false``) is replaced by an :class:`Int4Linear`. Weights are
stored as 4-bit codes in groups of ``g`` consecutive input features, each group
with its own scale and zero point::

    w[n, k] = (q[n, k] - 8) * scale[n, k // g] + zero[n, k // g],   q in 0..15

This is the layout of torch's int4 matmul kernels (the ones gpt-fast uses), so
no new dependency is needed:

* CPU: ``torch._convert_weight_to_int4pack_for_cpu(q: int32 [N, K], 1)`` packs
  the codes; ``torch._weight_int4pack_mm_for_cpu(x: bf16 [M, K], packed, g,
  scales_and_zeros: bf16 [K/g, N, 2])`` multiplies. Shape rules: ``N % 16 == 0``
  and ``K % g == 0``. Only bf16 is fast: the same kernel with fp16 or fp32 ran
  8 tok/s on SmolLM2 against ~100 with bf16.
* CUDA: ``torch._convert_weight_to_int4pack(q: uint8 [N, K/2] (two codes a
  byte, even column in the high nibble), inner_k_tiles)`` and
  ``torch._weight_int4pack_mm(x: bf16 [M, K], packed, g, scales_and_zeros)``.
  Shape rules: ``N % 8 == 0``, ``K % (inner_k_tiles * 16) == 0`` (tiles of 8, 4 or 2:
  :func:`cuda_inner_k_tiles`), ``g`` in
  32/64/128/256, bf16 activations, compute capability 8.0 or newer (tensor
  core tiles) and a torch built for CUDA 12 or newer: on an older card the
  kernel is not compiled in and the pack returns garbage instead of failing,
  so :func:`cuda_int4_problem` refuses it first. Checked on an H100 (torch 2.11,
  CUDA 13; ``scripts/gpu_check.py``): within 0.6% of the largest output against the
  dequantized weights for 1 and 2 planes and 4 or 8 tiles, and a row's result the same
  bits whether 1 or 9 rows share the call.

Activations are cast to bf16 for the matmul and back to the model's dtype, so
norms, attention and embeddings keep their precision (fp32 on the CPU).

Groups come from two places: :func:`quantize_weight` (asymmetric min/max per
group, from full-precision weights) or GGUF blocks carried over code for code by
:mod:`engine.quant.gguf_blocks`. Either way the kernel rounds each scale and
zero to bf16; the codes are kept exactly.

The groups themselves (the layout formula, two planes for 8 bits, six bits), the quantizers and
the kernels' shape rules live in :mod:`engine.quant.groups`; their names are re-exported here.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.errors import QuantizationError
import engine.quant.cpu_kernel as cpu_kernel
import engine.quant.cpu_pack as cpu_pack
import engine.quant.cpu_linear as cpu_linear
from engine.quant.cpu_pack import KernelLayout
from engine.quant.groups import (  # noqa: F401 - re-exported: the layer's callers name them here
    CUDA_INNER_K_TILES, GROUP_SIZES, Int4Weights, SixBit, check_shape, cuda_inner_k_tiles, cuda_int4_problem,
    is_six_bit, kernel_weights, nibble_pairs, quantize_weight, quantize_weight8, six_bit_form, takes, two_planes,
)

log = logging.getLogger(__name__)

FUSE_ROWS = 64  # the CPU packing lays out output rows in blocks of 64
CUDA_FUSE_ROWS = 8  # the CUDA packing, in blocks of 8


def _scales_and_zeros(weights: Int4Weights) -> torch.Tensor:
    """bf16 ``[K / g, N, 2]``: the kernels' scale and zero table."""
    return torch.stack([weights.scale, weights.zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)


class Int4Linear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` stored as int4 groups (torch's int4 kernels).

    Input ``[..., K]`` in any float dtype; output ``[..., N]`` in the input's dtype.
    """

    def __init__(self, weights: Int4Weights | KernelLayout, bias: torch.Tensor | None, device: torch.device) -> None:
        """``weights``: int4 groups, or (from the int4 cache) specchat's CPU kernel's layout of them,
        which needs that kernel on a CPU ``device``."""
        super().__init__()
        six = None
        if isinstance(weights, Int4Weights):
            six = six_bit_form(weights, device)  # decoded once: kernel_weights checks it, the packing lays it out
            weights = kernel_weights(weights, device, six, work=device if device.type == "cuda" else None)
        n, k = weights.shape
        problem = cuda_int4_problem(device)
        if problem is not None:
            raise QuantizationError(f"{problem}: run int4 on the CPU (device = \"cpu\" in the profile) or choose "
                                    "quantization = \"nf4\" for this card")
        check_shape(n, k, weights.group_size, device, weights.planes)
        self.in_features, self.out_features = k, n
        self.planes = weights.planes
        self.group_size = weights.group_size
        self.is_cuda = device.type == "cuda"
        # Which kernel multiplies: specchat's own on a CPU that can build it, else torch's.
        self.kernel = ("specchat" if not self.is_cuda and cpu_pack.fits(k, weights.group_size)
                       and cpu_kernel.matmul() is not None else "torch")
        if isinstance(weights, KernelLayout):
            if self.kernel != "specchat":
                raise QuantizationError("these int4 weights are laid out for specchat's CPU kernel, which cannot run "
                                        f"here ({cpu_kernel.why_not() or 'not on a CPU'}): clear the int4 cache")
            # copies: what it is given may lie on a cache file's mapping, which a tensor left there keeps resident
            packed, table = cpu_pack.on_huge_pages(weights.packed, copy=True), weights.table.clone()
        elif self.kernel == "specchat":
            packed, table = cpu_pack.pack(weights.codes, weights.scale, weights.zero, weights.planes, six,
                                            headers=weights.headers)
            packed = cpu_pack.on_huge_pages(packed)
        elif self.is_cuda:  # paired where the codes are (the host, mostly): half the bytes cross over
            pairs = nibble_pairs(weights.codes).to(device)
            packed = torch._convert_weight_to_int4pack(pairs, cuda_inner_k_tiles(self.planes * k))
            table = _scales_and_zeros(weights).to(device)
        else:
            packed = torch._convert_weight_to_int4pack_for_cpu(weights.codes.to(torch.int32), 1)
            table = _scales_and_zeros(weights)
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scales_and_zeros", table, persistent=False)
        self.bias = nn.Parameter(bias.detach().clone().to(device), requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "specchat":
            return Int4Linear.fuse([self])(x)
        return int4_product(x, self.packed, self.scales_and_zeros, self.group_size, self.planes, self.in_features,
                            self.bias)

    @staticmethod
    def can_fuse(layers: Sequence[nn.Module]) -> bool:
        """Whether :meth:`fuse` is exact for these layers: int4 layers of one kernel and device, input
        size, group size and plane count; for torch's kernel every boundary on its packing's row
        blocks (64 rows on the CPU, 8 on CUDA, whose pack is ``[N/8, K/(tiles·16), 32, tiles/2]``,
        so the same tiles too); specchat's kernel keeps rows apart, so any boundary will do."""
        if not layers or not all(isinstance(l, Int4Linear) for l in layers):
            return False
        first = layers[0]
        rows = CUDA_FUSE_ROWS if first.is_cuda else FUSE_ROWS
        return (all(l.group_size == first.group_size and l.in_features == first.in_features
                    and l.planes == first.planes and l.kernel == first.kernel and l.is_cuda == first.is_cuda
                    and (l.kernel == "specchat" or l.packed.shape[1:] == first.packed.shape[1:])
                    and l.packed.dim() == first.packed.dim()  # Q4_K rows in tiles join only their own kind
                    # one kind of table (int4's Q4_K headers join bf16 tables as bf16: _joint_table)
                    and (l.planes == 1 or (l.scales_and_zeros.dtype == first.scales_and_zeros.dtype
                                           and bool(l.scales_and_zeros.numel()) == bool(first.scales_and_zeros.numel())))
                    for l in layers)
                and (first.kernel == "specchat" or all(l.out_features % rows == 0 for l in layers[:-1])))

    @staticmethod
    def join(layers: Sequence["Int4Linear"]) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed codes and the scale table of layers on torch's kernel joined along the output dim
        (``packed`` rows concatenated, each layer's ``packed`` then a view into them: no memory
        duplicated but the small tables; ``scales_and_zeros`` ``[K/g, sum N, 2]``). A single layer
        gives its own tensors."""
        if len(layers) == 1:
            return layers[0].packed, layers[0].scales_and_zeros
        if not Int4Linear.can_fuse(layers) or layers[0].kernel != "torch":
            raise QuantizationError("these int4 layers cannot be joined exactly; run them one by one")
        table = torch.cat([l.scales_and_zeros for l in layers], dim=1).contiguous()
        return _joint_packed(layers, torch.cat([l.packed for l in layers])), table

    @staticmethod
    def fuse(layers: Sequence["Int4Linear"], widen: bool = True,
             norm: tuple[torch.Tensor, float] | None = None, gated: bool = False) -> Callable[..., torch.Tensor]:
        """One matmul for several layers reading the same input (q/k/v, gate/up).

        The packed codes are concatenated along the output dim and each
        layer's ``packed`` becomes a view into the joint tensor: no memory is
        duplicated but the small scale tables. torch's CPU packing is blocked by
        64 rows, so this is exact only when every boundary falls on a block
        (:meth:`can_fuse`); a single layer always qualifies. Returns
        ``f(x [..., K]) -> [..., sum N]``, in ``x``'s dtype, or with ``widen=False`` in torch
        kernel's bf16 (for a sum that promotes it anyway: the same numbers, one copy fewer;
        specchat's kernel answers in fp32 either way).

        On specchat's kernel (:meth:`folds`) the result also takes ``f(x, residual=r)`` (the
        product added into ``r`` in place), ``norm = (weight, eps)`` RMS-normalises x's rows
        first, and ``gated`` takes ``[..., 2K]`` (gate, up) and multiplies ``silu(gate)·up``:
        see :func:`engine.quant.cpu_linear.linear`.
        """
        first = layers[0]
        if len(layers) > 1 and not Int4Linear.can_fuse(layers):
            raise QuantizationError("these int4 layers cannot be joined exactly; run them one by one")
        if first.kernel != "specchat":
            if norm is not None or gated:
                raise QuantizationError("only specchat's CPU kernel folds a norm or a gate into its matmul")
            packed, sz = Int4Linear.join(layers)
            return _int4_matmul(packed, sz, joint_bias(layers), first.group_size, first.in_features, first.is_cuda,
                                first.planes, widen)
        packed = first.packed  # a single layer keeps its own storage: nothing to copy
        if len(layers) > 1:
            packed = _joint_packed(layers, cpu_pack.on_huge_pages(torch.cat([l.packed for l in layers])))
        table = _joint_table(layers) if len(layers) > 1 else first.scales_and_zeros
        return cpu_linear.linear(packed, table, joint_bias(layers), first.in_features, first.planes, norm, gated)

    def layout(self) -> KernelLayout | None:
        """What this layer holds in specchat's CPU kernel's layout (for the int4 cache); None on torch's."""
        if self.kernel != "specchat":
            return None
        return KernelLayout(self.packed, self.scales_and_zeros, (self.out_features, self.in_features),
                            self.group_size, self.planes)

    def rows(self, ids: torch.Tensor, norm: tuple[torch.Tensor, float] | None = None) -> Callable[..., torch.Tensor] | None:
        """``f(x [..., K]) -> [..., len(ids)]``: this layer's output rows ``ids`` only, with the
        very codes and scales of those rows (each value the bits of the full layer's, given the same
        ``norm`` folded in as :meth:`fuse` folds it), e.g. a draft's output layer over its frequent
        tokens. Gathered in a fraction of a second; None on torch's kernels, whose packing does not
        keep rows apart."""
        if self.kernel != "specchat":
            return None
        ids = ids.to(torch.long)
        bias = self.bias.detach()[ids] if self.bias is not None else None
        packed, table = cpu_pack.untile(self.packed) if self.packed.dim() == 4 else (self.packed, self.scales_and_zeros)
        return cpu_linear.linear(packed[ids].contiguous(), table[ids].contiguous(), bias,
                                 self.in_features, self.planes, norm=norm)

    @staticmethod
    def folds(layers: Sequence[nn.Module]) -> bool:
        """Whether these layers all run on specchat's CPU kernel, which folds a pre-norm and a
        residual add into the matmul (:meth:`fuse`)."""
        return bool(layers) and all(isinstance(l, Int4Linear) and l.kernel == "specchat" for l in layers)

    def extra_repr(self) -> str:
        kind = ("int4" if self.planes == 1 else "6-bit" if self.group_size == cpu_pack.SIX_BIT_GROUP
                else f"int4 x {self.planes} planes")
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"{kind}, {self.kernel} kernel")


def _joint_packed(layers: Sequence[Int4Linear], packed: torch.Tensor) -> torch.Tensor:
    """``packed``, the layers' codes joined along the output rows, with each layer's ``packed`` made
    a view into it (the layers keep working; no memory is duplicated)."""
    offset = 0
    for l in layers:
        rows = l.packed.shape[0]
        l.packed = packed[offset : offset + rows]
        offset += rows
    return packed


def _joint_table(layers: Sequence[Int4Linear]) -> torch.Tensor:
    """The scale tables of layers joined along the output dim for specchat's kernel. Where int4 layers with a
    Q4_K's headers (uint8) meet layers with bf16 tables, the headers become the bf16 scales and zeros they
    stand for (:func:`engine.quant.cpu_pack.header_scales`, rounded as every bf16 table is), so that a
    gate and up of two kinds still make one product (and their layer one call)."""
    tables = [l.scales_and_zeros for l in layers]
    if len({t.dtype for t in tables}) > 1:
        tables = [_headers_as_bf16(t) if t.dtype == torch.uint8 else t for t in tables]
    return torch.cat(tables)


def _headers_as_bf16(headers: torch.Tensor) -> torch.Tensor:
    """Q4_K headers as the bf16 table of the scales and zeros they stand for."""
    scale, mins = cpu_pack.header_scales(headers)
    return cpu_pack.bf16_table(scale, 8.0 * scale - mins)


def joint_bias(layers: Sequence[nn.Module]) -> torch.Tensor | None:
    """The biases of layers joined along the output dim ``[sum N]`` (zeros for a layer
    without one), for a fused matmul; None when no layer has a bias."""
    present = [l.bias for l in layers if l.bias is not None]
    if not present:
        return None
    like = present[0].detach()
    return torch.cat([l.bias.detach() if l.bias is not None else like.new_zeros(int(l.out_features))
                      for l in layers])


def _int4_matmul(
    packed: torch.Tensor, sz: torch.Tensor, bias: torch.Tensor | None, group_size: int, k: int, cuda: bool,
    planes: int = 1, widen: bool = True,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``f(x [..., K]) -> [..., N]`` over packed int4 weights (:func:`int4_product`), with no module
    in between."""
    return lambda x: int4_product(x, packed, sz, group_size, planes, k, bias, widen)


def int4_product(x: torch.Tensor, packed: torch.Tensor, table: torch.Tensor, group_size: int, planes: int, k: int,
                 bias: torch.Tensor | None = None, widen: bool = True) -> torch.Tensor:
    """``x [..., K] @ W.T (+ bias)`` on torch's int4 kernel (the CPU's or CUDA's, where ``packed`` lies),
    ``W`` packed in ``planes`` planes with the scale table ``table`` ``[K/g, N, 2]``: ``[..., N]``.
    ``widen``: the result in ``x``'s dtype, else in the kernel's bf16 (a bias is added in its own
    dtype, which promotes the sum exactly as widening first would)."""
    flat = x.reshape(-1, k).to(torch.bfloat16)
    if planes > 1:
        flat = flat.repeat(1, planes)
    mm = torch._weight_int4pack_mm if packed.is_cuda else torch._weight_int4pack_mm_for_cpu
    y = mm(flat, packed, group_size, table)
    y = (y.to(x.dtype) if widen else y).view(*x.shape[:-1], table.shape[1])
    if bias is None:
        return y
    return y + (bias.to(y.dtype) if widen else bias)


@dataclass
class QuantReport:
    """What :func:`quantize_model` did, for the log and the memory figures."""

    quantized: list[str] = field(default_factory=list)
    carried_over: list[str] = field(default_factory=list)  # groups taken bit for bit from a GGUF
    kept: dict[str, str] = field(default_factory=dict)  # name -> why it stayed in full precision
    int4_bytes: int = 0
    groups: dict[str, Int4Weights | KernelLayout] = field(default_factory=dict)  # what each layer was made of
    layouts: dict[str, KernelLayout] = field(default_factory=dict)  # what each holds on specchat's kernel (the cache)
    kernels: dict[str, int] = field(default_factory=dict)  # layers per kernel ("specchat", "torch")

    def add(self, name: str, layer: "Int4Linear") -> None:
        """Count a layer now held as int4 under ``name``."""
        self.quantized.append(name)
        self.int4_bytes += (layer.packed.numel() * layer.packed.element_size()
                            + layer.scales_and_zeros.numel() * layer.scales_and_zeros.element_size())
        self.kernels[layer.kernel] = self.kernels.get(layer.kernel, 0) + 1
        layout = layer.layout()
        if layout is not None:
            self.layouts[name] = layout

    def summary(self) -> str:
        kept = f", {len(self.kept)} kept ({'; '.join(f'{k}: {v}' for k, v in list(self.kept.items())[:3])})" if self.kept else ""
        kernels = ", ".join(f"{n} on {kind}'s kernel" for kind, n in sorted(self.kernels.items()))
        return (f"int4: {len(self.quantized)} linear layers ({len(self.carried_over)} carried over from GGUF blocks; "
                f"{kernels}), {self.int4_bytes / 2**20:.0f} MiB packed{kept}")


def _linear_names(model: nn.Module, quantize_head: bool) -> list[str]:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and (quantize_head or module is not head):
            names.append(name)
    return names


def quantize_model(
    model: nn.Module,
    *,
    group_size: int = 32,
    quantize_head: bool = True,
    groups: Mapping[str, Int4Weights | KernelLayout] | None = None,
    device: torch.device | None = None,
    on_layer: Callable[[int, int], None] | None = None,
) -> QuantReport:
    """Replace the ``nn.Linear`` layers of ``model`` by :class:`Int4Linear`, in place.

    Args:
        model: a causal LM whose weights are in full precision (any device).
        group_size: inputs per group (32, 64 or 128).
        quantize_head: also quantize the output layer (untied from the
            embeddings: the input embeddings keep full precision).
        groups: int4 groups to use as they are, by the Linear's module name
            (carried over from a GGUF, or read from the cache); the rest are
            quantized from the weights.
        device: where the packed weights go (default: where each weight is).
        on_layer: told ``(layers done, layers)`` as each layer is packed (progress).
    """
    if group_size not in GROUP_SIZES:
        raise QuantizationError(f"group_size {group_size} is not supported: use one of {', '.join(map(str, GROUP_SIZES))}")
    report = QuantReport()
    groups = groups or {}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = _linear_names(model, quantize_head)
    for i, name in enumerate(names):
        if on_layer is not None:
            on_layer(i, len(names))
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, attr)
        target = device or linear.weight.device
        n, k = linear.weight.shape
        weights = groups.get(name)
        if weights is not None and (not takes(weights, group_size) or weights.shape != (n, k)):
            weights = None
        try:
            check_shape(n, k, group_size, target, weights.planes if weights is not None else 1)
        except QuantizationError as exc:
            report.kept[name] = str(exc)
            continue
        if weights is None:
            weights = quantize_weight(linear.weight, group_size)
        new = Int4Linear(weights, linear.bias, target)
        if linear is head:
            # A tied head shares its weight with the input embeddings: replacing
            # the module leaves the embeddings' full-precision table alone.
            model.config.tie_word_embeddings = False
            if hasattr(model.config, "get_text_config"):
                model.config.get_text_config().tie_word_embeddings = False
        setattr(parent, attr, new)
        report.add(name, new)
        report.groups[name] = weights
    if on_layer is not None:
        on_layer(len(names), len(names))
    return report
