"""Shared test setup: one torch thread (tiny models are faster single-threaded
and the suite shares two cores), and every specchat directory in a temp dir."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Config and data dirs in tmp; nothing is written to the real user dirs."""
    for name in ("CONFIG", "DATA"):
        monkeypatch.setenv(f"SPECCHAT_{name}_DIR", str(tmp_path / name.lower()))
    monkeypatch.delenv("SPECCHAT_MODELS", raising=False)
