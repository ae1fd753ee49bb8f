"""llama.cpp rows in ``specchat bench``: the plumbing with a fake llama-server, and the real one when built."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import app.bench.run as bench
from app.bench.tables import format_table
from app.bench.llamacpp import llama_servers, plan_llama, run_llama
from app.bench.methods import Method
from app.bench.stats import summarise
from app.cli import main
from engine.model.device import Device
from engine.errors import LlamaCppError
from app.bench.llamacpp_tools import ENV_VAR, LlamaCpp, find_llama_cpp, gguf_for
from engine.config.profiles import ModelProfile, ModelSpec
from tests.conftest import POCKET_SOURCE
from tests.fake_llama import FakeLlamaServer, load_recorded, synthetic
from tests.tiny import tiny_llama

PROMPTS = [bench.BenchPrompt("one", "chat", (3, 4, 5, 6)), bench.BenchPrompt("two", "code", (7, 8, 9))]


def _plain_outputs(models: bench.BenchModels) -> dict[str, tuple[int, ...]]:
    b = bench.Bench(models)
    return {p.name: b.measure(Method("plain", 0), p, 0).tokens for p in PROMPTS}


def test_llama_rows_join_the_table_with_server_figures_and_agreement() -> None:
    models = bench.BenchModels(target=tiny_llama(seed=1, vocab_size=64), device=Device(torch.device("cpu")),
                               max_new_tokens=6)
    plain = _plain_outputs(models)
    assert plain["one"] != plain["two"]
    # llama.cpp-plain returns plain's reply to "one" for every prompt: equal on "one", not on "two".
    same = FakeLlamaServer(synthetic(list(plain["one"]), per_second=321.0))
    # llama.cpp-lookup drafted 5 tokens, 3 accepted; its second token's chunk is held back.
    lookup = FakeLlamaServer(synthetic([1, 2, 3, 4, 5, 6, 7], draft=(5, 3), held_back=(1,)))
    try:
        models.external = {
            "llama.cpp-plain": lambda ids, emit: run_llama(same.url, ids, models.max_new_tokens, emit),
            "llama.cpp-lookup": lambda ids, emit: run_llama(lookup.url, ids, models.max_new_tokens, emit),
        }
        methods = [Method("plain", 0), Method("llama.cpp-plain"), Method("llama.cpp-lookup")]
        runs = bench.run_bench(models, PROMPTS, methods, repeats=2)
    finally:
        same.close()
        lookup.close()
    sent = [body for path, body in same.requests if path == "/completion"]
    assert [b["prompt"] for b in sent[:2]] == [[3, 4, 5, 6]] * 2  # warm-up, then repeat 1's first prompt
    assert all(b["n_predict"] == 6 and b["temperature"] == 0.0 and b["top_k"] == 1 and b["cache_prompt"] is False
               for b in sent)
    by_run = {(r.method, r.prompt, r.repeat): r for r in runs}
    lk = by_run[("llama.cpp-lookup", "one", 0)]
    assert lk.tokens == (1, 2, 3, 4, 5, 6)  # cut to max_new_tokens; the held-back id fetched unstreamed
    assert lk.extra is not None and lk.extra["token_ids_from"] == "non-streamed repeat (untimed)"
    assert lk.first_tokens == 1 and lk.decode_tokens == 5  # the jump after the held-back chunk counts both
    assert (lk.proposed, lk.accepted, lk.target_passes) == (5, 3, 3)  # passes: tokens - accepted
    assert by_run[("llama.cpp-plain", "one", 0)].extra["token_ids_from"] == "stream"  # type: ignore[index]

    results = {(r["method"], r["prompt_class"]): r for r in summarise(runs)}
    lp = results[("llama.cpp-plain", "all")]
    assert lp["identical"] is None and lp["mismatches"] == []
    assert lp["agreement"]["runs_identical"] == 2 and lp["agreement"]["runs_compared"] == 4
    assert lp["server_tokens_per_s"] == pytest.approx(321.0)
    assert lp["tokens_per_s"] > 0 and lp["speedup"] is not None and lp["alpha"] is None
    assert results[("llama.cpp-lookup", "all")]["alpha"] == pytest.approx(3 / 5)
    assert results[("plain", "all")]["identical"] is True
    table = format_table(list(results.values()))
    assert "2/4*" in table and "information only" in table


def test_plan_keeps_only_the_rows_the_profile_can_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    wanted = [Method("plain", 0), Method("llama.cpp-plain"), Method("llama.cpp-spec"), Method("llama.cpp-lookup")]
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(16))
    ngram = ModelProfile(name="p", target=ModelSpec(str(gguf)), drafter="ngram")
    methods, plan = plan_llama(wanted, ngram, 2, PROMPTS, 64)
    assert methods == [Method("plain", 0)] and plan.llama is None
    assert len(plan.notes) == 1 and "scripts/build-llama-cpp.sh" in plan.notes[0]

    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "llama-server").write_text("#!/bin/sh\n")
    (folder / "llama-server").chmod(0o755)
    methods, plan = plan_llama(wanted, ngram, 2, PROMPTS, 64, folder)
    assert [m.name for m in methods] == ["plain", "llama.cpp-plain", "llama.cpp-lookup"]
    assert plan.args["llama.cpp-lookup"][-2:] == ["--spec-type", "ngram-simple"]
    assert plan.args["llama.cpp-plain"][:2] == ["-c", "256"]  # 4 + 64 + 16 rounded up to 256
    assert any("llama.cpp-spec skipped" in n for n in plan.notes)

    pair = ModelProfile(name="q", target=ModelSpec(str(gguf)), drafter="model", draft=ModelSpec(str(gguf)))
    methods, plan = plan_llama(wanted, pair, 3, PROMPTS, 64, folder)
    assert [m.name for m in methods] == ["plain", "llama.cpp-plain", "llama.cpp-spec"]
    assert plan.args["llama.cpp-spec"][-8:] == ["-md", str(gguf), "--spec-type", "draft-simple", "-td", "3", "-tbd", "3"]

    hub = ModelProfile(name="h", target=ModelSpec("org/model"), drafter="ngram")
    methods, plan = plan_llama(wanted, hub, 2, PROMPTS, 64, folder)
    assert methods == [Method("plain", 0)] and "not a GGUF file" in plan.notes[0]
    with pytest.raises(LlamaCppError, match="no executable llama-server"):
        plan_llama(wanted, hub, 2, PROMPTS, 64, tmp_path)


def test_a_broken_stream_is_an_error() -> None:
    reply = synthetic([1, 2, 3])
    reply["chunks"] = reply["chunks"][:-1] + [{"index": 0, "stop": False, "tokens_predicted": 3}]
    fake = FakeLlamaServer(reply)
    try:
        with pytest.raises(LlamaCppError, match="without its final message"):
            run_llama(fake.url, [1, 2], 3, lambda n: None)
    finally:
        fake.close()


def test_recorded_reply_of_the_real_server_goes_through() -> None:
    """The recorded llama-server 0.3.36 stream (tests/data) has the shapes run_llama reads."""
    recorded = load_recorded()
    fake = FakeLlamaServer(recorded)
    emitted: list[int] = []
    try:
        reply = run_llama(fake.url, [1, 2, 3], 1000, emitted.append)
    finally:
        fake.close()
    assert list(reply.tokens) == recorded["tokens"] and sum(emitted) == len(recorded["tokens"])
    assert reply.extra is not None and reply.extra["server_tokens_per_s"] > 0
    assert reply.proposed is not None and 0 <= (reply.accepted or 0) <= reply.proposed


# ----------------------------------------------------------------------------- the real llama.cpp

def _real() -> LlamaCpp | None:
    try:
        return find_llama_cpp()
    except LlamaCppError:
        return None


REAL = _real()
needs_llama = pytest.mark.skipif(
    REAL is None, reason="llama.cpp is not built: run scripts/build-llama-cpp.sh (about 15 min) to run these")


@needs_llama
def test_real_llama_server_rows_on_the_pocket_gguf(pocket_dir: Path, smol_tokenizer, model_cache: Path,  # type: ignore[no-untyped-def]
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert REAL is not None
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(model_cache))
    gguf = gguf_for(ModelSpec(POCKET_SOURCE))
    assert gguf is not None
    ids = smol_tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                             add_generation_prompt=True, tokenize=True, return_dict=False)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    profile = ModelProfile(name="p", target=ModelSpec(POCKET_SOURCE), drafter="model", draft=ModelSpec(POCKET_SOURCE))
    prompt = [bench.BenchPrompt("c", "chat", tuple(ids))]
    methods, plan = plan_llama([Method("llama.cpp-plain"), Method("llama.cpp-spec")], profile, 2, prompt, 24, REAL.bin_dir)
    assert plan.notes == [] and len(methods) == 2
    with llama_servers(plan, 24) as runners:
        replies = {name: run(ids, lambda n: None) for name, run in runners.items()}
    for name, reply in replies.items():
        assert 0 < len(reply.tokens) <= 24, name
        assert reply.extra is not None and reply.extra["timings"]["prompt_n"] == len(ids)
        text = smol_tokenizer.decode(reply.tokens, skip_special_tokens=True)
        assert text == reply.extra["text"], name  # the ids are the text llama.cpp wrote
    spec = replies["llama.cpp-spec"]
    assert spec.proposed and spec.accepted is not None and spec.accepted <= spec.proposed
    assert spec.accepted / spec.proposed > 0.5  # its draft is the very same file
    assert replies["llama.cpp-plain"].proposed in (None, 0)


@needs_llama
def test_real_bench_cli_with_llama_rows(pocket_dir: Path, model_cache: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert REAL is not None
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(model_cache))
    out = tmp_path / "bench.json"
    code = main(["bench", "--target", POCKET_SOURCE, "--methods", "plain,llama.cpp-plain,llama.cpp-lookup",
                 "--classes", "grounded", "--per-class", "1", "--max-new-tokens", "8", "--repeats", "1",
                 "--threads", "1", "--llama-cpp", str(REAL.bin_dir), "--json", str(out)])
    assert code == 0  # llama.cpp's different output is never a failure
    report = json.loads(out.read_text())
    rows = {r["method"]: r for r in report["results"] if r["prompt_class"] == "all"}
    assert set(rows) == {"plain", "llama.cpp-plain", "llama.cpp-lookup"}
    assert rows["llama.cpp-plain"]["tokens_per_s"] > 0 and rows["llama.cpp-plain"]["server_tokens_per_s"] > 0
    assert rows["llama.cpp-lookup"]["agreement"]["runs_compared"] == 1
    assert report["llama_cpp"]["found"] and report["llama_cpp"]["threads"] == 1
    assert report["machine"]["llama_bench"].get("avg_ts", 0) > 0
    assert all(r["llama_cpp"] is not None for r in report["runs"] if r["method"].startswith("llama.cpp"))


def test_bench_without_llama_cpp_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from tests.app.bench.test_run import PROMPTS_TOML
    from tests.tiny import make_tokenizer

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    tokenizer = make_tokenizer()
    model = tiny_llama(seed=1, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(tmp_path / "t")
    tokenizer.save_pretrained(tmp_path / "t")
    (tmp_path / "p.toml").write_text(PROMPTS_TOML)
    code = main(["bench", "--target", str(tmp_path / "t"), "--prompts", str(tmp_path / "p.toml"),
                 "--methods", "llama.cpp-plain", "--max-new-tokens", "3", "--repeats", "1",
                 "--json", str(tmp_path / "b.json")])
    assert code == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert {r["method"] for r in report["results"]} == {"plain"} and report["llama_cpp"] == {
        "found": False, "notes": report["notes"][-1:]}
    err = capsys.readouterr().err
    assert "llama.cpp rows skipped: llama.cpp not found: build it with `scripts/build-llama-cpp.sh`" in err
