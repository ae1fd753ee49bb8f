"""A GGUF converted once into a safetensors directory (transformers dequantizes GGUF slowly on
every load), written beside a marker that records the copy's hashes, with progress while it runs.

A full copy holds every tensor in fp32 (9.6 GB for ``coder``'s pair, whose GGUFs take 1.5 GB).
An int4 load needs none of the linear layers' weights from it (their blocks come from the GGUF
itself, :mod:`engine.quant.gguf_blocks`), so for int4 profiles the copy is *lean*: config,
tokenizer and the tensors that stay in full precision (embeddings, norms, biases), the
very tensors a full copy holds; the GGUF stays beside it as the source of the rest
(:func:`write_lean`, :mod:`engine.quant.stream`)."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.errors import ModelSourceError
from engine.fetch.cachefiles import sha256_file
from engine.fetch.wheels import tmp_name
from engine.paths import disk_full, disk_full_error, make_dir
from engine.progress import ProgressFn, model_name, no_progress, ticking, time_left

DONE_MARKER = "specchat-converted.json"
"""The file a finished conversion writes last: its source, its time and its files' sha256."""
LEAN_SUFFIX = ".lean"
"""A lean copy's directory is the full copy's name with this added."""


@contextmanager
def one_metadata_read() -> Iterator[None]:
    """Within this block transformers parses each GGUF's metadata once, not once per reader.

    For most architectures (llama, qwen2, mistral among them) transformers builds a GGUF's
    config with ``load_gguf_checkpoint(path, return_tensors=False)``, which parses every
    metadata value through ``gguf.GGUFReader``: 22 s for Qwen2.5-Coder-1.5B's 151,936-token
    vocabulary here. A first start asks it three times a GGUF: for the memory plan's config,
    for the tokenizer's config, and in the conversion (``AutoConfig``, then ``AutoTokenizer``
    once more). The loader holds this block for the whole load, so the first ask parses and
    the others get a fresh copy of that answer, kept pickled meanwhile (4 MB for Qwen's,
    where the answer itself takes 160 MB of Python objects; a copy is unpickled in 0.06 s).
    Tensor reads pass through. A transformers without that function is left as it is (the
    load is then only slower). Blocks nest: an inner one adds nothing."""
    try:
        from transformers import modeling_gguf_pytorch_utils as module
    except ImportError:
        yield
        return
    original = getattr(module, "load_gguf_checkpoint", None)
    if original is None or getattr(original, "reads_once", False):
        yield
        return
    answers: dict[tuple[str, int, int, int, int], bytes] = {}

    def read_once(path: Any, return_tensors: bool = False, *args: Any, **kwargs: Any) -> Any:
        if return_tensors or args or kwargs:
            return original(path, return_tensors, *args, **kwargs)
        try:
            stat = os.stat(path)
        except OSError:
            return original(path, return_tensors=False)  # its own error, as before
        # a file fetched again, or swapped for another of the same size and mtime, is parsed again
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
        if key in answers:
            return pickle.loads(answers[key])
        answer = original(path, return_tensors=False)
        answers[key] = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        return answer

    read_once.reads_once = True  # type: ignore[attr-defined]
    module.load_gguf_checkpoint = read_once
    try:
        yield
    finally:
        module.load_gguf_checkpoint = original


def gguf_damage(path: Path) -> str | None:
    """Why the GGUF file at ``path`` is truncated or corrupt (its header or tensor table cannot be
    read, or its tensors run past its end), or None when its structure is whole. Asked only after
    a read failed, to tell a damaged file from a model the GGUF loader does not support."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        size = path.stat().st_size
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except OSError:  # unreadable (permissions, I/O): not a sign of damage; the caller says what happened
        return None
    except Exception as exc:  # noqa: BLE001 - the reader raises many kinds on a damaged file
        return f"its header or tensor table cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())})"
    if end > size:
        return f"its tensors end at byte {end} but the file has only {size} bytes"
    return None


def gguf_read_error(path: Path, what: str, exc: BaseException) -> ModelSourceError:
    """The error for a GGUF file that failed while ``what`` (e.g. "reading its config"): truncated or
    corrupt, naming the file, when it is; else the reader's own reason."""
    damage = gguf_damage(path)
    if damage is not None:
        return ModelSourceError(f"the GGUF file {path} is truncated or corrupt: {damage}; delete it and "
                                "download or copy it again")
    detail = " ".join(str(exc).split())
    return ModelSourceError(f"cannot read the GGUF file {path} ({what}): {type(exc).__name__}: {detail}; it may "
                            "be a model the transformers GGUF loader does not support")



def _clean_stale(parent: Path, name: str) -> None:
    """Remove temporary directories left behind by killed conversions."""
    import psutil

    for tmp in parent.glob(f".{name}.tmp-*"):
        pid = tmp.name.rsplit(".tmp-", 1)[-1].split("-")[0]
        if not (pid.isdigit() and psutil.pid_exists(int(pid)) and int(pid) != os.getpid()):
            shutil.rmtree(tmp, ignore_errors=True)


def _dir_bytes(path: Path) -> int:
    """Bytes in the files directly inside ``path`` (0 while it does not exist)."""
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except OSError:
        return 0


def convert_gguf(gguf: Path, dest: Path, progress: ProgressFn = no_progress, verify: bool = True,
                 lean: bool = False, source_sha256: str = "") -> Path:
    """Dequantize a GGUF once into a safetensors directory ``dest`` (model + tokenizer);
    with ``verify``, reload the copy and require identical logits. ``lean``: write a lean
    copy (:func:`write_lean`) where the architecture allows, a full one otherwise.
    ``source_sha256``: the GGUF's sha256 (what ``dest`` is named by), kept in the marker."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (dest / DONE_MARKER).is_file():
        return dest
    make_dir(dest.parent)
    _clean_stale(dest.parent, dest.name)
    started = time.perf_counter()
    stage = conversion_stage(gguf, dest.parent, lean)
    if lean and _convert_lean(gguf, dest, progress, started, stage, source_sha256):
        return dest
    stage = conversion_stage(gguf, dest.parent, False)
    try:
        with ticking(progress, f"{stage}, reading the GGUF", 0.0), one_metadata_read():
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as exc:  # the gguf reader raises many kinds on a damaged file
        raise gguf_read_error(gguf, "converting it", exc) from None
    model.hf_quantizer = None  # save_pretrained refuses a GGUF-quantized model otherwise
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    tmp = tmp_name(dest)
    try:
        with ticking(progress, f"{stage}, writing the copy", 0.6, lambda: _dir_bytes(tmp), total, 0.85):
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        if verify:
            progress(f"{stage}, checking the copy", 0.85)
            ids = torch.tensor([tokenizer("The quick brown fox").input_ids])
            copy = AutoModelForCausalLM.from_pretrained(str(tmp), use_safetensors=True, dtype=torch.float32)
            with torch.no_grad():
                same = torch.equal(model(ids).logits, copy(ids).logits)
            del copy
            if not same:
                raise ModelSourceError(f"the safetensors copy of {gguf} gives different logits; not using it")
        _finish(tmp, dest, gguf, started, verified=verify, lean=False, source_sha256=source_sha256)
    except Exception as exc:  # noqa: BLE001 - safetensors wraps the file system's errors in its own kind
        if disk_full(exc):
            raise disk_full_error(dest, f"the converted copy of {gguf.name}", total) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress(f"{stage}: done", 1.0)
    return dest


def _finish(tmp: Path, dest: Path, gguf: Path, started: float, *, verified: bool, lean: bool,
            source_sha256: str = "") -> None:
    """Write the marker into the finished copy ``tmp`` and rename it onto ``dest``. The marker
    records every file's sha256 (the config and tokenizer too: a copy whose config.json was
    damaged read as intact, and its error blamed the GGUF). A ``dest`` without a marker is what
    an interrupted or damaged copy left (a copy is renamed into place whole, its marker in it):
    it is removed first, where the rename onto it failed with "Directory not empty"."""
    marker = {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "gguf_sha256": source_sha256,
              "seconds": round(time.perf_counter() - started, 2), "verified": verified, "lean": lean,
              "sha256": {f.name: sha256_file(f) for f in sorted(tmp.iterdir()) if f.is_file()}}
    (tmp / DONE_MARKER).write_text(json.dumps(marker, indent=2))
    if dest.is_dir() and not dest.is_symlink() and not (dest / DONE_MARKER).is_file():
        shutil.rmtree(dest, ignore_errors=True)
    try:
        os.rename(tmp, dest)
    except OSError:
        if not (dest / DONE_MARKER).is_file():  # another process won the race
            raise


def conversion_stage(gguf: Path, converted: Path, lean: bool) -> str:
    """``"converting NAME once (about 3 min)"``: the time from the earlier conversions of the same
    kind in ``converted`` (their markers record seconds and GGUF bytes), scaled to this GGUF's
    size; without any, no guess."""
    rate_s, rate_b = 0.0, 0
    for marker in converted.glob(f"*/{DONE_MARKER}") if converted.is_dir() else ():
        try:
            data = json.loads(marker.read_text())
            seconds, size = float(data["seconds"]), int(data["gguf_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if bool(data.get("lean")) == lean and seconds > 0 and size > 0:
            rate_s, rate_b = rate_s + seconds, rate_b + size
    guess = f" ({time_left(rate_s / rate_b * gguf.stat().st_size)})" if rate_b else ""
    return f"converting {model_name(gguf.name)} once{guess}"


def _convert_lean(gguf: Path, dest: Path, progress: ProgressFn, started: float, stage: str,
                  source_sha256: str = "") -> bool:
    """A lean copy of ``gguf`` at ``dest``; False (nothing written) where the model is not of
    :data:`~engine.fetch.gguf_tensors.STREAMED_TYPES` or the GGUF lacks a tensor it needs."""
    tmp = tmp_name(dest)
    try:
        with ticking(progress, f"{stage}, reading the tensors kept in full precision", 0.0), \
                one_metadata_read():
            written = write_lean(gguf, tmp)
        if not written:
            return False
        _finish(tmp, dest, gguf, started, verified=True, lean=True, source_sha256=source_sha256)
    except ModelSourceError:
        raise
    except Exception as exc:  # the gguf reader raises many kinds on a damaged file
        if disk_full(exc):  # not the GGUF's fault
            raise disk_full_error(dest, f"the converted copy of {gguf.name}") from None
        raise gguf_read_error(gguf, "converting it", exc) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress(f"{stage}: done (lean: its linear layers stay in the GGUF)", 1.0)
    return True


def write_lean(gguf: Path, out: Path) -> bool:
    """Write a lean copy of ``gguf`` into the new directory ``out``: what a full copy holds
    (config, generation config, tokenizer, ``model.safetensors``) less the weights of the
    linear layers. Each tensor is the full copy's, bit for bit (transformers' dequantization
    and row order, :class:`~engine.fetch.gguf_tensors.GgufTensors`), and is checked once
    more after writing. False, with ``out`` left empty, where a lean copy cannot stand in
    for the full one."""
    import torch
    from accelerate import init_empty_weights
    from safetensors.torch import load_file, save_file
    from torch import nn
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from engine.fetch.gguf_tensors import STREAMED_TYPES, GgufTensors

    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if config.model_type not in STREAMED_TYPES:
        return False
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    linear = {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    head = model.get_output_embeddings()
    tied = head is not None and bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
    stored = [name for name, p in model.named_parameters() if not (tied and p is head.weight)]  # a tied head: none
    kept = [name for name in stored if name not in linear]
    tensors = GgufTensors(gguf, model)
    if any(name not in tensors.by_parameter for name in stored):
        return False
    values = {name: tensors.tensor(name).contiguous() for name in kept}  # type: ignore[union-attr]
    out.mkdir(parents=True)
    save_file(values, str(out / "model.safetensors"), metadata={"format": "pt"})
    if any(not torch.equal(values[k], v) for k, v in load_file(str(out / "model.safetensors")).items()):
        raise ModelSourceError(f"the lean copy of {gguf} reads back different tensors; not using it")
    config.architectures = [type(model).__name__]
    config.dtype = torch.float32
    config.save_pretrained(out)
    generation = GenerationConfig.from_model_config(config)
    if generation.to_diff_dict():
        generation.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    return True


def is_lean(path: Path) -> bool:
    """Whether the converted copy at ``path`` is lean (its GGUF holds the linear weights)."""
    try:
        return bool(json.loads((path / DONE_MARKER).read_text()).get("lean"))
    except (OSError, ValueError, AttributeError):
        return False


def converted_copy_intact(path: Path) -> bool:
    """True when every file a converted copy's marker recorded still has its sha256 (copies made
    before the marker named every file: their safetensors files)."""
    try:
        recorded = json.loads((path / DONE_MARKER).read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        return False
    if not isinstance(recorded, dict) or not recorded:
        return False
    try:
        return all(sha256_file(path / name) == want for name, want in recorded.items())
    except OSError:
        return False
