"""Carry a GGUF's blocks over to the int4 kernel's groups, code for code.

The kernel's groups (:mod:`engine.quant.int4`) read ``w = (q - 8) * scale + zero``
over 32 consecutive inputs. llama.cpp's formats map onto them as follows (``d``,
``m``, ``dmin`` fp16; codes as stored):

* **Q4_0** (blocks of 32: ``d``, 16 bytes of codes): ``w = d (q - 8)``;
  ``scale = d``, ``zero = 0``. Byte ``j`` holds element ``j`` in its low nibble
  and element ``j + 16`` in its high nibble (Q4_1 and Q5_0 alike).
* **Q4_1** (``d``, ``m``, codes): ``w = d q + m``; ``scale = d``, ``zero = m + 8 d``.
* **Q4_K** (super-blocks of 256: ``d``, ``dmin``, 12 bytes packing eight 6-bit
  scales ``sc`` and mins ``mn``, 128 bytes of codes): sub-block ``j`` of 32 is
  ``w = d sc_j q - dmin mn_j``, so ``scale = d sc_j``, ``zero = 8 d sc_j - dmin mn_j``.
  Bytes ``32 c .. 32 c + 31`` hold sub-block ``2 c`` in their low nibbles and
  ``2 c + 1`` in their high ones.

Formats with more than four bits become two int4 planes (``u = 16 h + l``,
``w = (l - 8) s + z_lo + (h - 8) 16 s + z_hi``, see :func:`engine.quant.int4.two_planes`):

* **Q8_0** (``d``, 32 int8 ``q``): ``w = d q``; ``u = q + 128``, ``s = d``, ``z_lo = 8 d``, ``z_hi = 0``.
* **Q5_0** (``d``, 4 bytes of fifth bits, 16 bytes of nibbles): ``w = d (q - 16)``; ``u = q``,
  ``s = d``, ``z_lo = -8 d``, ``z_hi = 128 d``.
* **Q6_K** (super-blocks of 256: 128 bytes of low nibbles, 64 of top bits, 16 int8
  scales ``sc``, ``d``): ``w = d sc_j (q - 32)`` over sub-blocks of 16; two planes in
  groups of 16 with ``u = q + 96``, ``s = d sc_j``, ``z_lo = 8 s``, ``z_hi = 0``
  (:func:`decode_q6_k_rows`), which specchat's CPU kernel reads as 6-bit codes
  (:mod:`engine.quant.int4`, "Six bits").
* Every other type is requantized from its dequantized weights to 8 bits per group of
  32 (:func:`engine.quant.int4.quantize_weight8`): at most half an 8-bit step off.

The codes are kept bit for bit; the kernel rounds each scale and zero to bf16,
the only error the carry-over adds (:func:`bf16_rounding_error` measures it;
every zero above is an exact multiple of a power of two times ``d``, so it rounds
no worse than ``d``). A Q4_K's rows also carry their super-blocks' 16-byte headers
(:func:`q4_k_headers`), and a Q6_K's their sub-scales and ``d`` (:func:`q6_k_headers`), which
specchat's CPU kernel reads in place of the bf16 scales: there it multiplies the file's weights
exactly, from 4.5 and 6.56 bits a weight.

The GGUF's tensor names and row order are mapped to the model's modules with
transformers' own GGUF name map and tensor processor
(:class:`engine.fetch.gguf_tensors.GgufTensors`), and every
carried tensor is checked against the model's full-precision weight: a block
that does not dequantize to the very weight the model holds is not used.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any
from pathlib import Path

import numpy as np
import torch
from torch import nn

from engine.errors import QuantizationError
from engine.fetch.gguf_tensors import GgufTensors
from engine.quant.cpu_pack import SIX_BIT_GROUP, check_headers
from engine.quant.int4 import Int4Weights, quantize_weight8, two_planes

log = logging.getLogger(__name__)

BLOCK = 32
QK_K = 256
FOUR_BIT_TYPES = ("Q4_0", "Q4_1", "Q4_K")
EXACT_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q8_0", "Q6_K")
"""Types carried over code for code; any other quantized type is requantized to 8 bits."""
FLOAT_TYPES = ("F32", "F16", "BF16")
CARRY_ROWS = 8192
"""Rows carried over at a time in a tall tensor (an output layer of 151,936 rows took 6 GB of
temporaries in one piece), where the architecture's row processor keeps rows in place."""


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian fp16 from the last axis of 2 bytes, as float32."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``[..., 16]`` bytes -> ``[..., 32]`` codes: low nibbles first, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def decode_q4_rows(data: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split raw Q4_0/Q4_1/Q4_K rows into codes and per-32 scale and zero.

    Args:
        data: uint8 ``[N, bytes_per_row]`` as stored in the GGUF.
        kind: ``"Q4_0"``, ``"Q4_1"`` or ``"Q4_K"``.

    Returns:
        codes uint8 ``[N, K]`` in 0..15, scale and zero float32 ``[N, K / 32]``,
        with ``w = (q - 8) * scale + zero`` exactly as the GGUF defines ``w``.
    """
    n = data.shape[0]
    if kind == "Q4_K":
        return _decode_q4_k(np.ascontiguousarray(data).reshape(n, -1, 144))
    head = {"Q4_0": 2, "Q4_1": 4}[kind]
    blocks = np.ascontiguousarray(data).reshape(n, -1, head + BLOCK // 2)
    d = _f16(blocks[..., 0:2])
    codes = _nibbles(blocks[..., head:]).reshape(n, -1)
    zero = np.zeros_like(d) if kind == "Q4_0" else _f16(blocks[..., 2:4]) + 8.0 * d
    return codes.astype(np.uint8), d, zero


def _decode_q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[N, nb, 144]`` Q4_K super-blocks -> codes ``[N, 256 nb]``, scale and zero ``[N, 8 nb]``."""
    from gguf.quants import Q4_K

    n, nb, _ = blocks.shape
    d = _f16(blocks[..., 0:2])[..., None]
    dmin = _f16(blocks[..., 2:4])[..., None]
    sc, mn = Q4_K.get_scale_min(blocks[..., 4:16].reshape(n * nb, 12))
    sc = sc.reshape(n, nb, 8).astype(np.float32)
    mn = mn.reshape(n, nb, 8).astype(np.float32)
    qs = blocks[..., 16:].reshape(n, nb, 4, 32)
    codes = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, nb * QK_K)  # sub-block 2c, then 2c + 1
    scale = (d * sc).reshape(n, nb * 8)
    zero = (8.0 * d * sc - dmin * mn).reshape(n, nb * 8)
    return codes.astype(np.uint8), scale, zero


def _block_bytes(data: np.ndarray, block: int, part: slice) -> np.ndarray:
    """Bytes ``part`` of every ``block``-byte super-block of raw rows ``[N, bytes_per_row]``, each row's side
    by side: uint8 ``[N, blocks · len(part)]``."""
    n = data.shape[0]
    return np.ascontiguousarray(np.ascontiguousarray(data).reshape(n, -1, block)[..., part]).reshape(n, -1)


def q4_k_headers(data: np.ndarray) -> np.ndarray:
    """The 16-byte headers (fp16 ``d``, ``dmin``, 12 bytes of 6-bit sub-scales and mins) of raw Q4_K rows
    ``[N, bytes_per_row]``, as stored: uint8 ``[N, K / 256 · 16]`` (specchat's CPU kernel reads them as they are)."""
    return _block_bytes(data, 144, slice(0, 16))


def q6_k_headers(data: np.ndarray) -> np.ndarray:
    """The scales of raw Q6_K rows ``[N, bytes_per_row]`` as stored (16 int8 sub-scales, then fp16 ``d``, per
    super-block): uint8 ``[N, K / 256 · 18]`` (specchat's CPU kernel reads them as they are)."""
    return _block_bytes(data, 210, slice(192, 210))


def decode_8bit_rows(data: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split raw Q8_0/Q5_0 rows into 8-bit codes ``u`` and the two planes' scale and zeros.

    Returns:
        u uint8 ``[N, K]``; scale, zero_lo, zero_hi float32 ``[N, K / 32]`` such that
        ``w = s u + z_lo + z_hi - 136 s`` is the GGUF's ``w`` (see the module docstring).
    """
    n = data.shape[0]
    if kind == "Q8_0":
        blocks = np.ascontiguousarray(data).reshape(n, -1, 2 + BLOCK)
        d = _f16(blocks[..., 0:2])
        u = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(n, -1)
        return u, d, 8.0 * d, np.zeros_like(d)
    if kind == "Q5_0":
        blocks = np.ascontiguousarray(data).reshape(n, -1, 2 + 4 + BLOCK // 2)
        d = _f16(blocks[..., 0:2])
        high = np.unpackbits(blocks[..., 2:6], axis=-1, bitorder="little")  # bit j: fifth bit of element j
        u = (_nibbles(blocks[..., 6:]) | (high << 4)).astype(np.uint8).reshape(n, -1)
        return u, d, -8.0 * d, 128.0 * d
    raise QuantizationError(f"no 8-bit decoding for GGUF type {kind}")


def decode_q6_k_rows(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split raw Q6_K rows into codes and per-16 scales.

    Args:
        data: uint8 ``[N, bytes_per_row]`` as stored in the GGUF (210 bytes per 256 weights).

    Returns:
        q uint8 ``[N, K]`` in 0..63 and s float32 ``[N, K / 16]`` (``d·sc``, exact in fp32), with
        ``w = (q - 32)·s`` exactly as the GGUF defines ``w``.
    """
    n = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(n, -1, 210)
    nb = blocks.shape[1]
    ql = blocks[..., :128].reshape(n, nb, 2, 2, 32)  # [half, ql 0..31 / 32..63, l]
    qh = blocks[..., 128:192].reshape(n, nb, 2, 1, 32)
    sc = blocks[..., 192:208].view(np.int8).astype(np.float32)
    d = _f16(blocks[..., 208:210])[..., None]
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=3)  # weights l, 32 + l, 64 + l, 96 + l of each half
    top = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=3)
    q = (low | (top << 4)).reshape(n, nb * QK_K)
    return q.astype(np.uint8), (d * sc).reshape(n, nb * 16)


def _carried(tensor_data: np.ndarray, kind: str, process: Callable[[np.ndarray], np.ndarray],
             weight: torch.Tensor) -> Int4Weights:
    """The int4 groups for one GGUF tensor of ``kind``, rows in the model's order."""
    def rows(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(process(a)))

    if kind in FOUR_BIT_TYPES:
        codes, scale, zero = decode_q4_rows(tensor_data, kind)
        headers = rows(q4_k_headers(tensor_data)) if kind == "Q4_K" else None
        return Int4Weights(rows(codes), rows(scale), rows(zero), BLOCK, headers=headers)
    if kind in ("Q8_0", "Q5_0"):
        u, scale, zero_lo, zero_hi = decode_8bit_rows(tensor_data, kind)
        return two_planes(rows(u), rows(scale), rows(zero_lo), rows(zero_hi), BLOCK)
    if kind == "Q6_K":
        q, scale = decode_q6_k_rows(tensor_data)
        s = rows(scale)
        planes = two_planes(rows(q).to(torch.int32) + 96, s, 8.0 * s, torch.zeros_like(s), SIX_BIT_GROUP)
        return dataclasses.replace(planes, headers=rows(q6_k_headers(tensor_data)))
    return quantize_weight8(weight, BLOCK)


class GgufCarrier:
    """A GGUF's blocks for a model's Linear layers, one layer at a time.

    ``model`` gives the names and the row processor (it may be empty, on the meta
    device); :meth:`carry` takes each layer's full-precision weight (the converted
    copy's, ``[N, K]``) and answers the layer's int4 groups, checked against it, or
    None. :func:`carry_over` runs it over a loaded model; the streamed int4 build
    (:mod:`engine.quant.stream`) runs it as it reads each weight.
    """

    def __init__(self, gguf_path: Path, model: nn.Module, *, wide_planes: bool = True) -> None:
        self.tensors = GgufTensors(gguf_path, model)
        self.wide_planes = wide_planes
        self._tensors: dict[str, Any] = {}  # module name -> the GGUF tensor holding its weight, where blocks carry over
        for name, tensor in self.tensors.by_parameter.items():
            kind = tensor.tensor_type.name
            if kind in FLOAT_TYPES or not name.endswith(".weight") or (kind not in FOUR_BIT_TYPES and not wide_planes):
                continue
            self._tensors[name.removesuffix(".weight")] = tensor

    def _keeps_rows(self, parameter: str, n: int) -> bool:
        return n > CARRY_ROWS and _rows_kept(lambda a: self.tensors.process(a, parameter), n)

    def __contains__(self, module_name: str) -> bool:
        return module_name in self._tensors

    def carry(self, module_name: str, weight: torch.Tensor) -> Int4Weights | None:
        """The int4 groups of ``module_name`` whose full-precision weight is ``weight`` ``[N, K]``;
        None when the GGUF stores it as floats, in a wide type without ``wide_planes``, or in
        blocks that do not dequantize to ``weight`` (the caller quantizes it from ``weight``)."""
        tensor = self._tensors.get(module_name)
        if tensor is None or weight.shape[1] % BLOCK:
            return None
        kind = tensor.tensor_type.name
        parameter = f"{module_name}.weight"

        def process(a: np.ndarray) -> np.ndarray:
            return self.tensors.process(a, parameter)

        data = np.asarray(tensor.data)
        rows = CARRY_ROWS if self._keeps_rows(parameter, data.shape[0]) else data.shape[0]
        parts = [_carried(data[r:r + rows], kind, process, weight[r:r + rows]) for r in range(0, data.shape[0], rows)]
        weights = parts[0] if len(parts) == 1 else Int4Weights(
            *(torch.cat([getattr(w, f) for w in parts]) for f in ("codes", "scale", "zero")),
            parts[0].group_size, parts[0].planes,
            None if parts[0].headers is None else torch.cat([w.headers for w in parts]))  # type: ignore[misc]
        del parts
        if weights.shape != tuple(weight.shape) or (kind in EXACT_TYPES and not _matches(weights, weight)):
            log.warning("GGUF tensor %s (%s) does not match %s; quantizing it from its weights instead",
                        tensor.name, kind, module_name)
            return None
        if weights.headers is not None:
            try:
                check_headers(weights.headers, weights.scale, weights.zero, weights.planes)
            except ValueError:  # the row processor moved rows and headers apart: keep the groups, bf16 tables
                log.warning("GGUF tensor %s: its %s headers do not follow its rows; keeping bf16 scales", tensor.name,
                            kind)
                weights = dataclasses.replace(weights, headers=None)
        return weights


def _rows_kept(process: Callable[[np.ndarray], np.ndarray], n: int) -> bool:
    """Whether ``process`` leaves the ``n`` rows of its tensor where they are (then the tensor
    can be carried over a slice of rows at a time)."""
    probe = np.arange(n, dtype=np.float32)[:, None]
    out = process(probe)
    return out.shape == probe.shape and bool(np.array_equal(out, probe))


def carry_over(gguf_path: Path, model: nn.Module, *, wide_planes: bool = True) -> dict[str, Int4Weights]:
    """Int4 groups for every Linear of ``model`` that ``gguf_path`` stores in blocks.

    ``model`` must hold the GGUF's dequantized weights (the converted copy);
    each tensor carried code for code is checked against them. Returns module
    name -> :class:`Int4Weights` (group size 32): one plane for 4-bit types, two
    for wider ones (see the module docstring). Float tensors, wider ones unless
    ``wide_planes``, and tensors that fail the check are left out (the caller
    quantizes them to int4 from their weights).
    """
    carrier = GgufCarrier(gguf_path, model, wide_planes=wide_planes)
    found: dict[str, Int4Weights] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name in carrier:
            weights = carrier.carry(name, module.weight)
            if weights is not None:
                found[name] = weights
    return found


def _matches(weights: Int4Weights, weight: torch.Tensor, rows: int = CARRY_ROWS) -> bool:
    """The blocks dequantize (in fp32) to the model's weight, up to fp32 rounding. Checked
    ``rows`` rows at a time: a whole output layer's fp32 temporaries took 4 GB for coder."""
    w = weight.detach()
    tol = 1e-6 * max(float(w.max()), -float(w.min()), 1e-12)
    for start in range(0, w.shape[0], rows):
        part = Int4Weights(*(t[start:start + rows] for t in (weights.codes, weights.scale, weights.zero)),
                           weights.group_size, weights.planes)
        if float((part.dequantize() - w[start:start + rows].to(torch.float32).cpu()).abs().max()) > tol:
            return False
    return True


def bf16_rounding_error(weights: Int4Weights) -> tuple[float, float]:
    """What rounding scale and zero to bf16 (as the kernel does) costs these groups.

    Returns the max abs error and the max error relative to the group's range
    (``15 * scale`` for one plane, ``255 * scale`` for two), against the exact fp32
    dequantization.
    """
    exact = weights.dequantize()
    rounded = Int4Weights(weights.codes, weights.scale.to(torch.bfloat16).float(),
                          weights.zero.to(torch.bfloat16).float(), weights.group_size, weights.planes).dequantize()
    n, k = weights.shape
    err = (rounded - exact).abs().view(n, k // weights.group_size, weights.group_size).amax(dim=-1)
    span = 15.0 * sum(weights.scale.abs().chunk(weights.planes, dim=1)).clamp(min=1e-12)  # type: ignore[union-attr]
    return float(err.max()), float((err / span).max())
