"""``specchat bench``'s command line: K ranges, the tables it prints, the loud mismatch report, its exit status."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from app.bench.cli import _output, parse_k_range
from app.bench.tables import format_class_speedups, format_mismatches, format_table, kernel_line
from app.bench.stats import mismatches, reference_outputs, summarise
from app.cli import main
from engine.errors import SpecChatError
from tests.app.bench.test_stats import run

RUNS = [run(prompt="a", cls="chat"), run(prompt="b", cls="code"),
        run("spec", k=2, prompt="a", cls="chat", total_s=0.55, proposed=4, accepted=3, target_passes=2,
            peak_memory=50 * 2**20),
        run("spec", k=2, prompt="b", cls="code", tokens=(1, 2, 9, 4), total_s=0.55, proposed=4, accepted=2,
            target_passes=2)]
HEAD = ("method                      tok/s          min-max  speedup     min-max   self   e2e   acc     τ pass/tok    "
        "d/v/o %  pred meas/pred  peak MB  same")


def test_k_ranges() -> None:
    assert parse_k_range("2-2") == [2] and parse_k_range(" 4, 2 ,4,") == [2, 4]
    for text, says in (("3-1", "need K values from 1 to 32"), ("1-x", "expected e.g. 1-6 or 2,4, got '1-x'"),
                       ("1-1000000000000", "need K values from 1 to 32"), ("40", "from 1 to 32, got '40'")):
        with pytest.raises(SpecChatError, match=says):
            parse_k_range(text)


def test_the_table_of_a_class() -> None:
    results = summarise(RUNS)
    assert format_table(results).splitlines() == [
        HEAD, "-" * len(HEAD),
        "plain                         3.3          3.3-3.3    1.00x   1.00-1.00      -  1.00     -  1.00     1.00    0/0/100"
        "     -         -        -  yes",
        "spec K=2                      6.7          6.7-6.7    2.00x   2.00-2.00      -  1.82  0.62  2.00     0.50    0/0/100"
        "     -         -       50  NO",
    ]
    assert format_table(results, "chat").splitlines()[3].endswith("  yes")  # the difference was on a code prompt
    fast = [{**r, "tokens_per_s": 12345.6, "tokens_per_s_min": 12345.6, "tokens_per_s_max": 12345.6} for r in results]
    assert "12345.6  12345.6-12345.6  " in format_table(fast)  # a card's speeds ran into each other (1719.81719.8-…)
    wide = [{**r, "speedup": 1.87, "speedup_min": 0.507, "speedup_max": 3.23} for r in results]
    assert "    1.87x   0.51-3.23  " in format_table(wide)  # a median from repeats this far apart is not settled


def test_speedups_by_class() -> None:
    assert format_class_speedups(summarise(RUNS)).splitlines() == [
        "speedup by class                  chat        code         all",
        "plain                            1.00x       1.00x       1.00x",
        "spec K=2                        2.00x*      2.00x*      2.00x*",
        "* from a single run or fewer than 128 new tokens: too short to rely on (more prompts or --repeats)",
    ]
    # Two prompts of 80 new tokens each: the class figures are still short, the overall one is not.
    longer = [{**r, "new_tokens": 80 if r["prompt_class"] != "all" else 160} for r in summarise(RUNS)]
    assert [line.split()[-1] for line in format_class_speedups(longer).splitlines()[1:3]] == ["1.00x", "2.00x"]


def test_mismatches_are_reported_with_where_they_start() -> None:
    (found,) = mismatches(RUNS, reference_outputs(RUNS))
    assert format_mismatches([found]) == (
        "!!! 1 greedy output(s) differ from plain decoding:\n"
        "!!!   spec K=2 on b (repeat 0): first difference at token 2: plain [3, 4] vs [9, 4]")
    judged = {**found, "k": None, "margin": 1.234}
    assert format_mismatches([judged]).endswith(
        "spec on b (repeat 0): first difference at token 2: plain [3, 4] vs [9, 4] "
        "(target's top-2 margin there 1.234 logits: not a near tie)")


def report(found: list[dict[str, Any]], flips: list[dict[str, Any]]) -> dict[str, Any]:
    return {"results": summarise(RUNS), "profile": {"name": "tiny", "target": "org/T", "drafter": "model"},
            "machine": {"device": "cpu (1 threads)", "device_type": "cpu", "cpu_kernel": "avx512-vnni",
                        "cpu_features": ["avx2", "fma", "avx512_vnni"]},
            "mismatches": found, "near_tie_flips": flips}


def test_output_writes_the_json_first_and_exits_1_on_a_mismatch(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    found = mismatches(RUNS, reference_outputs(RUNS))
    args = argparse.Namespace(json_out=tmp_path / "bench.json", chart=None, max_new_tokens=8, repeats=2)
    assert _output(report(found, []), args) == 1
    assert json.loads((tmp_path / "bench.json").read_text())["mismatches"][0]["first_difference"] == 2
    out, err = capsys.readouterr()
    assert out.startswith("tiny: org/T + model on cpu (1 threads), 8 new tokens, 2 repeat(s)\n"
                          "CPU kernel avx512-vnni; CPU flags: avx2 fma avx512_vnni\n" + HEAD)
    assert "speedup by class" in out
    # every column of the table is explained under it
    legend = out.split("speedup by class", 1)[1]
    for column in ("tok/s", "speedup", "self", "e2e", "acc", "τ", "pass/tok", "d/v/o %", "pred", "meas/pred", "peak MB", "same"):
        assert column in HEAD and (f"\n{column} " in legend or f" {column}: " in legend), column
    assert f"JSON written to {tmp_path / 'bench.json'}" in err and "!!! 1 greedy output(s) differ" in err


def test_a_card_run_names_no_cpu_kernel() -> None:
    assert kernel_line({"device": "cuda:0 (NVIDIA H100)", "device_type": "cuda", "cpu_kernel": "avx2"}) is None
    assert kernel_line({"device": "cpu (2 threads)", "device_type": "cpu", "cpu_kernel": "torch",
                        "cpu_features": []}) == "CPU kernel torch; CPU flags: none of those the kernel looks for"


def test_near_tie_flips_are_a_note_and_do_not_fail(capsys: pytest.CaptureFixture[str]) -> None:
    flip = {"method": "spec", "k": 2, "prompt": "b", "repeat": 0, "first_difference": 2, "margin": 0.125,
            "near_tie": True}
    args = argparse.Namespace(json_out=None, chart=None, max_new_tokens=8, repeats=2)
    assert _output(report([], [flip]), args) == 0
    err = capsys.readouterr().err
    assert "note: 1 greedy output(s) differ from plain decoding at a near tie" in err
    assert "  spec K=2 on b (repeat 0): token 2, margin 0.125" in err and "!!!" not in err


def test_transformers_differences_are_a_note_and_do_not_fail(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's pocket bench exited 1 on an AVX-512 machine: hf-prompt-lookup parted from hf-plain
    (transformers' forward is not batch-invariant), though every specchat output was plain's."""
    from app.bench.exact import split_by_engine

    theirs = {"method": "hf-prompt-lookup", "k": 16, "prompt": "explain-tides", "repeat": 0, "first_difference": 9}
    ours = {"method": "spec", "k": 2, "prompt": "b", "repeat": 0, "first_difference": 2}
    outside = {**ours, "method": "hf-plain", "k": None}  # transformers' plain against specchat's: counted
    assert split_by_engine([ours, theirs, outside]) == ([ours, outside], [theirs])
    args = argparse.Namespace(json_out=None, chart=None, max_new_tokens=8, repeats=2)
    assert _output({**report([], []), "transformers_differences": [theirs]}, args) == 0
    err = capsys.readouterr().err
    assert "note: 1 transformers output(s) differ from its plain decoding" in err
    assert "hf-prompt-lookup K=16 on explain-tides (repeat 0): first difference at token 9" in err and "!!!" not in err


@pytest.mark.parametrize("argv, says", [
    (["--repeats", "0"], "--repeats and --max-new-tokens must be at least 1"),
    (["--max-new-tokens", "0"], "--repeats and --max-new-tokens must be at least 1"),
    (["--k-range", "0-2"], "--k-range: need K values from 1 to 32, got '0-2'"),
    (["--classes", "poetry"], "--classes: unknown class(es) poetry; the set has chat, code, grounded"),
    (["--per-class", "0"], "--per-class must be at least 1, got 0"),  # a traceback once the models had loaded
    (["--json", "."], "--json .: that is a folder"),  # these three failed after the whole run, with a traceback
    (["--json", "no/such/folder/out.json"], "the folder no/such/folder does not exist"),
    (["--chart", "no/such/folder/chart"], "--chart no/such/folder/chart.png: the folder no/such/folder does not exist"),
    (["--methods", ""], "--methods: no method named; choose from plain,"),  # ran every method, llama-server too
    (["--methods", " , "], "--methods: no method named; choose from plain,"),
    (["--methods", "plain,nope"], "--methods: unknown method(s) nope; choose from plain,"),  # refused after the load
])
def test_bad_options_fail_before_any_model_loads(argv: list[str], says: str, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr("app.models_cli.load_for", no_loading)
    assert main(["bench", "--target", "/no/such/model", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: ") and says in err


@pytest.mark.parametrize("value", ["-1", "0", "5000", "x"])
def test_lookup_tokens_out_of_range_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """-1 was taken, and transformers refused it after plain had run, with a traceback; 0 was
    silently the profile's k_max; the errors then spoke of CPU threads (a hostile tester's)."""
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--lookup-tokens", value])
    said = capsys.readouterr().err.strip().splitlines()[-1]  # the error, under the usage lines
    assert exit_.value.code == 2 and said.startswith("specchat bench: error: argument --lookup-tokens: ")
    assert "thread" not in said and "tokens" in said


def test_a_json_that_could_not_be_written_fails_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    """bench --json /dev/full said so on stderr and exited 0 (a hostile tester's)."""
    args = argparse.Namespace(json_out=Path("/dev/full"), chart=None, max_new_tokens=8, repeats=2)
    assert _output(report([], []), args) == 1
    assert "the JSON could not be written to /dev/full" in capsys.readouterr().err


def test_a_prompt_set_that_is_not_utf8_or_names_prompts_with_escapes(tmp_path: Path) -> None:
    from app.bench.inputs import load_prompt_set

    binary = tmp_path / "bad.toml"
    binary.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(SpecChatError, match="cannot read the prompt set .*bad.toml"):
        load_prompt_set(binary)  # a UnicodeDecodeError traceback
    hostile = tmp_path / "hostile.toml"
    hostile.write_text('[[prompt]]\nname = "\\u001b]0;pwn\\u0007"\nclass = "\\u001b[2J"\n'
                       'messages = [ { role = "user", content = "hi" } ]\n', encoding="utf-8")
    (spec,) = load_prompt_set(hostile)
    assert (spec.name, spec.prompt_class) == ("␛]0;pwn␇", "␛[2J")  # shown in the progress line and the tables
