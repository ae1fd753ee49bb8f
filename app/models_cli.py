"""What every model-loading command shares: the model options, the profile they
name, loading it, the reply settings, and progress on stderr (the app's CLI
and the bench's both build on this module; neither imports the other's)."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from app.server_cli import load_server, server_profile_from_args
from engine.environment import MAX_THREADS
from engine.errors import SpecChatError
from engine.events import MAX_K, SEED_LIMIT
from engine.text_safety import inert

if TYPE_CHECKING:
    from engine.api import ChatBackend
    from engine.progress import ProgressFn
    from engine.events import GenerationParams
    from engine.config.profiles import ModelProfile


def add_model_options(parser: argparse.ArgumentParser, subcommand: bool = True) -> None:
    """The options shared by every command that loads models.

    On a subcommand they default to "not given" so that options written before
    the subcommand (``specchat --profile X generate ...``) are not overwritten.
    """
    default = argparse.SUPPRESS if subcommand else None
    parser.add_argument("--profile", default=default, help="profile name from models.toml (default: the file's default)")
    parser.add_argument("--models", type=Path, default=default, help="an extra models.toml (also: SPECCHAT_MODELS; default: only the shipped and your own)")
    parser.add_argument("--memory-budget", type=size_option, default=default, metavar="SIZE", help="cap the memory the pair may use, e.g. 2GiB or 800MB (default: no cap beyond free memory)")
    parser.add_argument("--target", type=given("a model source"), default=default, help="target model source (a save_pretrained dir, a .gguf, a hub id, wheel:...; default: the profile's)")
    parser.add_argument("--draft", type=given("a model source"), default=default, help="draft model source sharing the target's tokenizer (needs --target; default: none)")
    parser.add_argument("--server", type=given("the server's URL, e.g. http://127.0.0.1:8080"), default=default,
                        metavar="URL",
                        help="chat with an OpenAI-compatible server (llama-server, vLLM) at URL instead of local models")
    parser.add_argument("--server-model", type=given("the model's name"), default=default, metavar="NAME",
                        help="model to ask the server for (default: its first)")
    parser.add_argument("--api-key-env", type=given("a variable's name"), default=default, metavar="VAR",
                        help="environment variable holding the server's API key")


def given(what: str) -> Callable[[str], str]:
    """An argparse ``type`` that refuses an empty (or blank) value, naming ``what`` it takes:
    ``--target ""`` read as "not given" ran the default profile, exit 0, where the user asked for
    a model of their own."""
    def nonempty(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"is empty: give {what}, or leave the option out")
        return text

    return nonempty


def size_option(text: str) -> int:
    """An argparse ``type``: bytes from a size as people write it (``2GiB``, ``800MB``:
    :func:`engine.sizes.parse_size`), else argparse's one-line usage error. Before, ``profiles``
    and ``models`` took ``--memory-budget=0`` or ``=-1GiB`` without a word."""
    from engine.sizes import parse_size

    try:
        return parse_size(text)
    except SpecChatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number from 1 to :data:`MAX_THREADS` (``--threads``), else
    argparse's one-line usage error naming the option and the value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (the number of CPU threads to use), got {value}")
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_THREADS} (the number of CPU threads to use; "
                                         f"this machine has {os.cpu_count() or 'an unknown number of'} CPUs), got {value}")
    return value


def draft_k(text: str) -> int:
    """An argparse ``type`` for ``--k``: a whole number from 0 to :data:`~engine.events.MAX_K`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if not 0 <= value <= MAX_K:
        raise argparse.ArgumentTypeError(f"must be from 0 (plain decoding) to {MAX_K} tokens drafted a round, "
                                         f"got {value}")
    return value


def seed_value(text: str) -> int:
    """An argparse ``type`` for ``--seed``: a whole number from 0 to ``SEED_LIMIT - 1``, as F10 takes."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be from 0 to {SEED_LIMIT - 1}, got {value}")
    return value


def resolve_profile(args: argparse.Namespace) -> "ModelProfile":
    """The profile named by the model options (``--target`` builds one on the fly)."""
    from engine.config.profiles import profile_from_sources
    from engine.config.models_file import load_profiles

    if args.draft and not args.target:
        raise SpecChatError("--draft needs --target (or choose a profile with --profile)")
    server = server_profile_from_args(args)
    if server is not None:
        profile = server
    elif args.target:
        profile = profile_from_sources(args.target, args.draft)
    else:
        profiles = load_profiles(args.models)
        asked = profiles.invalid.get(args.profile or profiles.default)  # the error below says that one
        for notice in profiles.notices:  # a profile of the user's left out: said, never silent
            if notice != asked:
                print(inert(f"specchat: notice: {notice}"), file=sys.stderr)
        profile = profiles.get(args.profile)
    if args.memory_budget:
        profile = dataclasses.replace(profile, memory_budget=args.memory_budget)  # bytes (size_option)
    return profile


def load_for(profile: "ModelProfile", mode: str = "spec", progress: "ProgressFn | None" = None) -> "ChatBackend":
    """Load the engine for ``profile``; ``mode`` may replace the drafter."""
    from engine.progress import no_progress

    if profile.backend == "server":
        return load_server(profile, mode, progress or no_progress)
    from engine.load.loader import load_engine

    if mode in ("ngram", "suffix"):
        profile = dataclasses.replace(profile, drafter=mode, draft=None)
    elif mode == "plain":
        profile = dataclasses.replace(profile, drafter="none", draft=None)
    from engine.fetch.hublog import hub_messages_as_progress

    progress = progress or no_progress
    with hub_messages_as_progress(progress):  # hub retries as progress lines, not log text
        return load_engine(profile, memory_budget=profile.memory_budget, progress=progress)


def generation_params(args: argparse.Namespace, profile: "ModelProfile") -> "GenerationParams":
    """The reply settings: options given on the command line, else the profile's.

    Checked before any model loads, so a bad value costs no waiting.
    """
    from engine.events import generation_params as params_for

    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise SpecChatError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    try:
        return params_for(profile, args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed, k=args.k)
    except ValueError as exc:
        raise SpecChatError(f"{exc} (check the options, or the profile's sampling keys)") from None


@contextmanager
def progress_line() -> Iterator["ProgressFn | None"]:
    """:func:`stderr_progress` where stderr is a terminal (else None), its line cleared as the block
    ends, however it ends: a ^C or an error while loading left "... 39 of 211 layers  18%" with
    the shell's prompt (or the error) after it on the same line."""
    if not sys.stderr.isatty():
        yield None
        return
    try:
        yield stderr_progress
    finally:
        print("\r\033[K", end="", file=sys.stderr, flush=True)


def stderr_progress(stage: str, fraction: float | None) -> None:
    """Loading progress on stderr, so stdout stays clean for --json (the stage made inert: it
    may name a file or quote a server)."""
    pct = f" {fraction * 100:3.0f}%" if fraction is not None else ""
    print(f"\r\033[K{inert(stage)}{pct}", end="", file=sys.stderr, flush=True)
