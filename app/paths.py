"""Where the app keeps its files, with a fallback while ``engine.paths`` is absent.

``engine.paths.data_dir`` is the source of truth (platformdirs "specchat",
overridable with ``SPECCHAT_DATA_DIR``). This module only forwards to it and,
should it not be importable, applies the same rule itself so the app still runs.
"""
from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """The directory for history.db and exports (not created here)."""
    try:
        from engine.paths import data_dir as engine_data_dir
    except ImportError:  # pragma: no cover - only before engine.paths lands
        override = os.environ.get("SPECCHAT_DATA_DIR")
        if override:
            return Path(override).expanduser()
        import platformdirs

        return Path(platformdirs.user_data_dir("specchat"))
    return Path(engine_data_dir())


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it readable by its owner only (0700)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path
