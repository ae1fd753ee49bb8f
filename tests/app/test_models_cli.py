"""What every model-loading command shares: its options, the profile they name, loading it, reply settings, progress."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from app.models_cli import add_model_options, generation_params, load_for, resolve_profile, stderr_progress
from engine.config.profiles import ModelSpec, profile_from_server, profile_from_sources
from engine.errors import SpecChatError
from tests.app.fakes import make_profiles

MODEL_OPTIONS = ("profile", "models", "memory_budget", "target", "draft", "server", "server_model", "api_key_env")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser()
    add_model_options(top, subcommand=False)
    sub = top.add_subparsers(dest="command")
    add_model_options(sub.add_parser("generate"))
    return top


def test_options_before_the_subcommand_are_kept_and_unset_ones_are_none() -> None:
    args = parser().parse_args(["--profile", "fast", "generate", "--memory-budget", "2GiB"])
    assert args.profile == "fast" and args.memory_budget == 2 * 2**30  # read as bytes by the option's type
    assert all(getattr(args, name) is None for name in MODEL_OPTIONS if name not in ("profile", "memory_budget"))
    assert parser().parse_args(["generate", "--profile", "lookup"]).profile == "lookup"
    assert isinstance(parser().parse_args(["--models", "m.toml"]).models, Path)


@pytest.mark.parametrize("option", ["--target", "--draft", "--server", "--server-model", "--api-key-env"])
@pytest.mark.parametrize("before", [True, False])
def test_an_empty_value_is_refused_naming_the_option(option: str, before: bool,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``generate hi --target ""`` (or ``--server ""``, ``--draft ""``) read as "not given": the
    default profile answered, exit 0 (a hostile tester's)."""
    for value in ("", "  "):
        argv = [option, value, "generate"] if before else ["generate", option, value]
        with pytest.raises(SystemExit) as stop:
            parser().parse_args(argv)
        assert stop.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"error: argument {option}: is empty: give " in last and last.endswith("or leave the option out")


def options(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**{name: None for name in MODEL_OPTIONS}, **kw})


def test_a_profile_by_name_from_the_models_files() -> None:
    assert resolve_profile(options()).name == "pocket"  # the shipped default
    assert resolve_profile(options(profile="pocket-selfdraft")).drafter == "model"


def test_target_and_draft_make_a_profile_on_the_fly_with_a_budget() -> None:
    profile = resolve_profile(options(target="org/t", draft="org/d", memory_budget=2 * 2**30))  # as the option reads it
    assert profile.name == "cli" and profile.draft == ModelSpec("org/d") and profile.memory_budget == 2 * 2**30
    with pytest.raises(SpecChatError, match="--draft needs --target"):
        resolve_profile(options(draft="org/d"))


def test_server_options_make_a_server_profile() -> None:
    profile = resolve_profile(options(server="http://127.0.0.1:8080", server_model="smol"))
    assert profile == profile_from_server("http://127.0.0.1:8080", "smol")


class Loaded:
    def __init__(self, profile: Any, memory_budget: int | None) -> None:
        self.profile, self.memory_budget = profile, memory_budget


@pytest.mark.parametrize("mode, drafter", [("spec", "model"), ("ngram", "ngram"), ("suffix", "suffix"),
                                           ("plain", "none")])
def test_the_mode_replaces_the_drafter(mode: str, drafter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.load.loader.load_engine",
                        lambda profile, memory_budget, progress: Loaded(profile, memory_budget))
    profile = profile_from_sources("org/t", "org/d")
    loaded = load_for(profile, mode)
    assert isinstance(loaded, Loaded) and loaded.profile.drafter == drafter
    assert (loaded.profile.draft is not None) == (mode == "spec")


def test_a_server_profile_connects_instead_of_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr("app.models_cli.load_server",
                        lambda profile, mode, progress: calls.append((profile.name, mode)))
    monkeypatch.setattr("engine.load.loader.load_engine", lambda *a, **k: pytest.fail("loaded local models"))
    load_for(profile_from_server("http://127.0.0.1:8080"), "plain")
    assert calls == [(profile_from_server("http://127.0.0.1:8080").name, "plain")]


def reply_options(**kw: Any) -> argparse.Namespace:
    base = dict(max_new_tokens=64, temperature=None, top_p=None, top_k=None, seed=None, k=None)
    return argparse.Namespace(**{**base, **kw})


def test_reply_settings_from_the_options_else_the_profile() -> None:
    lookup = make_profiles().get("lookup")
    params = generation_params(reply_options(), lookup)
    assert params.max_new_tokens == 64 and params.k == 4
    assert generation_params(reply_options(k=2, temperature=0.0), lookup).k == 2
    with pytest.raises(SpecChatError) as err:
        generation_params(reply_options(top_p=2.0), lookup)
    assert str(err.value).startswith("top_p must be in (0, 1]")
    assert str(err.value).endswith(" (check the options, or the profile's sampling keys)")


def test_progress_goes_to_stderr_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    stderr_progress("loading target weights", 0.5)
    stderr_progress("reading config", None)
    out, err = capsys.readouterr()
    assert out == "" and err == "\r\033[Kloading target weights  50%\r\033[Kreading config"


def test_progress_shows_a_stages_escapes_inert(capsys: pytest.CaptureFixture[str]) -> None:
    stderr_progress("connecting to \x1b]0;pwned\x07", None)
    assert capsys.readouterr().err == "\r\033[Kconnecting to ␛]0;pwned␇"
