"""Server profiles' keys: the connection and reply settings taken, model keys refused, --server checked."""
from __future__ import annotations

from typing import Any

import pytest

from engine.config.server import ServerSpec
from engine.config.server_fields import PROFILE_KEYS, parse_server_fields, server_from_options
from engine.errors import ProfileError

WHERE = "profile 'remote' in models.toml"


def no_check(value: Any, key: str, where: str) -> None:
    pass


def test_connection_and_reply_settings_are_split_and_numbers_made_floats() -> None:
    raw = {"backend": "server", "url": "http://h:1/v1", "timeout": 5, "temperature": 1, "top_p": 1, "top_k": 5,
           "system_prompt": "Be brief.", "description": "the box"}
    server, fields = parse_server_fields(raw, WHERE, no_check)
    assert server == ServerSpec("http://h:1/v1", timeout=5.0)
    assert fields == {"description": "the box", "temperature": 1.0, "top_p": 1.0, "top_k": 5,
                      "system_prompt": "Be brief."}
    assert isinstance(fields["temperature"], float) and isinstance(fields["top_k"], int)


def test_only_the_reply_settings_given_are_returned() -> None:
    server, fields = parse_server_fields({"backend": "server", "url": "http://h"}, WHERE, no_check)
    assert fields == {} and server.timeout == 120.0 and server.model is None


def test_each_reply_setting_goes_through_the_type_check() -> None:
    seen: list[tuple[Any, str, str]] = []

    def check(value: Any, key: str, where: str) -> None:
        seen.append((value, key, where))
        if key == "top_k":
            raise ProfileError(f"{where}: {key} must be an integer, got {value!r}")

    raw = {"backend": "server", "url": "http://h", "temperature": 0.5, "top_k": "many", "model": "m"}
    with pytest.raises(ProfileError, match=r"top_k must be an integer, got 'many'"):
        parse_server_fields(raw, WHERE, check)
    assert seen == [(0.5, "temperature", WHERE), ("many", "top_k", WHERE)]  # connection keys are the spec's


@pytest.mark.parametrize("key", ["target", "draft", "drafter", "k", "context_length"])
def test_model_keys_are_refused_with_the_reason_and_the_allowed_keys(key: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_server_fields({"backend": "server", "url": "http://h", key: "x"}, WHERE, no_check)
    assert str(err.value) == (
        f"{WHERE}: {key!r} does not apply to backend = \"server\" (the server chooses the models, the drafter "
        f"and K); allowed keys are {', '.join(PROFILE_KEYS)}"
    )


def test_the_first_unknown_key_in_order_is_named() -> None:
    with pytest.raises(ProfileError, match=r"'drafter' does not apply"):
        parse_server_fields({"url": "http://h", "target": "t", "drafter": "model"}, WHERE, no_check)


def test_a_missing_url_says_how_to_give_one() -> None:
    with pytest.raises(ProfileError) as err:
        parse_server_fields({"backend": "server", "temperature": 0.2}, WHERE, no_check)
    assert str(err.value) == f"{WHERE}: backend = \"server\" needs url = \"http://HOST:PORT\""


def test_server_from_options() -> None:
    spec = server_from_options("http://h:8/v1/", "m", "MY_KEY")
    assert spec == ServerSpec("http://h:8/v1/", "m", "MY_KEY") and spec.root == "http://h:8"
    assert server_from_options("https://box") == ServerSpec("https://box")


@pytest.mark.parametrize("args, message", [
    (("localhost:8080",), "--server: server url must look like http://127.0.0.1:8080, got 'localhost:8080'"),
    (("http://h", " "), "--server: server model must be a non-empty string"),
    (("http://h", None, "sk-1234"), "--api-key-env must name an environment variable (like OPENAI_API_KEY), "
                                    "and what was given is not a variable's name (it is not repeated here"),
])
def test_bad_options_are_named_after_the_flag(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ProfileError) as err:
        server_from_options(*args)
    assert str(err.value).startswith(message)
    assert "sk-1234" not in str(err.value)  # a key given where a variable's name belongs is never printed back
