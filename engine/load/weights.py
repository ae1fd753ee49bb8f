"""Loading one model: its tokenizer, and its weights quantized as its spec says.

:func:`load_weights` builds a located source's model on a device (bitsandbytes on a card, int4 on
specchat's CPU kernel or torch's, a GGUF's blocks carried over); :func:`load_tokenizer` reads its
tokenizer (a GGUF's directly). :mod:`engine.load.loader` puts the pair and the engine together.
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config.profiles import ModelSpec
from engine.errors import ModelSourceError, QuantizationError
from engine.fetch.convert import gguf_read_error
from engine.fetch.local_files import check_model_dir
from engine.fetch.sources import (
    ResolvedSource, gguf_origin, hub_offline, locate, prepare, read_config, source_error,
)
from engine.model.device import Device
from engine.model.memory import resolve_dtype
from engine.progress import ProgressFn, no_progress

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def _warn_remote_code(spec: ModelSpec) -> None:
    if spec.trust_remote_code:
        warnings.warn(
            f"trust_remote_code is on for {spec.source}: Python code shipped with the model will run",
            stacklevel=3,
        )


def _local_only(resolved: ResolvedSource) -> bool:
    return not resolved.is_hub or hub_offline()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


def same_tokenizer_files(a: ResolvedSource, b: ResolvedSource) -> bool:
    """Whether two local model directories hold byte-identical tokenizer files (a draft converted
    from the same family's GGUF): then the target's tokenizer is the draft's, token for token,
    and the draft's need not be parsed (1.3 s for Qwen's)."""
    dirs = [Path(r.location) for r in (a, b)]
    if any(r.needs_conversion or r.is_hub or not d.is_dir() for r, d in zip((a, b), dirs)):
        return False
    found = False
    for name in TOKENIZER_FILES:
        x, y = (d / name for d in dirs)
        if x.is_file() != y.is_file() or (x.is_file() and x.read_bytes() != y.read_bytes()):
            return False
        found = found or x.is_file()
    return found


def load_tokenizer(resolved: ResolvedSource, spec: ModelSpec) -> "PreTrainedTokenizerBase":
    """The tokenizer of a located source (a GGUF not converted yet is read directly)."""
    from transformers import AutoTokenizer

    try:
        if resolved.needs_conversion:
            assert resolved.gguf_file is not None
            return AutoTokenizer.from_pretrained(str(resolved.gguf_file.parent), gguf_file=resolved.gguf_file.name)
        return AutoTokenizer.from_pretrained(
            resolved.location, trust_remote_code=spec.trust_remote_code, local_files_only=_local_only(resolved)
        )
    except Exception as exc:  # noqa: BLE001 - a damaged GGUF raises many kinds (ValueError, struct.error, ...)
        if resolved.needs_conversion:  # read from the GGUF itself
            assert resolved.gguf_file is not None
            raise gguf_read_error(resolved.gguf_file, "reading its tokenizer", exc) from None
        if isinstance(exc, OSError):
            raise source_error(resolved, "load the tokenizer of", exc) from None
        if isinstance(exc, (ValueError, KeyError, TypeError)):
            raise ModelSourceError(f"cannot load the tokenizer of {spec.source}: {exc}") from None
        raise


def load_weights(resolved: ResolvedSource, spec: ModelSpec, device: Device, config: Any = None,
                 on_layer: Callable[[int, int], None] | None = None) -> "PreTrainedModel":
    """The model of a prepared source on ``device``, quantized as ``spec`` says, in eval mode;
    ``on_layer`` is told ``(layers done, layers)`` while int4 layers are built (progress)."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.quant import apply_int4, bnb_config

    _warn_remote_code(spec)
    if not resolved.is_hub:
        check_model_dir(Path(resolved.location), spec.allow_pickle)  # names a truncated file
    dtype_name = resolve_dtype(spec.dtype, spec.quantization, cuda=device.is_cuda, config=config, bf16=device.fast_bf16)
    dtype = getattr(torch, dtype_name)
    kwargs: dict[str, Any] = dict(
        dtype=dtype,
        trust_remote_code=spec.trust_remote_code,
        use_safetensors=None if spec.allow_pickle else True,
        local_files_only=_local_only(resolved),
    )
    qconf = bnb_config(spec.quantization, dtype)
    int4 = spec.quantization == "int4"
    if int4:
        from engine.quant.int4 import cuda_int4_problem

        problem = cuda_int4_problem(device.torch_device)
        if problem is not None:  # before gigabytes are read for nothing
            raise QuantizationError(f"{spec.label}: {problem}; run it on the CPU (device = \"cpu\" in the "
                                    "profile) or choose quantization = \"nf4\" for this card")
    if qconf is not None:
        kwargs["quantization_config"] = qconf
    if device.is_cuda and not int4:  # int4 loads on the CPU, then packs straight onto the GPU
        index = device.torch_device.index
        kwargs["device_map"] = {"": index if index is not None else torch.cuda.current_device()}
        attention = device.attention_implementation(dtype_name, None if spec.trust_remote_code else config)
        if attention is not None:
            kwargs["attn_implementation"] = attention
    if spec.quantization == "int8":
        _BNB_ONCE.install()
    streamed = _int4_streamed(resolved, spec, device, config, dtype, on_layer) if int4 else None
    if streamed is not None:
        return streamed
    if resolved.lean:
        raise ModelSourceError(f"{resolved.location} is a lean copy (its linear weights stay in {gguf_origin(resolved)}) "
                               f"that {spec.label} cannot be built from; delete the directory to convert it again")
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved.location, **kwargs)
    except OSError as exc:
        raise source_error(resolved, "load the weights in", exc) from None
    except Exception as exc:  # safetensors and torch raise their own kinds on damaged files
        if device.is_out_of_memory(exc):
            raise
        raise ModelSourceError(
            f"cannot load the weights of {spec.source} ({resolved.location}): {type(exc).__name__}: {exc}"
        ) from None
    if int4:
        apply_int4(model, location=resolved.location, gguf=gguf_origin(resolved), group_size=spec.group_size,
                   quantize_head=spec.quantize_head, device=device.torch_device, wide_planes=spec.wide_blocks == "planes",
                   on_layer=on_layer)
    if qconf is None:
        model.to(device.torch_device)
    model.eval()
    return model


def _int4_streamed(resolved: ResolvedSource, spec: ModelSpec, device: Device, config: Any,
                   dtype: "torch.dtype", on_layer: Callable[[int, int], None] | None = None,
                   ) -> "PreTrainedModel | None":
    """An int4 model built one weight at a time (:func:`engine.quant.load_int4_streamed`: the
    host never holds the full-precision model; a GGUF source's blocks are carried over as each
    weight is read): on a card, and from a lean copy (whose linear weights only the GGUF holds).
    None for the plain path: a full copy on the CPU, remote code, or a checkpoint the streamed
    path does not read."""
    if not (device.is_cuda or resolved.lean) or config is None or spec.trust_remote_code:
        return None
    from engine.quant import load_int4_streamed

    if resolved.is_hub and not _local_only(resolved):
        try:
            from huggingface_hub import snapshot_download

            snapshot_download(resolved.location, allow_patterns=["*.json", "*.safetensors"])
        except Exception as exc:  # noqa: BLE001 - from_pretrained will fetch and report it
            log.info("int4: no snapshot of %s to stream from (%s); loading it whole", resolved.location, exc)
            return None
    try:
        return load_int4_streamed(resolved.location, config, dtype=dtype, device=device.torch_device,
                                  group_size=spec.group_size, quantize_head=spec.quantize_head,
                                  gguf=gguf_origin(resolved), wide_planes=spec.wide_blocks == "planes",
                                  on_layer=on_layer)
    except OSError as exc:
        raise source_error(resolved, "load the weights in", exc) from None


class _Once(logging.Filter):
    """Lets a bitsandbytes warning through once per process, not once per linear layer
    and forward pass (MatMul8bitLt logs its float16 cast on every call)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def install(self) -> None:
        logger = logging.getLogger("bitsandbytes.autograd._functions")
        if self not in logger.filters:
            logger.addFilter(self)


_BNB_ONCE = _Once()


def load_model(
    spec: ModelSpec, device: Device, progress: ProgressFn = no_progress
) -> tuple["PreTrainedModel", "PreTrainedTokenizerBase"]:
    """Resolve ``spec``'s source (download, verify, convert once) and load model and tokenizer."""
    resolved = prepare(locate(spec, progress), progress)
    config = read_config(resolved, spec)
    progress(f"loading {spec.label}", None)
    return load_weights(resolved, spec, device, config), load_tokenizer(resolved, spec)
