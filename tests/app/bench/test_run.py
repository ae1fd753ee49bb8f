"""``specchat bench`` on tiny models: the JSON's structure, the identical-output check, the figures' arithmetic.

The speeds themselves are not asserted (they are noise on tiny models); what
is asserted is what every run must satisfy whatever the machine.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import app.bench.run as bench
from app.bench.cli import load_prompt_set, parse_k_range, select_prompts
from app.bench.tables import write_chart
from app.bench.methods import ALL_METHODS, LLAMA_METHODS, Method
from app.bench.probes import ForwardLog
from app.bench.stats import alpha_from_tau, first_difference, predicted_speedup, summarise
from app.cli import main
from engine.errors import SpecChatError
from tests.tiny import make_tokenizer
from tests.tiny import noisy_copy, tiny_llama

RESULT_KEYS = {
    "method", "k", "prompt_class", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max", "tokens_per_s_e2e",
    "speedup", "speedup_e2e", "alpha", "tau", "target_passes_per_token", "time_split", "peak_memory_bytes",
    "identical", "mismatches", "prediction",
}
PROMPTS_TOML = """
[[prompt]]
name = "one"
class = "chat"
messages = [{ role = "user", content = "w1 w2 w3 w4 w5" }]

[[prompt]]
name = "two"
class = "grounded"
messages = [
  { role = "user", content = "w7 w8 w9 w7 w8 w9 w7 w8" },
  { role = "assistant", content = "w9 w7 w8" },
  { role = "user", content = "w10 w11 w7 w8" },
]
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny target and a close draft saved with one shared word-level tokenizer."""
    root = tmp_path_factory.mktemp("bench-models")
    tokenizer = make_tokenizer()
    target = tiny_llama(seed=1, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    draft = noisy_copy(target, 0.05, seed=2)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root / "target", root / "draft"


def run_cli(pair: tuple[Path, Path], tmp_path: Path, *extra: str, draft: bool = True) -> tuple[int, dict]:
    prompts = tmp_path / "prompts.toml"
    prompts.write_text(PROMPTS_TOML)
    out = tmp_path / "bench.json"
    args = ["bench", "--target", str(pair[0]), "--prompts", str(prompts), "--max-new-tokens", "6",
            "--json", str(out), *extra]
    if draft:
        args += ["--draft", str(pair[1])]
    code = main(args)
    return code, json.loads(out.read_text())


def test_bench_json_structure_and_identical_outputs(pair: tuple[Path, Path], tmp_path: Path) -> None:
    code, report = run_cli(pair, tmp_path, "--repeats", "2", "--k-range", "2")
    assert code == 0
    machine = report["machine"]
    assert {"device", "torch", "transformers", "torch_threads", "cpu_count"} <= machine.keys()
    assert machine["torch"] == torch.__version__
    results = report["results"]
    assert {r["method"] for r in results} == set(ALL_METHODS) - set(LLAMA_METHODS)  # the tiny model is no GGUF
    assert any("llama.cpp rows skipped" in n for n in report["notes"])
    assert {r["prompt_class"] for r in results} == {"chat", "grounded", "all"}
    for r in results:
        assert RESULT_KEYS <= r.keys(), r["method"]
        assert r["identical"] is True and r["mismatches"] == []
        assert r["tokens_per_s"] > 0 and r["repeats"] == 2
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"]
    by = {(r["method"], r["prompt_class"]): r for r in results}
    assert by[("plain", "all")]["k"] is None and by[("plain", "all")]["speedup"] == pytest.approx(1.0)
    assert by[("plain", "all")]["tau"] == pytest.approx(1.0) and by[("plain", "all")]["alpha"] is None
    # A reply decoded plainly reports no speedup of its own (issue 37: no "× vs plain" on a plain
    # reply), so the bench has nothing to cross-check for plain.
    assert by[("plain", "all")]["engine_speedup"] is None and by[("plain", "all")]["engine_over_bench"] is None
    assert by[("hf-plain", "all")]["engine_speedup"] is None
    assert by[("spec", "all")]["k"] == 2 and by[("hf-assisted-constant", "all")]["k"] == 2
    assert by[("hf-prompt-lookup", "all")]["tau"] >= 1.0 and by[("hf-prompt-lookup", "all")]["alpha"] is None
    for method in ("spec", "hf-assisted-constant"):
        r = by[(method, "all")]
        assert 0.0 <= r["alpha"] <= 1.0 and 1.0 <= r["tau"] <= 3.0
        assert r["prediction"]["predicted_speedup"] > 0 and r["prediction"]["c"] > 0
    assert by[("spec-adaptive", "all")]["prediction"]["predicted_speedup"] is None
    # The same greedy reply through both libraries: every method emits the same number of tokens.
    assert len({r["new_tokens"] for r in results if r["prompt_class"] == "all"}) == 1
    for run in report["runs"]:
        if run["method"] in ("plain", "spec", "spec-adaptive", "ngram", "suffix"):  # one prefill pass emits nothing
            assert run["target_forward_calls"] == run["target_passes"] + 1
        else:
            assert run["target_forward_calls"] == run["target_passes"]


def test_model_draft_methods_are_skipped_without_a_draft(pair: tuple[Path, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_cli(pair, tmp_path, "--repeats", "1", "--methods", "ngram,spec,hf-assisted", draft=False)
    assert code == 0
    assert {r["method"] for r in report["results"]} == {"plain", "ngram"}
    assert any("spec skipped" in n for n in report["notes"]) and "hf-assisted skipped" in capsys.readouterr().err


def test_a_differing_output_is_reported_with_its_position(pair: tuple[Path, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    real, real_hf = bench._run_specchat, bench._run_hf

    def corrupt(models: object, method: Method, *args: object, **kwargs: object) -> bench._Reply:
        reply = real(models, method, *args, **kwargs)  # type: ignore[arg-type]
        if method.name == "ngram":
            reply.tokens[3] = (reply.tokens[3] + 1) % 64
        return reply

    def corrupt_hf(models: object, method: Method, *args: object, **kwargs: object) -> bench._Reply:
        reply = real_hf(models, method, *args, **kwargs)  # type: ignore[arg-type]
        if method.name == "hf-prompt-lookup":
            reply.tokens[2] = (reply.tokens[2] + 1) % 64
        return reply

    monkeypatch.setattr(bench, "_run_specchat", corrupt)
    code, report = run_cli(pair, tmp_path, "--repeats", "1", "--methods", "plain,ngram")
    assert code == 1
    bad = {r["prompt_class"]: r for r in report["results"] if r["method"] == "ngram"}
    assert bad["all"]["identical"] is False
    assert {m["first_difference"] for m in report["mismatches"]} == {3}
    assert all(r["identical"] for r in report["results"] if r["method"] == "plain")
    assert "first difference at token 3" in capsys.readouterr().err
    # transformers' own differences are information: noted, in the JSON, never the exit status
    monkeypatch.setattr(bench, "_run_hf", corrupt_hf)
    code, report = run_cli(pair, tmp_path, "--repeats", "1", "--methods", "plain,hf-plain,hf-prompt-lookup")
    assert code == 0 and report["mismatches"] == []
    assert {(m["method"], m["first_difference"]) for m in report["transformers_differences"]} == {("hf-prompt-lookup", 2)}
    assert "note: " in capsys.readouterr().err


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.9])
def test_alpha_inverted_from_tau(alpha: float, k: int) -> None:
    tau = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert alpha_from_tau(tau, k) == pytest.approx(alpha, abs=1e-9)
    assert alpha_from_tau(1.0, k) == 0.0 and alpha_from_tau(k + 1.0, k) == 1.0


def test_predicted_speedup_formula() -> None:
    assert predicted_speedup(0.0, 4, 0.25, 1.0) == pytest.approx(0.5)  # nothing accepted: one token per 2 steps
    assert predicted_speedup(1.0, 4, 0.0, 1.0) == pytest.approx(5.0)  # free draft, all accepted
    assert predicted_speedup(0.6, 3, 0.1, 1.2) == pytest.approx((1 - 0.6**4) / (0.4 * (0.3 + 1.2)))


def _run(method: str, repeat: int, tokens: tuple[int, ...], seconds: float) -> bench.Run:
    return bench.Run(method, None, "p", "chat", repeat, 5, tokens, seconds, seconds / 10, 1,
                     ForwardLog(((5, 0.01),)), ForwardLog(), len(tokens), None, None)


def test_speedup_is_paired_per_repeat_and_spread_is_reported() -> None:
    runs = [_run("plain", 0, (1, 2, 3, 4), 1.0), _run("hf-plain", 0, (1, 2, 3, 4), 0.5),
            _run("plain", 1, (1, 2, 3, 4), 2.0), _run("hf-plain", 1, (1, 2, 3, 4), 2.0)]
    r = next(x for x in summarise(runs) if x["method"] == "hf-plain" and x["prompt_class"] == "all")
    assert r["speedup_min"] == pytest.approx(1.0) and r["speedup_max"] == pytest.approx(2.0)
    assert r["speedup"] == pytest.approx(1.5)
    assert r["tokens_per_s_max"] == pytest.approx(3 / 0.45)


def test_schedule_alternates_and_rotates() -> None:
    methods = [Method("plain", 0), Method("ngram"), Method("hf-plain")]
    prompts = [bench.BenchPrompt("a", "chat", (1, 2)), bench.BenchPrompt("b", "code", (3, 4))]
    order = bench.schedule(methods, prompts, repeats=2)
    assert len(order) == 12
    assert [m.name for r, p, m in order[:3]] == ["plain", "ngram", "hf-plain"]
    assert [m.name for r, p, m in order[6:9]] == ["ngram", "hf-plain", "plain"]
    assert all(p.name == "a" for _, p, _ in order[:3])


def test_shipped_prompt_set_has_the_five_classes() -> None:
    specs = load_prompt_set()
    assert {s.prompt_class for s in specs} == {"chat", "code", "grounded", "multi-turn", "repeat-edit"}
    assert all(s.messages[-1].role == "user" for s in specs)
    long = [s for s in specs if s.prompt_class == "multi-turn"]
    assert all(sum(m.role == "user" for m in s.messages) >= 3 for s in long)
    one_each = select_prompts(specs, None, per_class=1)
    assert len(one_each) == 5
    again = [s for s in specs if s.prompt_class == "repeat-edit"]
    assert again[0].messages == again[-1].messages and len(again[1].messages) == 3  # ask, edit, ask in a new chat
    assert {s.prompt_class for s in select_prompts(specs, "code,chat", None)} == {"code", "chat"}
    with pytest.raises(SpecChatError, match="unknown class"):
        select_prompts(specs, "poetry", None)


def test_bad_prompt_sets_and_k_ranges_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[prompt]]\nname = "x"\nclass = "chat"\nmessages = [{ role = "robot", content = "hi" }]\n')
    with pytest.raises(SpecChatError, match="valid role"):
        load_prompt_set(bad)
    assert parse_k_range("1-4") == [1, 2, 3, 4] and parse_k_range("4,2") == [2, 4]
    for text in ("0-3", "a-b", ""):
        with pytest.raises(SpecChatError, match="--k-range"):
            parse_k_range(text)


def test_chart_is_written_or_skipped_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = {"method": "spec", "k": 2, "prompt_class": "all", "speedup": 1.2, "speedup_min": 1.1, "speedup_max": 1.3}
    path = tmp_path / "chart.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "skipped" in write_chart([result], path) and not path.exists()
    else:
        assert "written" in write_chart([result], path) and path.read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert "skipped" in write_chart([result], tmp_path / "other.png")
    assert not (tmp_path / "other.png").exists()


def test_the_suffix_drafter_is_given_the_prompts_before_never_its_own_earlier_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, int, list[list[int]]]] = []

    def measure(self: bench.Bench, method: Method, prompt: bench.BenchPrompt, repeat: int,
                earlier: Sequence[Sequence[int]] = ()) -> object:
        seen.append((prompt.name, repeat, [list(e) for e in earlier]))
        return SimpleNamespace(tokens=(100 + len(seen),))

    monkeypatch.setattr(bench.Bench, "measure", measure)
    monkeypatch.setattr(bench, "PeakMemory", lambda device: None)
    prompts = [bench.BenchPrompt("a", "c", (1, 2)), bench.BenchPrompt("b", "c", (3,))]
    bench.run_bench(SimpleNamespace(device=None), prompts, [Method("suffix")], repeats=2)  # type: ignore[arg-type]
    measured = [(name, repeat, earlier) for name, repeat, earlier in seen if repeat >= 0]
    assert measured == [("a", 0, []), ("b", 0, [[1, 2, 102]]), ("a", 1, []), ("b", 1, [[1, 2, 102]])]


def test_building_the_drafter_is_not_timed_as_part_of_the_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app builds its drafter when a profile loads, so the bench builds it before the clock starts:
    a slow drafter build (a draft's output layer over its frequent tokens) is no part of a reply's time."""
    clock = [0.0]
    device = SimpleNamespace(now=lambda: clock[0])

    class Timer:
        def __init__(self, model: object, device: object) -> None:
            pass

        def take(self) -> ForwardLog:
            return ForwardLog()

        def remove(self) -> None:
            pass

    def slow_drafter(*args: object) -> str:
        clock[0] += 100.0
        return "drafter"

    def run(models: object, method: Method, ids: Sequence[int], costs: object, on_emit: object, drafter: object):
        assert drafter == "drafter"
        clock[0] += 1.0
        on_emit(1)  # type: ignore[operator]
        clock[0] += 2.0
        return bench._Reply(tokens=[5, 6])

    monkeypatch.setattr(bench, "ForwardTimer", Timer)
    monkeypatch.setattr(bench, "PeakMemory", lambda device: SimpleNamespace(reset=lambda: None, peak=lambda: 0))
    monkeypatch.setattr(bench, "_drafter_for", slow_drafter)
    monkeypatch.setattr(bench, "_run_specchat", run)
    models = SimpleNamespace(device=device, target=None, draft=None, external={})
    measured = bench.Bench(models).measure(Method("spec-adaptive"), bench.BenchPrompt("a", "code", (1, 2)), 0)  # type: ignore[arg-type]
    assert (measured.total_s, measured.first_s) == (3.0, 1.0)
