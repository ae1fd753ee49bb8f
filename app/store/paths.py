"""Where the app keeps its files.

:func:`engine.paths.data_dir` is the one rule (platformdirs "specchat",
overridable with ``SPECCHAT_DATA_DIR``); this module adds what the app needs
on top of it: the directories it makes readable by their owner only.
"""
from __future__ import annotations

import os
from pathlib import Path

from engine.paths import data_dir

__all__ = ["data_dir", "ensure_private_dir"]


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents), readable by its owner only (0700) when this call made it.
    A folder that was there keeps its mode: ``SPECCHAT_DATA_DIR`` may name a shared one (a
    tester's 1777 folder lost its sticky bit and everyone else's access), and the files
    specchat writes in it are 0600 of their own. A file in the way is an OSError naming it
    ("… is a file, not a folder"), not "File exists"."""
    made = not path.is_dir()
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise OSError(f"{blocker} is a file, not a folder; move or delete that file, "
                      "or set SPECCHAT_DATA_DIR to another folder") from None
    if made:
        os.chmod(path, 0o700)  # mkdir's mode passes through the umask; this does not
    return path
