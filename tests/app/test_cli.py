"""The command line: generate's JSON, profiles, and errors printed without a traceback."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from tests.engine.tinymodels import save_tiny


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    return save_tiny(root / "target", seed=1), save_tiny(root / "draft", seed=1)


def generate(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["generate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_shape_and_modes(pair, capsys) -> None:
    target, draft = pair
    common = ["w1 w2 w3", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "12", "--k", "3"]
    spec = generate(capsys, *common)
    plain = generate(capsys, *common, "--mode", "plain")
    assert set(spec) == {"profile", "text", "token_ids", "stats"}
    for key in ("alpha", "tau", "k", "proposed", "accepted", "tokens_per_s", "speedup", "mode", "plan"):
        assert key in spec["stats"]
    assert spec["stats"]["mode"] == "spec" and plain["stats"]["mode"] == "plain"
    assert spec["stats"]["proposed"] > 0 and plain["stats"]["proposed"] == 0
    assert spec["token_ids"] == plain["token_ids"]  # greedy: identical to the target alone
    assert 0 < len(spec["token_ids"]) <= 12
    ngram = generate(capsys, *common, "--mode", "ngram")
    assert ngram["stats"]["mode"] == "ngram" and ngram["token_ids"] == plain["token_ids"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "hi", "--temperature", "-1"], "temperature must be >= 0"),
        (["generate", "hi", "--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
        (["generate", "hi", "--draft", "/x"], "--draft needs --target"),
        (["generate", "hi", "--profile", "nope"], "known profiles are"),
        (["generate", "hi", "--target", "/no/such/model"], "/no/such/model"),
        (["generate", "hi", "--memory-budget", "lots"], "invalid size 'lots'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: ") and message in err
    assert "Traceback" not in err


def test_profiles_json_lists_the_shipped_default(capsys) -> None:
    assert main(["profiles", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["default"] == "pocket"
    names = {p["name"] for p in out["profiles"]}
    assert {"pocket", "pocket-selfdraft", "qwen2.5-7b"} <= names
