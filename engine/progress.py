"""How long work (a download, a conversion, a load) reports how far it has got."""
from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[str, "float | None"], None]
"""``progress(stage, fraction)``: a human-readable stage ("extracting GGUF",
"loading target weights", ...) and a fraction in [0, 1], or None when unknown."""


def no_progress(stage: str, fraction: float | None) -> None:
    """The default progress callback: says nothing."""
