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
  checked again and fetched afresh when it was damaged.
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

_PID_IN_NAME = re.compile(r"(?:^\.download-|\.tmp-)(\d+)-")
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
    if not (name.startswith(".download-") or ".tmp-" in name):
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
    for sub in ("files", "converted"):
        if (root / sub).is_dir():
            candidates += [p for p in (root / sub).rglob(".*.tmp-*")]
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

def record_path(path: Path) -> Path:
    """Where the hash ``path`` was verified against is kept: ``.NAME.record.json`` beside it."""
    return path.parent / f".{path.name}.record.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_record(path: Path, sha256_hex: str, origin: str) -> None:
    """Remember that ``path`` was verified as ``sha256_hex`` (from ``origin``, e.g. a RECORD)."""
    data = {"sha256": sha256_hex, "size": path.stat().st_size, "origin": origin}
    tmp = path.parent / f".{path.name}.record.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, record_path(path))


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
