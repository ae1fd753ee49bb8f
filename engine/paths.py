"""Where specchat keeps its files: the user's config, data and cache directories.

Each directory comes from :mod:`platformdirs` for the app name ``specchat`` and
can be moved with an environment variable (tests point all three at temporary
directories). Nothing in the engine writes anywhere else.

=====================  ======================  ======================================
function               override                holds
=====================  ======================  ======================================
:func:`config_dir`     ``SPECCHAT_CONFIG_DIR``  ``models.toml`` with the user's profiles
:func:`data_dir`       ``SPECCHAT_DATA_DIR``    history and other state worth keeping
:func:`cache_dir`      ``SPECCHAT_CACHE_DIR``   downloaded wheels, extracted and converted models
:func:`state_dir`      ``SPECCHAT_STATE_DIR``   small state between runs (the last profile used)
=====================  ======================  ======================================
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import platformdirs

from engine.errors import StorageError

APP_NAME = "specchat"


def _blocking_file(path: Path) -> Path | None:
    """The file (not a folder) at ``path`` or at one of its parents, if any."""
    for candidate in (path, *path.parents):
        if candidate.exists() and not candidate.is_dir():
            return candidate
    return None


def make_dir(path: Path, env_var: str | None = None) -> Path:
    """``path`` made as a folder (with its parents), or :class:`StorageError` in one sentence
    naming the path, what is in the way and, for a top folder, the variable that moves it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError as exc:
        move = f", or set {env_var} to another folder" if env_var else ""
        blocker = _blocking_file(path)
        if blocker is not None:
            raise StorageError(
                f"cannot make the folder {path}: {blocker} is a file, not a folder; move or delete that file{move}"
            ) from None
        if exc.errno == errno.ENOSPC:
            raise StorageError(f"cannot make the folder {path}: the disk is full; free some space{move}") from None
        raise StorageError(f"cannot make the folder {path}: {exc.strerror or exc}{move}") from None


def _dir(env_var: str, default: str, create: bool) -> Path:
    override = os.environ.get(env_var, "").strip()  # " " wrote the history to "./ /history.db" of wherever it ran
    path = Path(override).expanduser() if override else Path(default)
    path = path.absolute()
    if create:
        make_dir(path, env_var)
    return path


def config_dir(create: bool = False) -> Path:
    """The user's config directory (``SPECCHAT_CONFIG_DIR`` overrides it)."""
    return _dir("SPECCHAT_CONFIG_DIR", platformdirs.user_config_dir(APP_NAME, appauthor=False), create)


def data_dir(create: bool = False) -> Path:
    """The user's data directory (``SPECCHAT_DATA_DIR`` overrides it)."""
    return _dir("SPECCHAT_DATA_DIR", platformdirs.user_data_dir(APP_NAME, appauthor=False), create)


def cache_dir(create: bool = False) -> Path:
    """The cache directory for downloads and converted models (``SPECCHAT_CACHE_DIR`` overrides it)."""
    return _dir("SPECCHAT_CACHE_DIR", platformdirs.user_cache_dir(APP_NAME, appauthor=False), create)


def state_dir(create: bool = False) -> Path:
    """The user's state directory (``SPECCHAT_STATE_DIR`` overrides it)."""
    return _dir("SPECCHAT_STATE_DIR", platformdirs.user_state_dir(APP_NAME, appauthor=False), create)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (an OSError, or a library's error wrapping one) says the disk or quota is full."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


def disk_full_error(path: Path, what: str, needed: int | None = None) -> StorageError:
    """The one-sentence error for a disk that filled while writing ``what`` to ``path``: where,
    how much it needs (when known) and how much is free now."""
    folder = path.parent
    try:
        import shutil

        free = f"; {_gb(shutil.disk_usage(_existing(folder)).free)} is free there now"
    except OSError:
        free = ""
    need = f" (it needs about {_gb(needed)})" if needed else ""
    return StorageError(
        f"the disk is full: could not write {what} to {folder}{need}{free}; nothing half-written was kept. "
        "Free some space, or move the cache with SPECCHAT_CACHE_DIR, and start again"
    )


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (what disk_usage can ask about)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return path
