"""Command line: the chat app (default), ``generate``, ``profiles``, ``models`` and ``bench``.

Every command that loads models takes the same model options: ``--profile``,
``--models FILE``, ``--memory-budget SIZE`` and ``--target SOURCE [--draft
SOURCE]`` (a pair without a profile, like llama.cpp's ``-m`` / ``-md``).
Errors the user can fix are printed as one line, without a traceback.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.bench.cli import add_bench_parser, cmd_bench
from app.models_cmd import add_models_parser, cmd_models
from app.profiles_cmd import cmd_profiles
from app.models_cli import (
    add_model_options, draft_k, generation_params, load_for, positive_int, progress_line, resolve_profile, seed_value,
    stderr_progress,
)

__all__ = ["add_model_options", "generation_params", "load_for", "main", "resolve_profile", "stderr_progress"]
from app.server_cli import server_profile_from_args
from engine.environment import check as check_environment
from engine.errors import SpecChatError
from engine.text_safety import inert, json_text
from engine.events import MAX_K, SEED_LIMIT

if TYPE_CHECKING:
    from engine.api import ChatBackend
    from engine.events import ChatEvent, ReplyStats


class OutputClosedError(SpecChatError):
    """Standard output is closed (``>&-``): the reply would go nowhere. Exit 1, the status of
    output that cannot be written, not 2 (bad input), as README's "Exit status" says."""


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
    gen.add_argument("--seed", type=seed_value, help="random seed for sampling, for repeatable replies, "
                     f"0 to {SEED_LIMIT - 1} (default: none)")
    gen.add_argument("--k", type=draft_k, help=f"fixed K (tokens drafted per round, 0 to {MAX_K}); default: adaptive")
    gen.add_argument("--threads", type=positive_int, help="torch threads (default: torch's choice, one per core)")

    prof = sub.add_parser("profiles", help="list the model profiles and where each is defined")
    prof.add_argument("--models", type=Path, default=argparse.SUPPRESS, help="an extra models.toml (also: SPECCHAT_MODELS; default: only the shipped and your own)")
    prof.add_argument("--json", action="store_true", help="print one JSON object: the default, files read, profiles")

    add_models_parser(sub)
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


def utf8_text(value: str | bytes, what: str) -> str:
    """``value`` as text: bytes decoded as UTF-8, or a command-line string (whose bytes that are
    not UTF-8 Python keeps as lone surrogates, which the tokenizer cannot take). Raises
    SpecChatError naming ``what`` and the first bad byte's offset."""
    data = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecChatError(f"{what} is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r}): "
                            "convert it first, e.g. iconv -f latin1 -t utf-8") from None


BOM = "\ufeff"
"""U+FEFF: a byte-order mark at the start of a file; elsewhere a zero-width no-break space."""


def blank(text: str) -> bool:
    """Whether ``text`` shows nothing: only whitespace and U+FEFF, which str.strip keeps (a prompt
    of a lone BOM passed as a message)."""
    return not text.replace(BOM, "").strip()


def earlier_chats() -> list[str]:
    """The saved chats' messages the suffix drafter drafts from (the app's own choice of them);
    none where there is no history yet (nothing is created for it)."""
    from app.store.history import DRAFTING_CHARS, History, HistoryError
    from app.store.paths import data_dir

    path = data_dir() / "history.db"
    if not path.is_file():
        return []
    history = History.open(path)
    try:
        return history.drafting_texts(DRAFTING_CHARS)
    except HistoryError:
        return []
    finally:
        history.close()


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.events import ChatMessage

    if sys.stdout is None:  # started with >&-: the reply would go nowhere, and say nothing
        raise OutputClosedError("standard output is closed, so the reply has nowhere to go: leave it open "
                            "or send it to a file (> reply.txt)")
    if args.prompt == "-":
        if sys.stdin is None:
            raise SpecChatError("standard input is closed: pipe the message in, e.g. echo Hello | specchat generate -")
        # a file's byte-order mark is no text of it, as editors read it: the model was given it
        args.prompt = utf8_text(sys.stdin.buffer.read(), "the prompt read from standard input").removeprefix(BOM)
        if blank(args.prompt):
            raise SpecChatError("the prompt read from standard input is empty: pipe the message in, "
                                "e.g. echo Hello | specchat generate -")
    else:
        args.prompt = utf8_text(args.prompt, "the prompt")
    if blank(args.prompt):
        raise SpecChatError("the prompt is empty: give the message to answer, e.g. specchat generate \"Hello\"")
    if args.system is not None:
        args.system = utf8_text(args.system, "--system")
    profile = resolve_profile(args)
    params = generation_params(args, profile)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    with progress_line() as progress:
        engine = load_for(profile, args.mode, progress)
    try:
        if args.mode == "suffix" or (args.mode == "spec" and profile.drafter == "suffix"):
            engine.learn(earlier_chats())  # "lookup in this chat and earlier ones", as the app does
        system = args.system if args.system is not None else profile.system_prompt
        messages = ([ChatMessage("system", system)] if system else []) + [ChatMessage("user", args.prompt)]
        text, ids, last = [], [], None
        try:
            for event in engine.chat(messages, params):
                text.append(event.text)
                ids.extend(event.token_ids)
                last = event
                if event.notice:
                    print(inert(f"specchat: {event.notice}"), file=sys.stderr)
                if not args.json:  # shown, never obeyed: a reply's escape sequences come out visible (--json: raw)
                    print(inert(event.text), end="", flush=True)
        except (SpecChatError, KeyboardInterrupt) as exc:  # failed or ^C mid-reply: the text so far is kept
            how = "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"
            if args.json:  # the same shape as a whole reply's, so a reader needs one parser
                out = _reply_json(profile.name, text, ids, last, engine, how)
                if how == "error":
                    out["error"] = str(exc)
                print(json_for(sys.stdout, out))
            elif text:
                print(flush=True)
            if how == "interrupted" and not args.quiet:
                count = len(ids) or (last.stats.tokens if last is not None else 0)  # a server sends no ids
                print(f"specchat: interrupted after {count} tokens", file=sys.stderr)
            raise
        assert last is not None
        if args.json:
            out = _reply_json(profile.name, text, ids, last, engine, last.finish_reason)
            print(json_for(sys.stdout, out))  # the exact text, its controls as JSON escapes (C1 ones too)
        else:
            print(flush=True)
        if not args.quiet:
            print(f"specchat: {timing_line(last.stats, last.finish_reason)}", file=sys.stderr)
    finally:
        try:
            engine.close()
        except KeyboardInterrupt:  # the reply is out already: a ^C while the models are freed changes nothing
            pass
    return 0


def _reply_json(profile: str, text: list[str], ids: list[int], last: "ChatEvent | None", engine: "ChatBackend",
                finish_reason: str | None) -> dict[str, Any]:
    """The reply as ``generate --json`` prints it, whole or cut short: its text, ids and statistics
    (None: no round came back) with the engine's plan and reasons beside them."""
    stats = None
    if last is not None:
        info = engine.info
        stats = last.stats.to_dict()
        stats.update(plan=info.plan, finish_reason=finish_reason, fallback_reason=info.fallback_reason,
                     compat_note=info.compat_note, cpu_kernel=info.cpu_kernel)
    return {"profile": profile, "text": "".join(text), "token_ids": ids, "stats": stats, "finish_reason": finish_reason}


CUT_SHORT = {"length": "cut at --max-new-tokens", "context": "cut: the context window is full"}
"""A reply's end the timing line names (the app's footer says the same of its replies)."""


def timing_line(stats: "ReplyStats", finish_reason: str | None = None) -> str:
    """The reply's figures on one line: tokens, tok/s, α, τ and the speedup the app shows
    (:func:`app.ui.formatting.speedup_figure`), or why there is none; last, how the reply was
    cut short, if it was (``finish_reason`` "length" or "context")."""
    from app.ui.formatting import fmt_float, fmt_percent, fmt_rate, speedup_figure, spoken_reason, tokens_text

    parts = [tokens_text(stats.tokens), f"{fmt_rate(stats.tokens_per_s)} tok/s"]
    if stats.proposed:  # named and written as the HUD writes them
        parts += [f"accepted {fmt_percent(stats.alpha)}", f"α/token {fmt_float(stats.alpha_per_token)}",
                  f"τ {fmt_float(stats.tau)}"]
    speedup = speedup_figure(stats)
    if speedup is not None:
        parts.append(f"speedup {speedup}")
        if stats.speculation_off_reason:  # switched off during the reply: said, as the HUD says it
            parts.append(spoken_reason(stats.speculation_off_reason))
    elif stats.tokens or stats.mode == "plain":  # no tokens drafted for: no word on how they were decoded
        parts.append("plain decoding" + (f" ({spoken_reason(stats.speculation_off_reason)})"
                                         if stats.speculation_off_reason else ""))
    if finish_reason in CUT_SHORT:
        parts.append(CUT_SHORT[finish_reason])
    return " · ".join(parts)


def cmd_app(args: argparse.Namespace) -> int:
    from app.ui.app import SpecChatApp

    if sys.stdin is None or not sys.stdin.isatty():  # None: started with <&-
        raise SpecChatError("the chat reads its keys from a terminal, and stdin is not one: run specchat in a "
                            "terminal, or `specchat generate -` to answer a prompt read from a pipe")
    budget = args.memory_budget  # bytes, read by --memory-budget's type (size_option)
    if args.draft and not args.target:
        raise SpecChatError("--draft needs --target (or choose a profile with --profile)")
    app = SpecChatApp(args.profile, models_file=args.models, memory_budget=budget, target=args.target,
                      draft=args.draft, server_profile=server_profile_from_args(args))
    app.run()
    if app.exit_note:
        print(app.exit_note, file=sys.stderr)
    return app.return_code or 0  # 128 + signal after SIGTERM/SIGHUP, as a shell reports it


def json_for(stream: Any, obj: Any) -> str:
    """:func:`json_text` of ``obj``, all ASCII (``\\uXXXX`` escapes, the same value) where
    ``stream`` cannot encode the rest (a latin-1 or ASCII locale: ``✓`` in a reply ended the
    command in a UnicodeEncodeError)."""
    text = json_text(obj)
    try:
        text.encode(getattr(stream, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return json.dumps(json.loads(text), ensure_ascii=True)
    return text


class _EngineWarnings(logging.Handler):
    """The engine's warnings (a draft dropped, a kernel not built) as the command's own lines:
    ``specchat: …``, shown inert. Without a handler Python printed them bare, their text
    (a profile's or a model's names) obeyed."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(inert(f"specchat: {record.getMessage()}"), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never end the command
            self.handleError(record)


def engine_warnings_to_stderr() -> None:
    """Route the ``engine`` loggers' warnings through :class:`_EngineWarnings` (once)."""
    logger = logging.getLogger("engine")
    if not any(isinstance(h, _EngineWarnings) for h in logger.handlers):
        logger.addHandler(_EngineWarnings(logging.WARNING))


def _tolerant_output() -> None:
    """Text stdout and stderr cannot encode (a legacy locale, ``PYTHONIOENCODING=latin-1``) is
    written as ``\\u2713`` escapes instead of ending the command with a traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that is closed, or not a plain text one
                pass


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _tolerant_output()
    handlers = {"generate": cmd_generate, "profiles": cmd_profiles, "bench": cmd_bench, "models": cmd_models,
                None: cmd_app}
    try:
        check_environment()  # a bad SPECCHAT_* value is said now, naming it, not deep in a load
        if args.command in ("generate", "bench"):  # the app loads its models in the engine's child
            from engine.fetch.hublog import quiet_transformers

            quiet_transformers()  # imports torch: seconds in which ^C must still end quietly
            engine_warnings_to_stderr()
        return handlers[args.command](args)
    except SpecChatError as exc:
        print(inert(f"specchat: error: {exc}"), file=sys.stderr)
        return 1 if isinstance(exc, OutputClosedError) else 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head -c 5`): stop quietly, like other Unix tools.
        _silence_stdout()
        return 141
    except OSError as exc:  # writing the output failed (`> /dev/full`, a disk that filled up)
        _silence_stdout()
        try:
            print(inert(f"specchat: error: {exc.strerror or exc}"
                        f"{f' ({exc.filename})' if exc.filename else ' writing the output'}"), file=sys.stderr)
        except (OSError, ValueError):
            pass
        return 1


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
