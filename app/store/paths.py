"""Where the app keeps its files.

:func:`engine.paths.data_dir` is the one rule (platformdirs "specchat",
overridable with ``SPECCHAT_DATA_DIR``); this module adds what the app needs
on top of it: directories readable by their owner only.
"""
from __future__ import annotations

import os
from pathlib import Path

from engine.paths import data_dir

__all__ = ["data_dir", "ensure_private_dir"]


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it readable by its owner only (0700). A file in
    the way is an OSError naming it ("… is a file, not a folder"), not "File exists"."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise OSError(f"{blocker} is a file, not a folder; move or delete that file, "
                      "or set SPECCHAT_DATA_DIR to another folder") from None
    os.chmod(path, 0o700)
    return path
