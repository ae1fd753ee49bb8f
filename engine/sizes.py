"""Sizes in bytes as people write them: ``2GiB``, ``512MB``, ``1.5 G``."""
from __future__ import annotations

import re

from engine.errors import ProfileError

_SIZE_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


def parse_size(text: str | int) -> int:
    """Bytes from an int or a string like ``"2GiB"``, ``"512MB"``, ``"1.5 G"``.

    ``KB/MB/GB/TB`` are decimal, ``KiB/MiB/GiB/TiB`` and bare ``K/M/G/T`` binary.
    """
    if isinstance(text, bool):
        raise ProfileError(f"invalid size {text!r}: use bytes or a number with a unit, e.g. 2GiB, 512MB")
    if isinstance(text, int):
        if text <= 0:
            raise ProfileError(f"invalid size {text}: it must be positive")
        return text
    if re.fullmatch(r"\s*-\s*(\d+(?:\.\d*)?|\.\d+)\s*[A-Za-z]*\s*", str(text)):
        raise ProfileError(f"invalid size {text!r}: it must be positive")
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _SIZE_UNITS:
        raise ProfileError(
            f"invalid size {text!r}: use bytes or a number with a unit, e.g. 2GiB, 512MB, 1.5GB"
        )
    value = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        if not unit and float(m.group(1)) > 0:  # "0.5" read as bytes: "it must be positive" puzzled a tester
            raise ProfileError(f"invalid size {text!r}: that is less than one byte; give a unit, e.g. {m.group(1)}GB")
        raise ProfileError(f"invalid size {text!r}: it must be positive")
    return value
