"""A GGUF's tensors under the parameter names of the transformers model they belong to.

transformers' GGUF loader maps llama.cpp's tensor names (``blk.3.attn_q.weight``) onto the
model's (``model.layers.3.self_attn.q_proj.weight``), dequantizes each tensor with the
``gguf`` package and passes it through the architecture's row processor (llama.cpp permutes
the rows of Q and K for its rope layout; the processor undoes it). :class:`GgufTensors` does
the same one tensor at a time, so a caller can read the tensors it needs without the whole
model in full precision: the lean converted copy (:mod:`engine.fetch.convert`) and the int4
carry-over (:mod:`engine.quant.gguf_blocks`) both stand on it.
"""
from __future__ import annotations

import functools
import mmap
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from engine.errors import ModelSourceError

STREAMED_TYPES = ("llama", "qwen2", "mistral")
"""Model types whose checkpoints name every tensor as the model does, so that a model can be
built empty and filled one tensor at a time (:mod:`engine.quant.stream`); a GGUF of one of
these converts to a lean copy."""


_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""Bytes of each GGUF metadata value type but string (8) and array (9)."""
_STRING, _ARRAY = 8, 9
_PLAIN_TYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                "I32": np.int32, "I64": np.int64}
"""Tensor types stored as plain numbers (every other type is bytes of blocks)."""


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of a GGUF: its name, its ``GGMLQuantizationType`` and its data mapped from
    the file, shaped as ``gguf.GGUFReader`` shapes it (rows of block bytes for block types)."""

    name: str
    tensor_type: Any
    data: np.ndarray


@dataclass(frozen=True)
class GgufIndex:
    """What :func:`read_index` found: the architecture and the tensors, in file order."""

    architecture: str
    tensors: list[GgufTensor]


def read_index(path: Path) -> GgufIndex:
    """The tensors of the GGUF at ``path`` without parsing its metadata into objects.

    ``gguf.GGUFReader`` turns every metadata value into numpy views, 1.4 million of them for
    Qwen's 151,936 tokens and merges: 13 s for the 0.5B draft's file here, against 0.11 s. This reads the header as the
    GGUF spec lays it out (magic, version, tensor and key counts, key/value pairs, tensor
    infos, then the data at the file's alignment), skipping the values it does not need."""
    try:
        return _read_index(path)
    except (struct.error, ValueError, KeyError, OSError) as exc:
        raise ModelSourceError(f"cannot read the tensors of GGUF file {path}: {exc}; it may be truncated or "
                               "damaged: delete it and start again") from None


def _read_index(path: Path) -> GgufIndex:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF" or struct.unpack_from("<I", buf, 4)[0] not in (2, 3):
            raise ValueError("not a little-endian GGUF of version 2 or 3")
        n_tensors, n_keys = struct.unpack_from("<QQ", buf, 8)
        offset, architecture, alignment = 24, "", 32

        def string(at: int) -> tuple[str, int]:
            (length,) = struct.unpack_from("<Q", buf, at)
            return buf[at + 8:at + 8 + length].decode("utf-8", errors="replace"), at + 8 + length

        def skip(kind: int, at: int) -> int:
            if kind == _STRING:
                return at + 8 + struct.unpack_from("<Q", buf, at)[0]
            if kind == _ARRAY:
                item, count = struct.unpack_from("<IQ", buf, at)
                at += 12
                if item in _SCALAR_BYTES:
                    return at + count * _SCALAR_BYTES[item]
                for _ in range(count):
                    at = skip(item, at)
                return at
            return at + _SCALAR_BYTES[kind]

        for _ in range(n_keys):
            key, offset = string(offset)
            (kind,) = struct.unpack_from("<I", buf, offset)
            offset += 4
            if key == "general.architecture" and kind == _STRING:
                architecture, offset = string(offset)
            elif key == "general.alignment" and kind == 4:
                (alignment,) = struct.unpack_from("<I", buf, offset)
                offset += 4
            else:
                offset = skip(kind, offset)
        infos = []
        for _ in range(n_tensors):
            name, offset = string(offset)
            (n_dims,) = struct.unpack_from("<I", buf, offset)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, offset + 4)
            kind, start = struct.unpack_from("<IQ", buf, offset + 4 + 8 * n_dims)
            offset += 4 + 8 * n_dims + 12
            infos.append((name, dims, GGMLQuantizationType(kind), start))
    data_start = -(-offset // alignment) * alignment
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for name, dims, kind, start in infos:
        shape = tuple(reversed(dims))
        block, type_bytes = GGML_QUANT_SIZES[kind]
        n_bytes = int(np.prod(dims)) * type_bytes // block
        at = data_start + start
        if at + n_bytes > raw.size:
            raise ValueError(f"tensor {name} ends at byte {at + n_bytes:,} of a {raw.size:,}-byte file")
        plain = _PLAIN_TYPES.get(kind.name)
        data = (raw[at:at + n_bytes].view(plain).reshape(shape) if plain is not None
                else raw[at:at + n_bytes].reshape(quant_shape_to_byte_shape(shape, kind)))
        tensors.append(GgufTensor(name, kind, data))
    return GgufIndex(architecture, tensors)


@contextmanager
def _one_name_map() -> Iterator[None]:
    """gguf's name table for an architecture built once in this block, not once per module.

    transformers' ``get_gguf_hf_weights_map`` walks the model and, at every module, builds
    ``gguf.get_tensor_name_map(arch, n_blocks)`` anew (345 modules for coder's target, 19 ms
    each here). The table depends on its two arguments only and is only read."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


class GgufTensors:
    """The tensors of the GGUF at ``path`` by ``model``'s parameter names.

    ``model`` gives the names and the row processor's settings; it may be empty (on the meta
    device). GGUF tensors the model has no parameter for are left out.
    """

    def __init__(self, path: Path, model: nn.Module) -> None:
        from transformers.modeling_gguf_pytorch_utils import (
            TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map,
        )

        index = read_index(path)
        self.architecture = index.architecture
        self._processor = TENSOR_PROCESSORS.get(self.architecture, TensorProcessor)(config=model.config.to_dict())
        with _one_name_map():
            names = get_gguf_hf_weights_map(model, self._processor)
        self.by_parameter: dict[str, GgufTensor] = {names[t.name]: t for t in index.tensors if t.name in names}
        """Parameter name -> the GGUF's tensor."""

    def process(self, values: np.ndarray, parameter: str) -> np.ndarray:
        """``values`` of ``parameter``'s GGUF tensor (or rows cut from them: codes, scales) with
        their rows in the model's order."""
        return self._processor.process(weights=values, name=self.by_parameter[parameter].name).weights  # type: ignore[attr-defined]

    def tensor(self, parameter: str) -> torch.Tensor | None:
        """Parameter ``parameter`` in fp32 as transformers' GGUF loader makes it, the very
        tensor a full converted copy holds (a weight ``[N, K]``); None when the GGUF has none."""
        from gguf import dequantize

        found = self.by_parameter.get(parameter)
        if found is None:
            return None
        values = self.process(dequantize(found.data, found.tensor_type), parameter)
        return torch.from_numpy(np.array(values, dtype=np.float32))
