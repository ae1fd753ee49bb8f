"""huggingface_hub's retry messages as loading progress, not raw text on the terminal.

While the hub is unreachable, ``huggingface_hub`` logs warnings such as
"Retrying in 4s [Retry 3/5]." through its own stderr handler, which writes
straight over the app's screen. :func:`hub_messages_as_progress` routes the
``huggingface_hub`` logger into the loading progress callback for as long as a
load runs, then puts its handlers back.
"""
from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from engine.progress import ProgressFn

_RETRY = re.compile(r"Retrying in (?P<wait>[\d.]+)s \[Retry (?P<n>\d+)/(?P<of>\d+)\]")
_RATE = re.compile(r"Rate limited\. Waiting (?P<wait>[\d.]+)s before retry \[Retry (?P<n>\d+)/(?P<of>\d+)\]")
_LOCK = threading.Lock()


def describe(message: str) -> str | None:
    """A short progress stage for one hub log message (None: not worth showing)."""
    for pattern, what in ((_RETRY, "hub unreachable"), (_RATE, "hub rate limit")):
        m = pattern.search(message)
        if m:
            wait = float(m.group("wait"))
            return f"{what}: retry {m.group('n')} of {m.group('of')} in {wait:g} s"
    if "thrown while requesting" in message:
        return "hub request failed; retrying"
    return None


class _ToProgress(logging.Handler):
    def __init__(self, progress: ProgressFn) -> None:
        super().__init__(logging.WARNING)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stage = describe(record.getMessage())
            if stage is not None:
                self.progress(stage, None)
        except Exception:  # noqa: BLE001 - logging must never break a load
            self.handleError(record)


@contextmanager
def hub_messages_as_progress(progress: ProgressFn) -> Iterator[None]:
    """Inside the block, the hub's warnings go to ``progress`` and nowhere else."""
    logger = logging.getLogger("huggingface_hub")
    handler = _ToProgress(progress)
    with _LOCK:
        saved = (list(logger.handlers), logger.propagate)
        logger.handlers = [handler]
        logger.propagate = False
    try:
        yield
    finally:
        with _LOCK:
            logger.handlers, logger.propagate = saved


def quiet_transformers() -> None:
    """Silence transformers' own tqdm bars and info logs: specchat reports loading
    progress itself (a stderr line, the app's HUD, or messages from the engine's
    child process), which raw bars written to the terminal would garble."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:  # its GGUF reader draws tqdm's own bar, which disable_progress_bar does not reach
        import transformers.modeling_gguf_pytorch_utils as gguf_reader
    except ImportError:
        return
    from functools import partial

    from tqdm.auto import tqdm

    gguf_reader.tqdm = partial(tqdm, disable=True)  # type: ignore[attr-defined]
