"""The engine child's log, on the parent's side: whether it can be written, and where a crash left its report.

The child writes it (:func:`engine.child.serve._redirect_output`), and keeps the last engine's as
``<log>.1`` as it starts.
"""
from __future__ import annotations

import os
from pathlib import Path


def writable_log(log: Path | None) -> tuple[Path | None, str | None]:
    """``log`` if its folder can be made and the file written, else the null device and why: a
    state folder that was read-only (or a file) ended every engine at its start, the app's every
    load failing with "the engine process exited (code 1)" (a hostile tester's)."""
    if log is None:
        return None, None
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        return Path(os.devnull), (f"the engine's log cannot be written to {log} ({exc.strerror or exc}): it runs "
                                  "without one. Make that folder writable, or set SPECCHAT_STATE_DIR to one that is.")
    return log, None


def crash_report(log: Path | None) -> str:
    """Where a crashed child's report is, for its error (its faulthandler wrote the stacks to ``log``: see
    :func:`engine.child.serve.serve`); nothing without a log."""
    if log is None:
        return ""
    return f"; its crash report is in {log} (kept as {log.name}.1 once an engine is loaded again)"
