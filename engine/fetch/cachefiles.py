"""Keeping the cache honest after a crash: leftovers, orphaned children, recorded hashes.

* Every temporary name in the cache carries the PID of the process writing it
  (``wheels/.download-PID-*`` for a wheel download, ``.NAME.tmp-PID-*`` for an
  extracted file or a converted model). :func:`clean_leftovers` removes those
  whose process is gone (or whose PID now belongs to a younger process), so a
  run killed with -9 costs nothing at the next start.
* :func:`die_with_parent_argv` runs a Python module in a child that the kernel
  kills when specchat dies (Linux ``PR_SET_PDEATHSIG``), so a killed specchat
  leaves no ``pip download`` running.
* :func:`write_record` / :func:`matches_record` keep the sha256 a cached file was
  verified against next to it, so a file that later fails to load can be
  checked again and fetched afresh when it was damaged; :func:`content_sha256`
  answers a file's hash from that record while the file's status shows it
  unchanged (why that is honest: its docstring).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import psutil

_PID_IN_NAME = re.compile(r"(?:^\.download-|\.tmp-)(\d+)(?:-|$)")  # the int4 cache's name ends in the PID
UNOWNED_AFTER_S = 3600.0
"""A temporary name without a PID (older releases) is removed once this old."""


def _owner_alive(pid: int, mtime: float) -> bool:
    """True when ``pid`` runs and is older than the leftover (not a reused PID)."""
    if pid == os.getpid():
        return True
    try:
        proc = psutil.Process(pid)
        return proc.is_running() and proc.create_time() <= mtime + 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def is_leftover(path: Path, now: float | None = None) -> bool:
    """A temporary download/extraction/conversion whose writer is gone."""
    name = path.name
    if not (name.startswith((".download-", ".tmp")) or ".tmp-" in name):  # .tmpXXXXXX: safetensors' own
        return False
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return False
    match = _PID_IN_NAME.search(name)
    if match is None:
        return (now if now is not None else time.time()) - mtime > UNOWNED_AFTER_S
    return not _owner_alive(int(match.group(1)), mtime)


def clean_leftovers(root: Path) -> list[Path]:
    """Remove the leftovers of interrupted downloads and extractions under ``root``; returns them."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    candidates = list((root / "wheels").glob(".download-*")) if (root / "wheels").is_dir() else []
    for sub in ("files", "converted", "int4"):
        if (root / sub).is_dir():
            candidates += [p for p in (root / sub).rglob(".*.tmp-*")]
    if (root / "int4").is_dir():  # safetensors writes an int4 cache through a .tmpXXXXXX of its own first:
        candidates += list((root / "int4").glob(".tmp*"))  # a process killed then left 84 MB (coder's: 0.9 GB)
    for path in candidates:
        if is_leftover(path):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


_CHILD = """
import ctypes, os, runpy, signal, sys
parent = int(sys.argv[1])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:  # the parent died before prctl took effect
    os._exit(1)
sys.argv = [sys.argv[2]] + sys.argv[3:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def die_with_parent_argv(module: str, *args: str) -> list[str]:
    """``python -m module args...`` in a child that is killed when this process dies."""
    if not sys.platform.startswith("linux"):
        return [sys.executable, "-m", module, *args]
    return [sys.executable, "-c", _CHILD, str(os.getpid()), module, *args]


# ----------------------------------------------------------------------------- recorded hashes

RACY_NS = 2_000_000_000
"""A file whose status changed less than this before its record was written may have changed again
within the same timestamp tick (coarse file-system clocks tick in milliseconds, FAT's in 2 s) without
its status showing it: such a record is not trusted, the file is hashed again (git's "racily clean")."""


def record_path(path: Path) -> Path:
    """Where the hash ``path`` was verified against is kept: ``.NAME.record.json`` beside it."""
    return path.parent / f".{path.name}.record.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _status(st: os.stat_result) -> dict[str, int]:
    """What a record keeps of a file's status: all of it changes when the file's bytes are written,
    or the file is replaced, through the file system."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino, "device": st.st_dev}


def write_record(path: Path, sha256_hex: str, origin: str, record: Path | None = None,
                 status: os.stat_result | None = None) -> None:
    """Remember that ``path`` was verified as ``sha256_hex`` (from ``origin``, e.g. a RECORD), with
    its status (``status``, else taken now) for :func:`content_sha256`; in ``record``, else beside it."""
    data = {"sha256": sha256_hex, **_status(status or path.stat()), "recorded_ns": time.time_ns(), "origin": origin}
    where = record or record_path(path)
    tmp = where.parent / f".{where.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, where)


def recorded_sha256(path: Path, record: Path) -> str | None:
    """``path``'s sha256 from ``record``, without reading the file: the sha256 in ``record`` while
    ``path``'s status is still the recorded one and the record was written well after the file
    last changed; None otherwise (missing, unreadable, changed, racy)."""
    try:
        data = json.loads(record.read_text())
        st = path.stat()
        if not isinstance(data, dict) or any(data.get(k) != v for k, v in _status(st).items()):
            return None
        if st.st_ctime_ns > int(data["recorded_ns"]) - RACY_NS:
            return None
        return str(data["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def content_sha256(path: Path, record: Path | None = None, origin: str = "hashed on use",
                   expect: str | None = None) -> str:
    """The sha256 of ``path``'s bytes, cheaply and honestly: from its record while the file's status
    (size, mtime_ns, ctime_ns, inode, device) is the one recorded, else hashed now and recorded.

    Why the status suffices: any write to the file through the file system sets its ctime to the
    clock, and replacing it (a rename over it, or delete and create) gives another inode and a new
    ctime; ``touch -d`` / ``os.utime`` can put back an mtime but not a ctime, which only the kernel
    sets. So a file swapped for another of the same size and mtime (the case size+mtime misses) is
    hashed again. What status cannot see is a change that bypasses the file system (a raw write to
    the device, bit rot); a file that still fails to load is then checked in full
    (:func:`forget_unless_intact`). A change within one timestamp tick of the record is covered by
    :data:`RACY_NS`. Why not hash at every start: a full hash took 2.33 s per GB (median of 5, page
    cache warm, a shared 2-core machine), 3.7 s each start for ``coder``'s 1.6 GB of joined files;
    the record check took 0.17 ms. A sampled hash would not be honest: two files may differ anywhere.

    ``expect``: the hash the file must have (a pin); bytes hashed to anything else are not
    recorded, so a record only ever says what the file was verified as.

    Raises OSError when the file cannot be read; a record that cannot be written is skipped."""
    where = record or record_path(path)
    known = recorded_sha256(path, where)
    if known is not None:
        return known
    before = path.stat()
    digest = sha256_file(path)
    if _status(path.stat()) == _status(before) and expect in (None, digest):  # not changed while read
        try:
            write_record(path, digest, origin, where, before)
        except OSError:
            pass  # a read-only cache: hashed again next time
    return digest


def matches_record(path: Path) -> bool | None:
    """True/False: ``path`` still has its recorded hash; None: nothing was recorded."""
    try:
        data = json.loads(record_path(path).read_text())
        want = str(data["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        if path.stat().st_size != data.get("size"):
            return False
        return sha256_file(path) == want
    except OSError:
        return False


def forget_unless_intact(path: Path) -> bool:
    """True when ``path`` is gone, or no longer has (or never had) a recorded hash it matches;
    then it is deleted with its record, so the next fetch verifies it afresh."""
    if not path.exists():
        record_path(path).unlink(missing_ok=True)  # a record of nothing would judge the next file
        return True
    if matches_record(path):
        return False
    forget(path)
    return True


def forget(path: Path) -> None:
    """Delete a cached file (or directory) and its record."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    record_path(path).unlink(missing_ok=True)
