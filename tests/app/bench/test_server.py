"""``specchat bench --server``, ``generate --server`` and ``profiles`` against loopback servers playing recorded answers."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from tests.app.helpers import interrupt_generate_after
from tests.fake_server import (
    FakeServer, llama_routes, models_route, reply_stream, start_sse, timings, write_events,
)


def llama_chat(honours_switch: bool):  # type: ignore[no-untyped-def]
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        plain = body.get("speculative.n_max") == 0 and honours_switch
        write_events(req, reply_stream(["An", " answer", "."], timings(3, 25.0) if plain else
                                       timings(3, 50.0, draft_n=4, accepted=2)))
    return chat


def bench(url: str, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "bench.json"
    code = main(["bench", "--server", url, "--per-class", "1", "--repeats", "2", "--max-new-tokens", "8",
                 "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def test_bench_side_by_side_on_one_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(llama_routes(llama_chat(True))) as fake:
        code, report = bench(fake.url, tmp_path)
        bodies = fake.posts()
    assert code == 0
    assert report["plain_side"] == "the same server, speculative.n_max = 0 per request"
    assert report["rates_from"] == ["server"]
    every = {r["prompt_class"]: r for r in report["results"]}
    assert set(every) == {"chat", "code", "grounded", "multi-turn", "repeat-edit", "all"}
    assert every["all"]["speedup"] == pytest.approx(2.0) and every["all"]["alpha"] == pytest.approx(0.5)
    assert every["all"]["tau"] == pytest.approx(3.0) and every["all"]["differing_prompts"] == []
    # 4 prompts x (1 warm-up + 2 repeats) x 2 sides, the plain ones with the switch.
    assert len(bodies) == 30 and sum(b.get("speculative.n_max") == 0 for b in bodies) == 15
    assert all(b["temperature"] == 0.0 and b["max_tokens"] == 8 for b in bodies)
    table = capsys.readouterr().out
    assert "2.00x" in table and "same text" in table


def test_bench_when_the_server_ignores_the_switch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(llama_routes(llama_chat(False))) as fake:
        code, report = bench(fake.url, tmp_path)
    assert code == 0 and report["plain_side"] == "none"
    assert report["results"][-1]["speedup"] is None and report["results"][-1]["alpha"] == pytest.approx(0.5)
    assert any("ignores speculative.n_max = 0" in n for n in report["notes"])
    assert "--plain-server" in capsys.readouterr().err


def every_nth_post_refused(n: int, status: int = 429, always_after: int | None = None):  # type: ignore[no-untyped-def]
    """llama_chat(True), answering ``status`` (Retry-After: 0) to every ``n``th POST, and to
    every POST after the ``always_after``th."""
    chat = llama_chat(True)
    count = [0]

    def route(req, body):  # type: ignore[no-untyped-def]
        count[0] += 1
        if count[0] % n == 0 or (always_after is not None and count[0] > always_after):
            payload = json.dumps({"error": {"message": "Too Many Requests"}}).encode()
            req.send_response(status)
            req.send_header("Content-Type", "application/json")
            req.send_header("Retry-After", "0")
            req.send_header("Content-Length", str(len(payload)))
            req.end_headers()
            req.wfile.write(payload)
            return
        chat(req, body)
    return route


def test_a_busy_server_is_asked_again_and_the_run_completes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One 429 ended the whole run with no JSON written (a review's)."""
    with FakeServer(llama_routes(every_nth_post_refused(7))) as fake:
        code, report = bench(fake.url, tmp_path)
    assert code == 0 and "stopped" not in report
    assert report["results"][-1]["speedup"] == pytest.approx(2.0)
    retried = [n for n in report["notes"] if "tried again after 0 s" in n]
    assert len(retried) == 4 and "HTTP 429 (the server says: Too Many Requests); it asks to try again in 0 s" in retried[0]


def test_a_server_that_stays_busy_leaves_the_replies_measured_before_it(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(llama_routes(every_nth_post_refused(1000, 503, always_after=25))) as fake:
        code, report = bench(fake.url, tmp_path)
    assert code == 1 and "HTTP 503" in report["stopped"]
    # 5 prompts x 2 sides a repeat: the warm-up's 10, repeat 0's 10, then repeat 1 stops after 5 (left out)
    assert len(report["runs"]) == 10 and {r["repeat"] for r in report["runs"]} == {0}
    assert report["repeats_measured"] == 1 and report["results"][-1]["speedup"] == pytest.approx(2.0)
    assert "stopped early" in capsys.readouterr().err


def test_bench_with_a_second_plain_server(tmp_path: Path) -> None:
    def plain(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, reply_stream(["An", " answer", "."], timings(3, 20.0)))

    with FakeServer(llama_routes(llama_chat(False))) as spec, FakeServer(llama_routes(plain)) as second:
        code, report = bench(spec.url, tmp_path, "--plain-server", second.url)
        assert all("speculative.n_max" not in b for b in second.posts())
    assert code == 0 and report["plain_side"] == f"a second server at {second.url}"
    assert report["results"][-1]["speedup"] == pytest.approx(2.5)


def test_generate_with_server_prints_the_reply_and_figures(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(llama_routes(llama_chat(True))) as fake:
        assert main(["generate", "--server", fake.url, "--json", "Say something"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == "An answer." and out["stats"]["alpha"] == 0.5 and out["stats"]["speedup"] == 2.0
    assert out["stats"]["server"] == "llama.cpp" and out["token_ids"] == []


def test_the_bench_header_shows_a_long_or_multi_line_model_name_on_one_cut_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = "first line\nsecond " + "x" * 5000
    routes = llama_routes(llama_chat(True))
    routes["/v1/models"] = models_route(ids=(name,))
    with FakeServer(routes) as fake:
        code, report = bench(fake.url, tmp_path)
    header = capsys.readouterr().out.splitlines()[0]
    assert code == 0 and "(first line second xxx" in header and len(header) < 400 and "…" in header
    assert report["server"]["model"] == name  # the JSON keeps it whole


def test_generate_interrupted_counts_a_servers_tokens(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """^C after two of a server's pieces said "interrupted after 0 tokens": a server sends no token ids."""
    interrupt_generate_after(monkeypatch, 2)
    with FakeServer(llama_routes(llama_chat(True))) as fake:
        assert main(["generate", "--server", fake.url, "Say something"]) == 130
    captured = capsys.readouterr()
    assert captured.out.startswith("An answer") and "specchat: interrupted after 2 tokens" in captured.err


def test_generate_mode_ngram_is_refused_for_a_server(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(llama_routes(llama_chat(True))) as fake:
        assert main(["generate", "--server", fake.url, "--mode", "ngram", "hi"]) == 2
    assert "the server decides how it drafts" in capsys.readouterr().err


def test_server_options_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--server", "ftp://x", "hi"]) == 2
    assert "http://127.0.0.1:8080" in capsys.readouterr().err
    assert main(["generate", "--server", "http://127.0.0.1:9", "--target", "x.gguf", "hi"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    assert main(["generate", "--server-model", "m", "hi"]) == 2
    assert "need --server" in capsys.readouterr().err
    with FakeServer({"/v1/models": models_route("vllm", ["m"])}) as fake:
        assert main(["generate", "--server", fake.url, "--mode", "plain", "hi"]) == 2
    assert "no per-request switch" in capsys.readouterr().err


def test_profiles_lists_server_profiles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = tmp_path / "models.toml"
    models.write_text('[profiles.remote]\nbackend = "server"\nurl = "http://127.0.0.1:8080"\nmodel = "smol"\n'
                      'api_key_env = "MY_KEY"\ndescription = "my llama-server"\n')
    assert main(["profiles", "--models", str(models)]) == 0
    out = capsys.readouterr().out
    assert "remote" in out and "server http://127.0.0.1:8080 (model smol)" in out
    assert main(["profiles", "--models", str(models), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["profiles"]}
    assert rows["remote"]["backend"] == "server" and rows["remote"]["url"] == "http://127.0.0.1:8080"
