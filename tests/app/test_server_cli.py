"""``--server URL`` on the command line: the options that go with it, and how a command connects."""
from __future__ import annotations

import argparse
from typing import Any

import pytest

from app.server_cli import load_server, server_profile_from_args
from engine.config.profiles import profile_from_server
from engine.errors import SpecChatError


def args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**kw)


def test_no_server_no_profile() -> None:
    assert server_profile_from_args(args()) is None
    assert server_profile_from_args(args(server=None, server_model=None, api_key_env=None, target="x")) is None


@pytest.mark.parametrize("kw", [dict(server_model="m"), dict(api_key_env="KEY")])
def test_server_options_need_a_server(kw: dict[str, str]) -> None:
    with pytest.raises(SpecChatError, match="^--server-model and --api-key-env need --server URL$"):
        server_profile_from_args(args(**kw))


@pytest.mark.parametrize("kw", [dict(target="x.gguf"), dict(draft="d")])
def test_a_server_has_its_own_models(kw: dict[str, str]) -> None:
    with pytest.raises(SpecChatError, match="--server and --target/--draft exclude each other"):
        server_profile_from_args(args(server="http://127.0.0.1:8080", **kw))


def test_the_server_profile_carries_the_model_and_key_variable() -> None:
    profile = server_profile_from_args(args(server="http://127.0.0.1:8080/v1", server_model="smol", api_key_env="KEY"))
    assert profile == profile_from_server("http://127.0.0.1:8080/v1", "smol", "KEY")
    assert profile is not None and profile.backend == "server"


class Connected:
    def __init__(self) -> None:
        self.speculation: list[bool] = []

    def set_speculation(self, enabled: bool) -> None:
        self.speculation.append(enabled)


def test_connecting_asks_for_plain_decoding_only_in_plain_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Connected] = []

    def connect(profile: Any, progress: Any) -> Connected:
        made.append(Connected())
        return made[-1]

    monkeypatch.setattr("engine.remote.connect", connect)
    profile = profile_from_server("http://127.0.0.1:8080")
    assert load_server(profile, "spec", lambda s, f: None) is made[0] and made[0].speculation == []
    assert load_server(profile, "plain", lambda s, f: None) is made[1] and made[1].speculation == [False]


@pytest.mark.parametrize("mode", ["ngram", "suffix"])
def test_local_drafters_are_refused_before_connecting(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setattr("engine.remote.connect", lambda *a: pytest.fail("connected"))
    with pytest.raises(SpecChatError, match="the server decides how it drafts: use --mode spec, or --mode plain"):
        load_server(profile_from_server("http://127.0.0.1:8080"), mode, lambda s, f: None)
