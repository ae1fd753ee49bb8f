"""``specchat bench``: the command line around :mod:`app.bench.run`.

Loads the profile's models once, renders the prompt set with the target's
chat template, runs every method in alternation (progress on stderr), prints
a table, and writes the JSON (and a PNG chart when matplotlib is installed).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.bench.inputs import (
    PromptSpec, ProgressBar, check_output, load_prompt_set, render, select_prompts, write_report,
)
from app.bench.methods import ALL_METHODS
from app.bench.tables import (
    TABLE_LEGEND, format_class_speedups, format_mismatches, format_table, format_transformers, kernel_line, write_chart,
)
from app.models_cli import positive_int
from engine.errors import SpecChatError
from engine.events import MAX_K
from engine.text_safety import inert

if TYPE_CHECKING:
    from app.bench.exact import Judge
    from app.bench.run import BenchModels, Run
    from engine.api import ChatBackend
    from engine.progress import ProgressFn
    from engine.config.profiles import ModelProfile
    from engine.chat.session import ChatEngine

__all__ = ["PromptSpec", "ProgressBar", "add_bench_parser", "cmd_bench", "load_prompt_set", "select_prompts"]

def add_bench_parser(sub: Any, add_model_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``bench`` on the CLI's subparsers."""
    bench = sub.add_parser("bench", help="measure plain, speculative and transformers' decoding on the same prompts")
    add_model_options(bench)
    bench.add_argument("--prompts", type=Path, help="a prompt set TOML (default: the shipped one)")
    bench.add_argument("--classes", help="comma-separated prompt classes to run (default: all)")
    bench.add_argument("--per-class", type=int, help="at most this many prompts per class")
    bench.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per reply")
    bench.add_argument("--repeats", type=int, default=3, help="measured rounds after one warm-up (medians over them)")
    bench.add_argument("--methods", help=f"comma-separated subset of {','.join(ALL_METHODS)} (plain always runs)")
    bench.add_argument("--k-range", default="1-6", help="fixed K values for spec and hf-assisted-constant, e.g. 1-6 or 2,4")
    bench.add_argument("--lookup-tokens", type=lookup_tokens, help="prompt_lookup_num_tokens for hf-prompt-lookup (default: the profile's k_max)")
    bench.add_argument("--threads", type=positive_int, help="torch threads, and llama.cpp's -t (default: torch's choice)")
    bench.add_argument("--llama-cpp", metavar="DIR", dest="llama_cpp",
                       help="folder with llama.cpp's llama-server (default: SPECCHAT_LLAMA_CPP, the cache dir "
                            "scripts/build-llama-cpp.sh builds into, then PATH)")
    bench.add_argument("--plain-server", metavar="URL",
                       help="with --server: a second server, same model, speculation off, for the plain side "
                            "(default: the same server with speculative.n_max = 0 per request, where it obeys)")
    bench.add_argument("--json", type=Path, dest="json_out", help="write every figure to this JSON file")
    bench.add_argument("--chart", type=Path, help="write a PNG chart of the speedups (needs matplotlib)")


def method_names(text: str | None) -> list[str]:
    """``--methods``' names (None: every method), checked before any model loads: an empty list
    ran every method, llama-server included, and an unknown name was refused only after the load."""
    if text is None:
        return list(ALL_METHODS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_METHODS]
    if not names or unknown:
        said = f"unknown method(s) {', '.join(unknown)}" if unknown else "no method named"
        raise SpecChatError(f"--methods: {said}; choose from {', '.join(ALL_METHODS)}")
    return names


def parse_k_range(text: str) -> list[int]:
    """``"1-6"`` → [1..6]; ``"2,4,8"`` → [2, 4, 8]; every K from 1 to :data:`~engine.events.MAX_K`."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            values = list(range(lo, min(hi, MAX_K + 1) + 1))  # a range past MAX_K is refused below, unbuilt
            values += [hi] if hi > MAX_K else []
        else:
            values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecChatError(f"--k-range: expected e.g. 1-6 or 2,4, got {text!r}") from None
    if not values or min(values) < 1 or max(values) > MAX_K:
        raise SpecChatError(f"--k-range: need K values from 1 to {MAX_K}, got {text!r}")
    return sorted(set(values))


def lookup_tokens(text: str) -> int:
    """An argparse ``type`` for ``--lookup-tokens``: transformers' prompt_lookup_num_tokens, 1 to 64
    (it took the thread count's checker, whose errors spoke of CPU threads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of tokens, got {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be from 1 to 64 (tokens a prompt lookup proposes), got {value}")
    return value


def _load(args: argparse.Namespace, progress: "ProgressFn | None") -> tuple["ModelProfile", "ChatBackend", list[str]]:
    """The profile and its loaded engine, plus notes about what was not loaded."""
    from app.models_cli import load_for, resolve_profile

    profile = resolve_profile(args)
    engine = load_for(profile, "spec", progress)
    notes = [engine.info.fallback_reason] if engine.info.fallback_reason else []
    return profile, engine, notes


def bench_models(profile: "ModelProfile", engine: "ChatEngine", args: argparse.Namespace) -> "BenchModels":
    """The target, the draft (if the engine holds a model draft) and the reply settings."""
    from app.bench.run import BenchModels

    from engine.load.loader import model_drafter

    target, draft = engine.models()
    tokenizer = getattr(engine, "tokenizer", None)
    make = None
    if draft is not None and profile.draft is not None and tokenizer is not None:
        make = lambda: model_drafter(profile, draft, target, tokenizer, engine.device)  # noqa: E731
    return BenchModels(
        target=target,
        device=engine.device,
        draft=draft,
        make_drafter=make,
        tokenizer=tokenizer,
        window=getattr(engine, "window", None),
        stop_ids=tuple(engine.stop_ids),
        k_min=profile.k_min,
        k_max=profile.k_max,
        lookup_k=args.lookup_tokens or profile.k_max,
        max_new_tokens=args.max_new_tokens,
    )


def build_report(args: argparse.Namespace, profile: "ModelProfile", engine: "ChatBackend", models: "BenchModels",
                 runs: Sequence["Run"],
                 notes: Sequence[str], judge: "Judge | None" = None) -> dict[str, Any]:
    """The JSON document: machine, settings, results, mismatches and every run.

    ``judge`` (CUDA) sorts differing outputs into mismatches and near-tie flips."""
    from app.bench.exact import NEAR_TIE_LOGITS, counted, exactness, flips, split_by_engine
    from app.bench.probes import PeakMemory, machine_info
    from app.bench.stats import mismatches, reference_outputs, run_record, summarise

    info = engine.info
    found, theirs = split_by_engine(mismatches(runs, reference_outputs(runs), judge))
    return {
        "machine": machine_info(models.device),
        "profile": {"name": profile.name, "target": info.target, "drafter": info.drafter, "mode": info.mode,
                    "quantization": info.quantization, "target_bytes": info.target_bytes, "draft_bytes": info.draft_bytes},
        "settings": {
            "argv": sys.argv[1:], "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "warmup": 1,
            "greedy": True, "identical": exactness(judge is not None, getattr(judge, "tolerance", NEAR_TIE_LOGITS)), "k_range": parse_k_range(args.k_range), "k_min": models.k_min, "k_max": models.k_max,
            "lookup_tokens": models.lookup_k, "stop_token_ids": list(models.stop_ids),
            "peak_memory": PeakMemory(models.device).kind,
            "tokens_per_s": "decode: tokens after the first emission over the time after it (the first emission "
                            "includes the prefill); tokens_per_s_e2e: all new tokens over the whole call",
            "speedup": "median over repeats of (method rate / plain rate in the same repeat and prompt class)",
            "engine_speedup": "the engine's self-reported speedup (ReplyStats.speedup, its own plain estimate; specchat "
                              "methods only), combined per repeat as tokens / sum(tokens / speedup), median over "
                              "repeats; engine_over_bench = engine_speedup / speedup (the cross-check: near 1)",
            "time_split": "draft / verify = time inside the draft / target forward passes (prefill included), other = the rest",
            "adaptive_methods": "spec-adaptive and ngram run with the app's decoder defaults (rare calibration steps, "
                                "auto switch-off); plain and fixed-K runs keep the calibration steps, never switch off",
            "hf_assisted": "the draft's own generation_config (transformers' defaults where unset)",
            "hf_confidence_threshold_adapts": _sklearn_available(),
            "hf_assisted_constant": "num_assistant_tokens=K, num_assistant_tokens_schedule='constant', assistant_confidence_threshold=0",
        },
        "notes": list(notes),
        "results": summarise(runs, judge),
        "mismatches": counted(found),
        "near_tie_flips": flips(found),
        "transformers_differences": theirs,
        "runs": [run_record(r) for r in runs],
    }


def _sklearn_available() -> bool:
    """transformers adapts the assistant's confidence threshold only when scikit-learn is installed."""
    from transformers.utils import is_sklearn_available

    return bool(is_sklearn_available())


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark; exit status 1 when any greedy output differs from plain decoding."""
    from app.bench.server import cmd_bench_server, server_bench_profile

    args.json_out = check_output(args.json_out, "--json")
    args.chart = check_output(args.chart, "--chart")
    server = server_bench_profile(args)
    if server is not None:  # --server URL, or a backend = "server" profile
        return cmd_bench_server(args, server)
    import torch
    from transformers.utils import logging as hf_logging

    from app.bench.run import plan_assisted, run_bench
    from app.bench.exact import near_tie_judge
    from app.bench.llamacpp import llama_servers, plan_llama, plan_report
    from app.bench.methods import plan_methods
    from app.models_cli import progress_line
    from app.bench.llamacpp_tools import find_llama_cpp

    if args.repeats < 1 or args.max_new_tokens < 1:
        raise SpecChatError("--repeats and --max-new-tokens must be at least 1")
    k_values = parse_k_range(args.k_range)
    names = method_names(args.methods)
    specs = select_prompts(load_prompt_set(args.prompts), args.classes, args.per_class)
    if args.threads:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    if args.llama_cpp:  # a wrong --llama-cpp folder fails before the models load
        find_llama_cpp(args.llama_cpp)
    with progress_line() as progress:
        profile, engine, notes = _load(args, progress)
    try:
        models = bench_models(profile, engine, args)
        try:
            methods, skipped = plan_methods(names, k_values, models.draft is not None, models.lookup_k)
        except ValueError as exc:
            raise SpecChatError(f"--methods: {exc}") from None
        notes += skipped
        methods, assisted_notes = plan_assisted(models, methods)
        notes += assisted_notes
        prompts = render(specs, engine.prompt_ids)
        threads = args.threads or torch.get_num_threads()
        methods, llama = plan_llama(methods, profile, threads, prompts, args.max_new_tokens, args.llama_cpp)
        notes += llama.notes
        for note in notes:
            print(f"specchat bench: {note}", file=sys.stderr)
        with llama_servers(llama, args.max_new_tokens) as models.external:
            runs = run_bench(models, prompts, methods, args.repeats, ProgressBar())
        judge = near_tie_judge(models.target, models.device, {p.name: p.ids for p in prompts})
        report = build_report(args, profile, engine, models, runs, notes, judge)
        report["llama_cpp"] = plan_report(llama, args.max_new_tokens)
        if "llama_bench" in report["llama_cpp"]:
            report["machine"]["llama_bench"] = report["llama_cpp"]["llama_bench"]
    finally:
        engine.close()
    return _output(report, args)


def _output(report: dict[str, Any], args: argparse.Namespace) -> int:
    """Files first (a closed stdout must not lose them), then the table, then any mismatch, loudly."""
    from app.bench.exact import format_flips

    results = report["results"]
    written = write_report(report, args.json_out) if args.json_out else True
    if args.chart:
        print(write_chart(results, args.chart), file=sys.stderr)
    print(inert(f"{report['profile']['name']}: {report['profile']['target']} + {report['profile']['drafter']} "
                f"on {report['machine']['device']}, {args.max_new_tokens} new tokens, {args.repeats} repeat(s)"))
    kernel = kernel_line(report["machine"])
    if kernel:
        print(inert(kernel))
    print(format_table(results))
    print()
    print(format_class_speedups(results))
    print()
    print(TABLE_LEGEND)
    if report.get("near_tie_flips"):
        print(format_flips(report["near_tie_flips"]), file=sys.stderr)
    if report.get("transformers_differences"):
        print(format_transformers(report["transformers_differences"]), file=sys.stderr)
    if report["mismatches"]:
        print(format_mismatches(report["mismatches"]), file=sys.stderr)
        return 1
    return 0 if written else 1
