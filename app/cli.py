"""Command line: the chat app (default), ``generate``, ``profiles`` and ``bench``.

Every command that loads models takes the same model options: ``--profile``,
``--models FILE``, ``--memory-budget SIZE`` and ``--target SOURCE [--draft
SOURCE]`` (a pair without a profile, like llama.cpp's ``-m`` / ``-md``).
Errors the user can fix are printed as one line, without a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app.bench.cli import add_bench_parser, cmd_bench
from app.models_cli import add_model_options, generation_params, load_for, resolve_profile, stderr_progress

__all__ = ["add_model_options", "generation_params", "load_for", "main", "resolve_profile", "stderr_progress"]
from app.server_cli import server_profile_from_args
from engine.errors import SpecChatError

if TYPE_CHECKING:
    from engine.events import ReplyStats


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specchat",
        description="A local chat that runs speculative decoding: faster replies, exactly the target model's output.",
    )
    add_model_options(parser, subcommand=False)
    sub = parser.add_subparsers(dest="command")

    parser.add_argument("--version", action="version", version=f"%(prog)s {specchat_version()}")
    gen = sub.add_parser("generate", help="answer one prompt headless (text, or one JSON object with --json)")
    gen.add_argument("prompt", help="the user message; - reads it from standard input")
    add_model_options(gen)
    gen.add_argument("--mode", choices=["spec", "ngram", "suffix", "plain"], default="spec",
                     help="spec: the profile's drafter; ngram: prompt lookup; suffix: lookup in this chat and "
                          "earlier ones; plain: the target alone")
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    gen.add_argument("--quiet", action="store_true",
                     help="no timing line on stderr (tokens, tok/s, α, τ, speedup)")
    gen.add_argument("--system", help="system prompt (default: the profile's)")
    gen.add_argument("--max-new-tokens", type=int, default=256, help="stop after this many new tokens")
    gen.add_argument("--temperature", type=float, help="0 = greedy (default: the profile's)")
    gen.add_argument("--top-p", type=float, help="nucleus sampling: keep the smallest set of tokens "
                     "whose probabilities sum to this, 0 < p <= 1 (default: the profile's)")
    gen.add_argument("--top-k", type=int, help="sample among the k most likely tokens, 0 = all (default: the profile's)")
    gen.add_argument("--seed", type=int, help="random seed for sampling, for repeatable replies (default: none)")
    gen.add_argument("--k", type=int, help="fixed K (tokens drafted per round); default: adaptive")
    gen.add_argument("--threads", type=int, help="torch threads (default: torch's choice, one per core)")

    prof = sub.add_parser("profiles", help="list the model profiles and where each is defined")
    prof.add_argument("--models", type=Path, default=argparse.SUPPRESS, help="an extra models.toml (also: SPECCHAT_MODELS; default: only the shipped and your own)")
    prof.add_argument("--json", action="store_true", help="print one JSON object: the default, files read, profiles")

    add_bench_parser(sub, add_model_options)
    polish_help(parser)
    return parser


def specchat_version() -> str:
    """The installed package's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specchat")
    except PackageNotFoundError:
        return "(not installed: run ./setup.sh)"


class _HelpFormatter(argparse.HelpFormatter):
    """Adds "(default: X)" to an option's help when it has a default its help does not name."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default not in (None, False, argparse.SUPPRESS) and action.option_strings
                and "default" not in text and not isinstance(action, argparse._VersionAction)):
            text += " (default: %(default)s)"
        return text


def polish_help(parser: argparse.ArgumentParser) -> None:
    """Every parser shows defaults; every subcommand's --help opens with its one-line summary."""
    parser.formatter_class = _HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {a.dest: a.help for a in action._choices_actions}
            for name, subparser in action.choices.items():
                if not subparser.description and summaries.get(name):
                    text = str(summaries[name])
                    subparser.description = text[0].upper() + text[1:] + "."
                polish_help(subparser)


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.events import ChatMessage

    if args.prompt == "-":
        args.prompt = sys.stdin.read()
        if not args.prompt.strip():
            raise SpecChatError("the prompt read from standard input is empty: pipe the message in, "
                                "e.g. echo Hello | specchat generate -")
    if not args.prompt.strip():
        raise SpecChatError("the prompt is empty: give the message to answer, e.g. specchat generate \"Hello\"")
    profile = resolve_profile(args)
    params = generation_params(args, profile)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    progress = stderr_progress if sys.stderr.isatty() else None
    engine = load_for(profile, args.mode, progress)
    if progress:
        print("\r\033[K", end="", file=sys.stderr)
    try:
        system = args.system if args.system is not None else profile.system_prompt
        messages = ([ChatMessage("system", system)] if system else []) + [ChatMessage("user", args.prompt)]
        text, ids, last = [], [], None
        for event in engine.chat(messages, params):
            text.append(event.text)
            ids.extend(event.token_ids)
            last = event
            if event.notice:
                print(f"specchat: {event.notice}", file=sys.stderr)
            if not args.json:
                print(event.text, end="", flush=True)
        assert last is not None
        if args.json:
            stats = last.stats.to_dict()
            stats["plan"] = engine.info.plan
            stats["finish_reason"] = last.finish_reason
            stats["fallback_reason"] = engine.info.fallback_reason
            stats["compat_note"] = engine.info.compat_note
            out = {"profile": profile.name, "text": "".join(text), "token_ids": ids, "stats": stats}
            print(json.dumps(out, ensure_ascii=False))
        else:
            print(flush=True)
        if not args.quiet:
            print(f"specchat: {timing_line(last.stats)}", file=sys.stderr)
    finally:
        engine.close()
    return 0


def timing_line(stats: "ReplyStats") -> str:
    """The reply's figures on one line: tokens, tok/s, α, τ and the speedup the app shows
    (:func:`app.ui.formatting.speedup_figure`), or why there is none."""
    from app.ui.formatting import fmt_float, fmt_rate, speedup_figure, spoken_reason

    parts = [f"{stats.tokens} tokens", f"{fmt_rate(stats.tokens_per_s)} tok/s"]
    if stats.proposed:
        parts += [f"α/token {fmt_float(stats.alpha_per_token)}", f"accepted {fmt_float(stats.alpha)}",
                  f"τ {fmt_float(stats.tau)}"]
    speedup = speedup_figure(stats)
    if speedup is not None:
        parts.append(f"speedup {speedup}")
    else:
        parts.append("plain decoding" + (f" ({spoken_reason(stats.speculation_off_reason)})"
                                         if stats.speculation_off_reason else ""))
    return " · ".join(parts)


def cmd_profiles(args: argparse.Namespace) -> int:
    from engine.load.availability import cuda_present, unavailable_reason
    from engine.config.models_file import load_profiles, user_models_file

    from engine.fetch.sources import is_fetched

    profiles = load_profiles(args.models)
    cuda = cuda_present()
    rows = []
    for name in profiles.names():
        p = profiles.get(name)
        why_not = unavailable_reason(p, cuda=cuda)
        specs = [s for s in (p.target, p.draft) if s is not None and p.backend == "local"]
        by_source = {s.source: s for s in sorted(specs, key=lambda s: s.download_size or 0)}  # one per file
        to_fetch = [s for s in by_source.values() if is_fetched(s) is False]
        rows.append({
            "name": name,
            "default": name == profiles.default,
            "target": p.target.source,
            "target_quantization": p.target.quantization,
            "drafter": p.drafter,
            "draft": p.draft.source if p.draft else None,
            "draft_quantization": p.draft.quantization if p.draft else None,
            "source_file": str(p.source_file) if p.source_file else None,
            "description": p.description,
            "backend": p.backend,
            "url": p.server.url if p.server else None,
            "available": why_not is None,
            "unavailable_reason": why_not,
            "to_download": [s.source for s in to_fetch],
            "download_bytes": (sum(s.download_size for s in to_fetch if s.download_size)
                               if to_fetch and all(s.download_size for s in to_fetch) else None),
        })
    user_file = user_models_file()
    if args.json:
        print(json.dumps({"default": profiles.default, "files": [str(f) for f in profiles.files],
                          "user_models_file": str(user_file), "profiles": rows}, indent=2))
        return 0
    for r in rows:
        mark = "*" if r["default"] else " "
        draft = r["draft"] and f"{r['draft']} [{r['draft_quantization']}]" or r["drafter"]
        if r["backend"] == "server":
            print(f"{mark} {r['name']:<18} server {r['url']} (model {r['target']})")
            print(f"  {'':<18} draft  chosen by the server")
        else:
            print(f"{mark} {r['name']:<18} target {r['target']} [{r['target_quantization']}]")
            print(f"  {'':<18} draft  {draft}")
        print(f"  {'':<18} from   {r['source_file']}")
        if r["to_download"]:
            n = r["download_bytes"]
            size = (f"about {n / 1e9:.2f} GB" if n >= 1e9 else f"about {n / 1e6:.0f} MB") if n else "its models"
            print(f"  {'':<18} first use downloads {size} ({len(r['to_download'])} model(s) not in the cache yet)")
        if r["unavailable_reason"]:
            print(f"  {'':<18} unavailable here: {r['unavailable_reason']}")
    state = "" if user_file.exists() else " (not created yet)"
    print(f"\nYour own profiles go in {user_file}{state}; SPECCHAT_CONFIG_DIR moves it.")
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    from engine.sizes import parse_size

    from app.ui.app import SpecChatApp

    budget = parse_size(args.memory_budget) if args.memory_budget else None
    if args.draft and not args.target:
        raise SpecChatError("--draft needs --target (or choose a profile with --profile)")
    SpecChatApp(args.profile, models_file=args.models, memory_budget=budget, target=args.target, draft=args.draft,
                server_profile=server_profile_from_args(args)).run()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("generate", "bench"):  # the app loads its models in the engine's child
        from engine.fetch.hublog import quiet_transformers

        quiet_transformers()
    handlers = {"generate": cmd_generate, "profiles": cmd_profiles, "bench": cmd_bench, None: cmd_app}
    try:
        return handlers[args.command](args)
    except SpecChatError as exc:
        print(f"specchat: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head -c 5`): stop quietly, like other Unix tools.
        _silence_stdout()
        return 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
