"""``backend = "server"`` profiles in models.toml: keys, checks, and the shipped one."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.errors import EngineError, ProfileError
from engine.config.models_file import load_profiles
from engine.config.server import ServerSpec, redact_url


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(body, encoding="utf-8")
    return path


def test_shipped_server_profile() -> None:
    p = load_profiles().get("llama-server")
    assert p.backend == "server" and p.server is not None
    assert p.server.url == "http://127.0.0.1:8080" and p.server.api_key_env is None and p.server.model is None


def test_server_profile_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, '[profiles.remote]\nbackend = "server"\nurl = "https://gpu-box:8000/v1"\n'
                           'model = "Qwen/Qwen2.5-7B-Instruct"\napi_key_env = "VLLM_KEY"\ntimeout = 30\n'
                           'temperature = 0.7\nsystem_prompt = "Be brief."\n')
    p = load_profiles(path).get("remote")
    assert p.server == ServerSpec("https://gpu-box:8000/v1", "Qwen/Qwen2.5-7B-Instruct", "VLLM_KEY", 30.0)
    assert p.server.root == "https://gpu-box:8000" and p.temperature == 0.7 and p.system_prompt == "Be brief."
    assert p.source_file == path
    monkeypatch.setenv("VLLM_KEY", "abc")
    assert p.server.api_key() == "abc"
    monkeypatch.delenv("VLLM_KEY")
    with pytest.raises(EngineError, match=r"export VLLM_KEY="):
        p.server.api_key()


@pytest.mark.parametrize("body, words", [
    ('backend = "server"\n', "needs url"),
    ('backend = "server"\nurl = "localhost:8080"\n', "must look like http://"),
    ('backend = "server"\nurl = "http://h:99999"\n', "invalid port"),
    ('backend = "server"\nurl = "http://h"\napi_key_env = "sk-1234-secret"\n', "never put the key itself"),
    ('backend = "server"\nurl = "http://h"\napi_key_env = 998877665544\n', "api_key_env must be a string"),
    ('backend = "server"\nurl = "http://h"\ntimeout = -1\n', "positive number of seconds"),
    ('backend = "server"\nurl = "http://h"\ndrafter = "model"\n', "'drafter' does not apply to backend"),
    ('backend = "server"\nurl = "http://h"\ntemperature = "hot"\n', "temperature must be a number"),
    ('backend = "cloud"\ntarget = "x"\ndrafter = "none"\n', "backend must be \"local\""),
])
def test_bad_server_profiles_say_what_to_fix(tmp_path: Path, body: str, words: str) -> None:
    path = write(tmp_path, "[profiles.remote]\n" + body)
    with pytest.raises(ProfileError) as err:  # left out when read; its reason when asked for
        load_profiles(path).get("remote")
    assert words in str(err.value) and "remote" in str(err.value)
    assert "secret" not in str(err.value) and "998877665544" not in str(err.value)


def test_local_backend_may_be_named(tmp_path: Path) -> None:
    path = write(tmp_path, '[profiles.loc]\nbackend = "local"\ntarget = "org/m"\ndrafter = "ngram"\n')
    p = load_profiles(path).get("loc")
    assert p.backend == "local" and p.server is None


@pytest.mark.parametrize("url", ["http://alice:s3cret@[::1", "http://alice:s3cret@[zz]:80"])
def test_a_malformed_url_with_a_password_is_a_profile_error_that_hides_it(url: str) -> None:
    """urlsplit's ValueError ("Invalid IPv6 URL") came out of generate as a traceback."""
    with pytest.raises(ProfileError) as err:
        ServerSpec(url)
    assert "s3cret" not in str(err.value) and "alice:***@" in str(err.value)


def test_a_password_in_a_url_without_its_scheme_is_hidden_too() -> None:
    assert redact_url("alice:s3cret@127.0.0.1:9") == "alice:***@127.0.0.1:9"
    with pytest.raises(ProfileError) as err:
        ServerSpec("alice:s3cret@127.0.0.1:9")  # printed as given: 'alice:s3cret@127.0.0.1:9'
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize("url, words", [
    ("http://127.0.0.1:8080/\x1b]0;x\x07", "holds a space or a control character"),
    ("http://127.0.0.1:8080/v1 x", "holds a space or a control character"),
    ("http://127.0.0.1:8080/v1?key=abc", "has a ?query or #fragment, which specchat cannot send"),
    ("http://127.0.0.1:8080/#top", "has a ?query or #fragment, which specchat cannot send"),
])
def test_a_url_no_request_can_carry_is_refused_up_front(url: str, words: str) -> None:
    """An ESC in the URL was blamed on the server ("closed the connection without an answer
    (InvalidURL)"), and a ?query was dropped in silence (a tester)."""
    with pytest.raises(ProfileError, match=re.escape(words)):
        ServerSpec(url)
