"""The command line with hostile text: a server's reply and errors, profile names from a
models file, credentials in a URL. What is printed is shown, never obeyed; no secret is printed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from engine.text_safety import inert
from tests.fake_server import FakeServer, llama_routes, models_route, reply_stream, send_json, start_sse, write_events
from tests.hostile import ALL, HOSTILE, raw_in

PIECES = ["Hi ", *HOSTILE.values(), " end"]


def talker(req, body):  # type: ignore[no-untyped-def]
    start_sse(req)
    write_events(req, reply_stream(PIECES))


def test_generates_text_output_shows_the_servers_escapes_inert(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(llama_routes(talker)) as fake:
        assert main(["generate", "hi", "--server", fake.url]) == 0
    out = capsys.readouterr()
    assert raw_in(out.out) == [] and raw_in(out.err) == []
    assert out.out == inert("".join(PIECES)) + "\n"
    assert "␛]52;c;cm0gLXJmIH4=␇" in out.out and "<U+009B>2J" in out.out


def test_generates_json_keeps_the_exact_text_as_json_escapes(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(llama_routes(talker)) as fake:
        assert main(["generate", "hi", "--server", fake.url, "--json"]) == 0
    out = capsys.readouterr().out
    assert raw_in(out) == []  # the C1 ones too, which json.dumps leaves raw
    assert json.loads(out)["text"] == "".join(PIECES)
    assert "\\u001b]52;c;cm0gLXJmIH4=\\u0007" in out and "\\u009b2J" in out


def test_a_servers_error_body_is_printed_inert(capsys: pytest.CaptureFixture[str]) -> None:
    def fail(req, body):  # type: ignore[no-untyped-def]
        send_json(req, 500, {"error": {"message": "boom" + ALL}})

    with FakeServer(llama_routes(fail)) as fake:
        assert main(["generate", "hi", "--server", fake.url]) == 2
    err = capsys.readouterr().err
    assert raw_in(err) == [] and "boom<osc0-title>␛]0;pwned␇" in err


def test_profile_names_and_paths_from_a_models_file_are_printed_inert(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = tmp_path / "models.toml"
    evil = "evil\\u001b]52;c;cm0gLXJmIH4=\\u0007\\u009b2J"
    models.write_text(f'[profiles."{evil}"]\ntarget = "org/m{evil}"\ndrafter = "ngram"\n'
                      f'description = "d{evil}"\n', encoding="utf-8")
    assert main(["profiles", "--models", str(models)]) == 0
    out = capsys.readouterr().out
    assert raw_in(out) == [] and "evil␛]52;c;cm0gLXJmIH4=␇<U+009B>2J" in out
    assert main(["profiles", "--models", str(models), "--json"]) == 0
    out = capsys.readouterr().out
    assert raw_in(out) == [] and any(p["name"].startswith("evil\x1b]52") for p in json.loads(out)["profiles"])


def test_a_key_given_as_the_variables_name_is_refused_unprinted(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hi", "--server", "http://127.0.0.1:9", "--api-key-env", "sk-live-abc123"]) == 2
    err = capsys.readouterr().err
    assert "sk-live-abc123" not in err and "--api-key-env must name an environment variable" in err


def test_a_key_shaped_like_a_variables_name_is_not_printed_when_unset(capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    key = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"  # a GitHub token is a valid identifier
    monkeypatch.delenv(key, raising=False)
    assert main(["generate", "hi", "--server", "http://127.0.0.1:9", "--api-key-env", key]) == 2
    err = capsys.readouterr().err
    assert key not in err and "not set" in err and "--api-key-env" in err


def test_a_password_in_the_server_url_is_never_printed(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer({}) as fake:  # answers 404 to everything: the error names the server
        url = fake.url.replace("http://", "http://alice:hunter2@")
        assert main(["generate", "hi", "--server", url]) == 2
        assert fake.requests and all(r[2].get("Authorization", "").startswith("Basic ") for r in fake.requests)
    err = capsys.readouterr().err
    assert "hunter2" not in err and "alice:***@" in err


def test_bench_prints_the_servers_model_name_inert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, reply_stream(["An", " answer"]))

    routes = llama_routes(chat)
    routes["/v1/models"] = models_route(ids=("m" + HOSTILE["osc52-clipboard"],))
    with FakeServer(routes) as fake:
        code = main(["bench", "--server", fake.url, "--per-class", "1", "--repeats", "1", "--max-new-tokens", "4",
                     "--json", str(tmp_path / "b.json")])
    out = capsys.readouterr()
    assert code == 0 and raw_in(out.out) == [] and raw_in(out.err) == []
    assert "(m␛]52;c;cm0gLXJmIH4=␇)" in out.out


def test_a_reply_through_a_url_with_a_password_prints_it_nowhere(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(llama_routes(talker)) as fake:
        url = fake.url.replace("http://", "http://alice:hunter2@")
        assert main(["generate", "hi", "--server", url, "--json"]) == 0
        assert {r[2]["Authorization"] for r in fake.requests} == {"Basic YWxpY2U6aHVudGVyMg=="}
    out = capsys.readouterr()
    assert "hunter2" not in out.out + out.err
    assert json.loads(out.out)["stats"]["plan"]["summary"].endswith(fake.url.replace("http://", "http://alice:***@"))


def run_cli(*argv: str, env: dict[str, str] | None = None, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    """The command line in a process of its own (its real streams, encodings and file descriptors)."""
    root = Path(__file__).resolve().parents[2]
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.run([sys.executable, "-m", "app.cli", *argv], cwd=root, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root), **(env or {})}, **streams)  # type: ignore[call-overload]


def checkmarks(req, body):  # type: ignore[no-untyped-def]
    start_sse(req)
    write_events(req, reply_stream(["Done: ", "✓ ", "😀"]))


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_a_reply_a_legacy_locale_cannot_encode_is_printed_escaped_not_a_traceback(encoding: str) -> None:
    """``PYTHONIOENCODING=latin-1`` (or a legacy locale): a ✓ in the reply ended generate in a
    UnicodeEncodeError and the reply was lost. Text escapes what it cannot encode; --json is ASCII."""
    with FakeServer(llama_routes(checkmarks)) as fake:
        text = run_cli("generate", "hi", "--server", fake.url, env={"PYTHONIOENCODING": encoding})
        as_json = run_cli("generate", "hi", "--server", fake.url, "--json", "--quiet",
                          env={"PYTHONIOENCODING": encoding})
    assert text.returncode == 0, text.stderr
    assert text.stdout.decode(encoding) == "Done: \\u2713 \\U0001f600\n"
    assert b"Traceback" not in text.stderr and text.stderr.startswith(b"specchat: ")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout.decode("ascii"))["text"] == "Done: ✓ 😀"


def test_output_that_cannot_be_written_is_one_line_not_a_traceback() -> None:
    """``> /dev/full`` (a disk that filled up under a redirect) printed a traceback."""
    with FakeServer(llama_routes(checkmarks)) as fake:
        for argv in (["generate", "hi", "--server", fake.url], ["generate", "hi", "--server", fake.url, "--json"],
                     ["profiles"], ["profiles", "--json"]):
            with open("/dev/full", "wb") as full:
                done = run_cli(*argv, stdout=full)
            assert done.returncode == 1, argv
            assert done.stderr.decode().splitlines()[-1] == "specchat: error: No space left on device writing the output"
            assert b"Traceback" not in done.stderr


def test_generate_with_stdin_or_stdout_closed_says_so() -> None:
    """``generate - <&-`` ended in an AttributeError; with ``>&-`` the reply went nowhere, exit 0,
    and then exit 2 (bad input) where README says 1 is "the output could not be written"."""
    closed_in = run_cli("generate", "-", preexec_fn=lambda: os.close(0))
    assert closed_in.returncode == 2 and closed_in.stderr.decode().startswith("specchat: error: standard input is closed")
    closed_out = run_cli("generate", "hi", preexec_fn=lambda: os.close(1))
    assert closed_out.returncode == 1
    assert closed_out.stderr.decode().startswith("specchat: error: standard output is closed, so the reply has "
                                                 "nowhere to go")


def test_the_engines_warnings_are_the_commands_own_lines_shown_inert(capsys: pytest.CaptureFixture[str]) -> None:
    """"draft model dropped: …" came out bare (no ``specchat:``) and raw, through Python's last-resort
    logging handler."""
    import logging

    from app.cli import engine_warnings_to_stderr

    engine_warnings_to_stderr()
    engine_warnings_to_stderr()  # once, however often it is called
    try:
        logging.getLogger("engine.load.loader").warning("%s", f"draft model dropped: {HOSTILE['osc52-clipboard']}")
        logging.getLogger("engine.load.loader").info("memory plan: not shown")
        err = capsys.readouterr().err
        assert err.splitlines() == [inert(f"specchat: draft model dropped: {HOSTILE['osc52-clipboard']}")]
        assert raw_in(err) == []
    finally:
        engine = logging.getLogger("engine")
        for handler in list(engine.handlers):
            engine.removeHandler(handler)
