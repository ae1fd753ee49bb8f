"""int4 straight from the checkpoint, one weight at a time (on a card, and from a lean copy).

The plain int4 path (:func:`engine.quant.apply_int4`) loads the whole model in
full precision on the host first, then quantizes it: some 15 GiB of host RAM
for a 7B model in bf16. :func:`stream_int4` builds the model empty (on the meta
device), loads every tensor that stays in full precision (embeddings, norms,
biases) straight onto ``device``, and then reads the linear layers' weights one
at a time: each is moved to ``device``, quantized there (or taken from the int4
cache, without reading it at all), packed into an :class:`Int4Linear` and
dropped. The host holds one weight at a time plus, for the cache, the packed
codes (half a byte a weight) and bf16 scales and zeros.

A GGUF source's converted copy streams the same way: each linear layer whose
GGUF blocks map onto the kernel's groups is carried over code for code
(:class:`engine.quant.gguf_blocks.GgufCarrier`, checked against the weight just
read), the rest quantized from their weights, as :func:`engine.quant.apply_int4`
does for a model loaded whole. A *lean* copy (:mod:`engine.fetch.convert`) holds no
linear weights: each is dequantized from the GGUF when it is needed (a cold int4
cache), the same fp32 tensor a full copy would hold.

It handles plain Llama-family checkpoints in safetensors whose tensor names
are the model's own; anything else returns None and the caller takes the
plain path.
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.quant.int4 import (
    Int4Linear, Int4Weights, QuantReport, check_shape, nibble_pairs, quantize_weight, takes, _linear_names,
)
from engine.errors import QuantizationError
from engine.fetch.gguf_tensors import STREAMED_TYPES

log = logging.getLogger(__name__)


def pack_for_cache(weights: Int4Weights) -> Int4Weights:
    """``weights`` as the cache keeps them on the host: codes two to a byte ``[N, K / 2]``
    (:func:`engine.quant.cache._save` writes them as they are) and bf16 scales and zeros (exact:
    the kernel rounds them to bf16 anyway)."""
    pairs = nibble_pairs(weights.codes.to("cpu"))
    return Int4Weights(pairs, weights.scale.to("cpu", torch.bfloat16), weights.zero.to("cpu", torch.bfloat16),
                       weights.group_size, weights.planes)


def _open_all(files: list[Path]) -> dict[str, Path]:
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            where.update({key: path for key in f.keys()})
    return where


def _read(path: Path, key: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor(key)


def stream_int4(
    directory: Path, config: Any, *, dtype: torch.dtype, device: torch.device, group_size: int = 32,
    quantize_head: bool = True, cached: dict[str, Int4Weights] | None = None, gguf: Path | None = None,
    wide_planes: bool = False, on_layer: Callable[[int, int], None] | None = None,
) -> tuple[nn.Module, QuantReport] | None:
    """An int4 model of the safetensors checkpoint in ``directory`` on ``device``, built one
    weight at a time; None when this checkpoint needs the plain path (another architecture,
    no safetensors, tensor names that are not the model's).

    Args:
        directory: the checkpoint (``config.json`` and ``*.safetensors``).
        config: its transformers config.
        dtype: the compute dtype of the tensors kept in full precision.
        device: where everything goes.
        group_size, quantize_head: as for :func:`engine.quant.int4.quantize_model`.
        cached: int4 groups by module name (the int4 cache): used instead of reading those weights.
        gguf: the GGUF file ``directory`` was converted from: its blocks are carried over where
            they map (group size 32 only), wider types as two planes when ``wide_planes``.
        on_layer: told ``(layers done, layers)`` as each linear layer is built (progress).

    Returns:
        The model in eval mode, and the report; ``report.groups`` holds what was quantized here,
        packed for the cache (:func:`pack_for_cache`).
    """
    from accelerate import init_empty_weights
    from accelerate.utils import set_module_tensor_to_device
    from transformers import AutoModelForCausalLM, GenerationConfig

    files = sorted(directory.glob("*.safetensors"))
    if not files or getattr(config, "model_type", None) not in STREAMED_TYPES:
        return None
    where = _open_all(files)
    config = copy.deepcopy(config)  # untying the head below must not change the caller's config
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    linears = _linear_names(model, quantize_head)
    weights_of = {f"{name}.weight": name for name in linears}
    state = dict(model.named_parameters(remove_duplicate=False))
    if any(key not in state for key in where):
        log.info("int4: %s does not name its tensors as the model does; loading it whole", directory)
        return None
    cached = cached or {}
    carries = gguf is not None and group_size == 32 and gguf.is_file()
    carrier: Any = None  # the GGUF's blocks, read when a layer first needs them (not on a warm start)

    def gguf_carrier() -> Any:
        nonlocal carrier
        if carrier is None:
            from engine.quant.gguf_blocks import GgufCarrier

            carrier = GgufCarrier(gguf, model, wide_planes=wide_planes)  # type: ignore[arg-type]
        return carrier

    unstored = [n for n in _linear_names(model, True) if f"{n}.weight" not in where and not _tied_head(model, n)]
    if any(n not in cached or not takes(cached[n], group_size) for n in unstored):
        # a lean copy (engine.fetch.convert) and no int4 cache for all of it: the GGUF holds those weights
        if gguf is None or not gguf.is_file():
            log.info("int4: %s holds no weight for %s and names no GGUF that does", directory, unstored[0])
            return None
        if any(f"{n}.weight" not in gguf_carrier().tensors.by_parameter for n in unstored):
            log.info("int4: neither %s nor %s holds every linear weight", directory, gguf)
            return None
    for key, path in where.items():  # everything that stays in full precision
        if key not in weights_of:
            set_module_tensor_to_device(model, key, device, value=_read(path, key).to(dtype))
    for name in unstored:  # a linear the settings keep in full precision (an untied head without quantize_head)
        if name not in linears:
            set_module_tensor_to_device(model, f"{name}.weight", device, value=_source(model, where, name, carrier).to(dtype))
    report = QuantReport()
    for i, name in enumerate(linears):
        if on_layer is not None:
            on_layer(i, len(linears))
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, attr)
        n, k = linear.weight.shape
        weights = cached.get(name)
        if weights is not None and not takes(weights, group_size):
            weights = None
        source = None
        if weights is None and carries and name in gguf_carrier():
            source = _source(model, where, name, carrier)
            weights = carrier.carry(name, source)
            if weights is not None:
                report.groups[name] = pack_for_cache(weights)
                report.carried_over.append(name)
        try:
            check_shape(n, k, group_size, device, weights.planes if weights is not None else 1)
        except QuantizationError as exc:  # kept in full precision
            report.kept[name] = str(exc)
            report.groups.pop(name, None)
            if name in report.carried_over:
                report.carried_over.remove(name)
            key = f"{name}.weight"
            value = source if source is not None else _source(model, where, name, carrier)
            set_module_tensor_to_device(model, key, device, value=value.to(dtype))
            continue
        if weights is None:
            weights = quantize_weight((source if source is not None else _source(model, where, name, carrier)).to(device),
                                      group_size)
            report.groups[name] = pack_for_cache(weights)
        bias = linear.bias if linear.bias is not None and not linear.bias.is_meta else None
        new = Int4Linear(weights, bias, device)
        if _tied_head(model, name):
            model.config.tie_word_embeddings = False
            model.config.get_text_config().tie_word_embeddings = False
        setattr(parent, attr, new)
        report.add(name, new)
        del weights, source
    if on_layer is not None:
        on_layer(len(linears), len(linears))
    if not quantize_head and getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    left = [n for n, p in _tensors(model) if p.is_meta]
    if left:
        raise QuantizationError(f"int4 loading left {len(left)} tensors unread ({left[0]}, ...) in {directory}")
    model.to(device)
    try:
        model.generation_config = GenerationConfig.from_pretrained(str(directory))
    except OSError:
        pass
    return model.eval(), report


def _tied_head(model: nn.Module, name: str) -> bool:
    """Whether module ``name`` is a head tied to the input embeddings (not stored in the checkpoint)."""
    head = model.get_output_embeddings()
    return head is not None and model.get_submodule(name) is head and bool(
        getattr(model.config.get_text_config(), "tie_word_embeddings", False))


def _source(model: nn.Module, where: dict[str, Path], name: str, carrier: Any = None) -> torch.Tensor:
    """Linear ``name``'s full-precision weight ``[N, K]``: read from its file; for a tied head
    the input embeddings already loaded; in a lean copy, dequantized from the GGUF as the
    converter would have written it (``carrier``: :class:`engine.quant.gguf_blocks.GgufCarrier`)."""
    key = f"{name}.weight"
    if key in where:
        return _read(where[key], key)
    if _tied_head(model, name):
        return model.get_input_embeddings().weight.detach()
    weight = carrier.tensors.tensor(key) if carrier is not None else None
    if weight is None:
        raise QuantizationError(f"int4: no weight for {name} in the copy or its GGUF")
    return weight


def _tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer of ``model`` by name."""
    return [*model.named_parameters(), *model.named_buffers()]
