"""Fixtures for the app tests: temp dirs for all of specchat's paths, fakes, a pilot helper."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import app.store.history as history_module
import app.store.saver as saver_module
from app.ui.app import SpecChatApp
from tests.app.fakes import FakeLoader, make_profiles


@pytest.fixture(autouse=True)
def specchat_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every specchat directory at tmp_path; returns the data dir."""
    data = tmp_path / "data"
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(data))
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECCHAT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr("app.ui.clipboard.desktop_copy", lambda text: None)  # never the developer's clipboard
    return data


@pytest.fixture
def loader() -> FakeLoader:
    return FakeLoader()


@pytest.fixture
def make_app(loader: FakeLoader) -> Callable[..., SpecChatApp]:
    def make(**kwargs: object) -> SpecChatApp:
        kwargs.setdefault("loader", loader)
        kwargs.setdefault("profiles_loader", make_profiles)
        return SpecChatApp(**kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio (Textual's loop) through anyio's pytest plugin."""
    return "asyncio"


@pytest.fixture
def short_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """History locks time out in a fraction of a second, and the saver retries quickly."""
    monkeypatch.setattr(history_module, "BUSY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(history_module, "OPEN_ATTEMPTS", 2)
    monkeypatch.setattr(saver_module, "BACKOFF_S", (0.05, 0.2))
