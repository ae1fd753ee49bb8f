"""Carry a GGUF's 4-bit blocks over to the int4 kernel's groups, code for code.

llama.cpp's Q4_0 and Q4_1 store each row in blocks of 32 weights:

* Q4_0: ``d`` (fp16) then 16 bytes of codes; ``w = d * (q - 8)``.
* Q4_1: ``d``, ``m`` (fp16) then 16 bytes of codes; ``w = d * q + m``.

Byte ``j`` of the codes holds element ``j`` in its low nibble and element
``j + 16`` in its high nibble. The kernel's groups (:mod:`engine.quant.int4`) read
``w = (q - 8) * scale + zero``, so with group size 32 a block maps exactly:
``scale = d`` and ``zero = 0`` (Q4_0) or ``zero = m + 8 d`` (Q4_1). The codes
are kept bit for bit; the kernel then rounds ``scale`` and ``zero`` to bf16,
which is the only error the carry-over adds (measured by
:func:`bf16_rounding_error`).

Tensors of other types (Q8_0 embeddings, K-quants) are left to
:func:`engine.quant.quantize_weight`, from their dequantized values.

The GGUF's tensor names and row order are mapped to the model's modules with
transformers' own GGUF name map and tensor processor (llama.cpp permutes the
rows of Q and K for its rope layout; the processor undoes it), and every
carried tensor is checked against the model's full-precision weight: a block
that does not dequantize to the very weight the model holds is not used.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch import nn

from engine.quant.int4 import Int4Weights

log = logging.getLogger(__name__)

BLOCK = 32
Q4_TYPES = ("Q4_0", "Q4_1")


def decode_q4_rows(data: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split raw Q4_0/Q4_1 rows into codes and per-block scale and zero.

    Args:
        data: uint8 ``[N, bytes_per_row]`` as stored in the GGUF.
        kind: ``"Q4_0"`` or ``"Q4_1"``.

    Returns:
        codes uint8 ``[N, K]`` in 0..15, scale and zero float32 ``[N, K / 32]``,
        with ``w = (q - 8) * scale + zero`` exactly as the GGUF defines ``w``.
    """
    head = {"Q4_0": 2, "Q4_1": 4}[kind]
    n = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(n, -1, head + BLOCK // 2)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., head:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)
    if kind == "Q4_0":
        zero = np.zeros_like(d)
    else:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zero = m + 8.0 * d
    return codes.astype(np.uint8), d, zero


def _name_map(model: nn.Module, architecture: str) -> tuple[dict[str, str], object]:
    """GGUF tensor name -> the model's parameter name, and the row processor for ``architecture``."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=model.config.to_dict())
    return get_gguf_hf_weights_map(model, processor), processor


def carry_over(gguf_path: Path, model: nn.Module) -> dict[str, Int4Weights]:
    """Int4 groups for every Linear of ``model`` stored as Q4_0/Q4_1 in ``gguf_path``.

    ``model`` must hold the GGUF's dequantized weights (the converted copy);
    each carried tensor is checked against them. Returns module name ->
    :class:`Int4Weights` (group size 32); tensors that are not Q4 blocks, or
    that fail the check, are left out.
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    arch_field = reader.get_field("general.architecture")
    architecture = bytes(arch_field.parts[arch_field.data[0]]).decode() if arch_field is not None else ""
    names, processor = _name_map(model, architecture)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    found: dict[str, Int4Weights] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in Q4_TYPES or tensor.name not in names:
            continue
        module_name = names[tensor.name].removesuffix(".weight")
        linear = linears.get(module_name)
        if linear is None:
            continue
        codes, scale, zero = decode_q4_rows(np.asarray(tensor.data), kind)
        codes, scale, zero = (np.ascontiguousarray(processor.process(weights=a, name=tensor.name).weights)
                              for a in (codes, scale, zero))
        weights = Int4Weights(torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(zero), BLOCK)
        if weights.shape != tuple(linear.weight.shape) or not _matches(weights, linear.weight):
            log.warning("GGUF tensor %s does not match %s; quantizing it from its weights instead", tensor.name, module_name)
            continue
        found[module_name] = weights
    return found


def _matches(weights: Int4Weights, weight: torch.Tensor) -> bool:
    """The blocks dequantize (in fp32) to the model's weight, up to fp32 rounding."""
    w = weight.detach().to(torch.float32).cpu()
    tol = 1e-6 * float(w.abs().max().clamp(min=1e-12))
    return bool((weights.dequantize() - w).abs().max() <= tol)


def bf16_rounding_error(weights: Int4Weights) -> tuple[float, float]:
    """What rounding scale and zero to bf16 (as the kernel does) costs these groups.

    Returns the max abs error and the max error relative to the group's range
    (``15 * scale``), against the exact fp32 dequantization.
    """
    exact = weights.dequantize()
    rounded = Int4Weights(weights.codes, weights.scale.to(torch.bfloat16).float(),
                          weights.zero.to(torch.bfloat16).float(), weights.group_size).dequantize()
    n, k = weights.shape
    err = (rounded - exact).abs().view(n, k // weights.group_size, weights.group_size).amax(dim=-1)
    span = (15.0 * weights.scale.abs()).clamp(min=1e-12)
    return float(err.max()), float((err / span).max())
