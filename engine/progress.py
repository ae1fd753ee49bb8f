"""How long work (a download, a conversion, a load) reports how far it has got."""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

ProgressFn = Callable[[str, "float | None"], None]
"""``progress(stage, fraction)``: a human-readable stage ("extracting GGUF",
"loading target weights", ...) and a fraction in [0, 1], or None when unknown."""


def no_progress(stage: str, fraction: float | None) -> None:
    """The default progress callback: says nothing."""


@contextlib.contextmanager
def ticking(progress: ProgressFn, stage: str, start: float, measure: Callable[[], int] | None = None,
            total: int | None = None, end: float | None = None, every_s: float = 0.5) -> Iterator[None]:
    """Report ``stage`` every ``every_s`` while the body runs: bytes done and the fraction between
    ``start`` and ``end`` when ``measure``/``total`` are given, else the seconds it has taken."""
    stop = threading.Event()
    began = time.perf_counter()

    def tick() -> None:
        while not stop.wait(every_s):
            if measure is not None and total and end is not None:
                done = min(measure(), total)
                progress(f"{stage}: {done / 1e6:.1f} of {total / 1e6:.1f} MB", start + (end - start) * done / total)
            else:
                progress(f"{stage}: {time.perf_counter() - began:.0f} s", start)

    thread = threading.Thread(target=tick, name="progress-ticker", daemon=True)
    progress(stage, start)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
