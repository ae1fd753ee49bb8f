"""Where specchat keeps its files: each directory from platformdirs unless its variable moves it."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import platformdirs
import pytest

from engine import paths

DIRS: list[tuple[Callable[..., Path], str, Callable[..., str]]] = [
    (paths.config_dir, "SPECCHAT_CONFIG_DIR", platformdirs.user_config_dir),
    (paths.data_dir, "SPECCHAT_DATA_DIR", platformdirs.user_data_dir),
    (paths.cache_dir, "SPECCHAT_CACHE_DIR", platformdirs.user_cache_dir),
    (paths.state_dir, "SPECCHAT_STATE_DIR", platformdirs.user_state_dir),
]
IDS = ["config", "data", "cache", "state"]


@pytest.mark.parametrize("get, var, default", DIRS, ids=IDS)
def test_the_variable_moves_the_directory_and_create_makes_it(
    get: Callable[..., Path], var: str, default: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(var, str(tmp_path / "moved" / "here"))
    assert get() == tmp_path / "moved" / "here"
    assert not (tmp_path / "moved").exists()  # asking does not create it
    assert get(create=True) == tmp_path / "moved" / "here"
    assert (tmp_path / "moved" / "here").is_dir()
    assert get(create=True) == tmp_path / "moved" / "here"  # a second time is fine


@pytest.mark.parametrize("get, var, default", DIRS, ids=IDS)
def test_unset_or_empty_gives_the_platform_directory(
    get: Callable[..., Path], var: str, default: Callable[..., str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected = Path(default("specchat", appauthor=False)).absolute()
    monkeypatch.delenv(var, raising=False)
    assert get() == expected and expected.name == "specchat"
    monkeypatch.setenv(var, "")
    assert get() == expected
    monkeypatch.setenv(var, "  ")  # it wrote the history to "./ /history.db" of the folder it ran in
    assert get() == expected
    monkeypatch.setenv(var, " /srv/specchat\n")
    assert get() == Path("/srv/specchat")


def test_a_relative_override_is_made_absolute_and_home_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", "rel/cache")
    assert paths.cache_dir() == tmp_path / "rel" / "cache"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECCHAT_DATA_DIR", "~/specchat-data")
    assert paths.data_dir() == tmp_path / "home" / "specchat-data"


def test_a_cache_folder_that_is_a_file_is_one_sentence_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.errors import StorageError

    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(blocker))
    with pytest.raises(StorageError) as err:
        paths.cache_dir(create=True)
    assert str(err.value) == (f"cannot make the folder {blocker}: {blocker} is a file, not a folder; "
                              "move or delete that file, or set SPECCHAT_CACHE_DIR to another folder")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(blocker / "below"))  # a parent on the way is a file
    with pytest.raises(StorageError, match=f"{blocker} is a file, not a folder"):
        paths.cache_dir(create=True)
    assert blocker.read_text() == "not a folder"  # nothing lost


def test_a_cache_subfolder_blocked_by_a_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from engine.errors import StorageError
    from engine.quant import quantize_weight
    from engine.quant.cache import _save

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "int4").write_text("in the way")
    with pytest.raises(StorageError, match=f"{tmp_path / 'cache' / 'int4'} is a file, not a folder"):
        _save(tmp_path / "cache" / "int4" / "m-0123456789abcdef-g32.safetensors",
              {"layer": quantize_weight(torch.randn(16, 32), 32)}, [])


def test_the_cli_says_the_cache_folder_is_a_file_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main

    (tmp_path / "cache").write_text("")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["profiles"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: cannot make the folder ") and "is a file, not a folder" in err
    assert len(err.strip().splitlines()) == 1
