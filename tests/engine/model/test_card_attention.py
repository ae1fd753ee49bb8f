"""Runs card_attention_interpreted.py (the card's fused attention kernel under Triton's
interpreter) in a process started with ``TRITON_INTERPRET=1``: Triton decides at import whether
it interprets, and this process may have imported it already."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def interpreter_runs_it() -> str | None:
    """Why Triton's interpreter here cannot run the kernel (None: it can)."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install -e '.[test]' brings it)"
    from importlib.metadata import version

    major, minor = (int(x) for x in version("triton").split(".")[:2])
    if (major, minor) < (3, 9):  # its interpreter made an int of a 1-element array: numpy 2.3 refuses
        return f"Triton {version('triton')}'s interpreter (3.9 or newer runs it)"
    return None


@pytest.mark.skipif(interpreter_runs_it() is not None, reason=str(interpreter_runs_it()))
def test_the_fused_kernel_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("SPECCHAT_CARD_ATTENTION", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(HERE / "card_attention_interpreted.py")], cwd=HERE.parents[2], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
