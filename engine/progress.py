"""How long work (a download, a conversion, a load) reports how far it has got."""
from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

ProgressFn = Callable[[str, "float | None"], None]
"""``progress(stage, fraction)``: a human-readable stage ("extracting GGUF",
"loading target weights", ...) and a fraction in [0, 1], or None when unknown."""


def no_progress(stage: str, fraction: float | None) -> None:
    """The default progress callback: says nothing."""


class Steps:
    """Countable work (layers packed of a model's), counted by whoever does it: call it with
    ``(done, total)``; :func:`ticking` reads it from its own thread."""

    def __init__(self, what: str = "layers") -> None:
        self.what = what
        self.done = 0
        self.total = 0

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total


ETA_AFTER_S = 2.0
"""Steps counted for less than this give no time left yet (the first ones say little)."""


def elapsed(seconds: float) -> str:
    """``"37 s"``, ``"2 min 5 s"``."""
    whole = int(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"


@contextlib.contextmanager
def ticking(progress: ProgressFn, stage: str, start: float, measure: Callable[[], int] | None = None,
            total: int | None = None, end: float | None = None, every_s: float = 0.5,
            steps: Steps | None = None) -> Iterator[None]:
    """Report ``stage`` every ``every_s`` while the body runs, with the time it has taken so far:
    bytes done of ``total`` (``measure``) or ``steps`` done of theirs (with the time left), and
    the fraction between ``start`` and ``end`` when there is an ``end``; with nothing to count,
    the fraction is None (a bar that moves without claiming a share done)."""
    stop = threading.Event()
    began = time.perf_counter()
    counting: list[tuple[float, int]] = []  # when the steps were first seen, and how many were done then

    def tick() -> None:
        while not stop.wait(every_s):
            now = time.perf_counter()
            took = now - began
            if measure is not None and total and end is not None:
                done = min(measure(), total)
                progress(f"{stage}: {done / 1e6:.1f} of {total / 1e6:.1f} MB, {elapsed(took)}",
                         start + (end - start) * done / total)
            elif steps is not None and steps.total:
                done, of = min(steps.done, steps.total), steps.total
                if not counting:
                    counting.append((now, done))
                (since, first), left = counting[0], ""
                if done > first and now - since >= ETA_AFTER_S and done < of:  # the rate of the steps alone
                    left = f", {time_left((now - since) * (of - done) / (done - first))} left"
                progress(f"{stage}: {done} of {of} {steps.what}, {elapsed(took)}{left}",
                         start + (end - start) * done / of if end is not None else None)
            else:
                progress(f"{stage}: {elapsed(took)}", None)

    thread = threading.Thread(target=tick, name="progress-ticker", daemon=True)
    progress(stage, start)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@dataclass(frozen=True)
class Download:
    """One model a load downloads: its name as people know it, how many wheels it comes
    in, and the size its profile declares (``download_size``; None when not given)."""

    name: str
    parts: int = 1
    declared: int | None = None


class DownloadMeter:
    """One bar over everything a load downloads, however many wheels it spans.

    Reports ``"downloading NAME: 412 of 1,630 MB, 9.8 MB/s, about 2 min left"`` with the
    fraction of bytes done, where NAME is the model (not the wheel) and the bytes are
    those of every model in ``downloads``. The total is known before the first byte: the
    sizes the profile declares, corrected by each wheel's own size (its Content-Length) as
    its download starts; unknown wheels of a model count as the mean of its known ones.
    Bytes done never go down, and wheels already in the cache count as done (but not
    towards the speed). Reports come at most every ``every_s`` and when a wheel completes.
    """

    def __init__(self, progress: ProgressFn, downloads: Sequence[Download], *,
                 clock: Callable[[], float] = time.monotonic, every_s: float = 0.25) -> None:
        self.progress = progress
        self.downloads = list(downloads)
        self.clock = clock
        self.every_s = every_s
        self._done: dict[tuple[str, str], int] = {}
        self._size: dict[tuple[str, str], int] = {}
        self._fresh = 0
        """Bytes downloaded by this meter (not found in the cache): what the speed counts."""
        self._samples: deque[tuple[float, int]] = deque()
        self._last_report = -float("inf")
        self._current: str | None = None
        self._lock = threading.Lock()

    def model(self, name: str, parts: int = 1, declared: int | None = None) -> None:
        """The download of model ``name`` begins (added to the bar if it was not listed): reported
        at once, with the total as far as it is known."""
        with self._lock:
            if all(d.name != name for d in self.downloads):
                self.downloads.append(Download(name, parts, declared))
            self._current = name
            self._last_report = self.clock()
            stage, fraction = self._report(name)
        self.progress(stage, fraction)

    def wheel(self, key: str, done: int, total: int | None, cached: bool = False) -> None:
        """Wheel ``key`` of the current model has ``done`` of ``total`` bytes (pip's count, or the
        file's size once it is on disk; ``cached``: it was there already)."""
        now = self.clock()
        with self._lock:
            name = self._current or ""
            slot = (name, key)
            before = self._done.get(slot, 0)
            if total:
                self._size[slot] = total
            if done > before:
                self._done[slot] = done
                if not cached:
                    self._fresh += done - before
            self._samples.append((now, self._fresh))
            while len(self._samples) > 2 and now - self._samples[0][0] > SPEED_WINDOW_S:
                self._samples.popleft()
            finished = total is not None and total > 0 and done >= total
            if not finished and now - self._last_report < self.every_s:
                return
            self._last_report = now
            stage, fraction = self._report(name)
        self.progress(stage, fraction)

    def done_bytes(self) -> int:
        """Bytes of every wheel on disk so far (never less than an earlier answer)."""
        return sum(self._done.values())

    def total_bytes(self) -> int | None:
        """The bytes all the models come to, as well as they are known now (None: unknown)."""
        total = 0
        for d in self.downloads:
            sizes = [s for (name, _), s in self._size.items() if name == d.name]
            if len(sizes) >= d.parts:
                total += sum(sizes)
                continue
            guess = sum(sizes) + (d.parts - len(sizes)) * (sum(sizes) // len(sizes)) if sizes else 0
            if d.declared is None and not sizes:
                return None
            total += max(guess, d.declared or 0)
        return max(total, self.done_bytes())

    def speed(self) -> float | None:
        """Bytes per second over the last :data:`SPEED_WINDOW_S` (None before a second of it)."""
        if len(self._samples) < 2:
            return None
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 - t0 >= 1.0 else None

    def _report(self, name: str) -> tuple[str, float | None]:
        done, total, speed = self.done_bytes(), self.total_bytes(), self.speed()
        which = ""
        if len(self.downloads) > 1:
            index = next((i for i, d in enumerate(self.downloads) if d.name == name), 0)
            which = f" (model {index + 1} of {len(self.downloads)})"
        big = (total or done) >= 100e6
        amount = f": {mb(done, big)} of {mb(total, big)} MB" if total else (f": {mb(done, big)} MB" if done else "")
        text = [f"downloading {name}{which}{amount}"]
        if speed is not None:
            text.append(f"{speed / 1e6:.1f} MB/s")
            if total and speed > 0 and done < total:
                text.append(f"{time_left((total - done) / speed)} left")
        return ", ".join(text), (done / total if total else None)


SPEED_WINDOW_S = 10.0
"""The download speed is measured over this many seconds, so it follows a changing line."""


def mb(n: int, whole: bool) -> str:
    """Bytes as decimal megabytes: ``1_630_000_000 -> "1,630"`` (``whole``), ``2_500_000 -> "2.5"``."""
    return f"{n / 1e6:,.0f}" if whole else f"{n / 1e6:,.1f}"


def time_left(seconds: float) -> str:
    """``"about 7 s"``, ``"about 40 s"``, ``"about 2 min"``, ``"about 1 h 5 min"``."""
    if seconds < 10:
        return f"about {max(1, round(seconds))} s"
    if round(seconds / 5) * 5 < 60:
        return f"about {round(seconds / 5) * 5} s"
    minutes = max(1, round(seconds / 60))
    return f"about {minutes} min" if minutes < 60 else f"about {minutes // 60} h {minutes % 60} min"


def model_name(source: str) -> str:
    """The name a GGUF is known by, from its file name: ``Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf``
    and ``wheel:...//SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``Qwen2.5-Coder-1.5B-Instruct Q4_K_M``,
    ``SmolLM2-135M-Instruct Q4_1``."""
    name = source.rstrip("/").rsplit("/", 1)[-1]
    if name.lower().endswith(".gguf"):
        name = name[: -len(".gguf")]
    m = re.fullmatch(r"(?P<base>.+?)[.-](?P<quant>(?i:I?Q\d\w*|F16|F32|BF16))", name)
    return f"{m['base']} {m['quant']}" if m else name
