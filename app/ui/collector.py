"""The UI process's garbage collector while a reply streams: only the reply's own objects are scanned.

CPython's full (oldest-generation) collection walks every object the process
tracks. In the app that is Textual's widgets, styles and caches (100-250k
objects), and a full collection took 125-210 ms of the UI thread, several times
a reply (measured with ``gc.callbacks`` under ``scripts/app_speed.py``, pocket,
120×40 tmux pane). Python's other threads wait for the GIL meanwhile, the
keyboard's among them: an Esc typed during one was read half a second late, and
the CPU it took came out of the engine's two cores.

So when a reply starts, everything alive is frozen (``gc.freeze``: moved to a
generation the collector never scans, at no cost); collections during the reply
then scan only what the reply made. When the reply is over and painted, the
frozen objects are handed back and collected once, while nothing moves on screen
(Textual pauses the collector the same way during smooth scrolls,
``App.PAUSE_GC_ON_SCROLL``).
"""
from __future__ import annotations

import gc
from types import ModuleType


class StreamingCollector:
    """Freezes the heap for a reply's duration (:meth:`reply_started`) and collects it once
    after (:meth:`reply_over`). ``collector``: the :mod:`gc` module (tests pass a recorder)."""

    def __init__(self, collector: ModuleType | object = gc) -> None:
        self._gc = collector
        self.frozen = False

    def reply_started(self) -> None:
        """A reply starts streaming: what exists now is not scanned until it is over."""
        self._gc.freeze()  # type: ignore[attr-defined]
        self.frozen = True

    def reply_over(self) -> None:
        """The reply has ended and its last frame is painted: collect what it and the
        frozen heap left behind, once."""
        if not self.frozen:
            return
        self.frozen = False
        self._gc.unfreeze()  # type: ignore[attr-defined]
        self._gc.collect()  # type: ignore[attr-defined]
