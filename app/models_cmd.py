"""``specchat models``: the downloaded models, their size on disk and the profiles using them;
``specchat models remove NAME|PROFILE`` deletes one's files from the cache (and nothing else)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from engine.errors import ProfileError, SpecChatError
from engine.text_safety import inert

if TYPE_CHECKING:
    from engine.fetch.inventory import CachedModel


def add_models_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """``models`` and ``models remove``."""
    models = sub.add_parser("models", help="list the downloaded models with their size on disk, or remove one")
    models.add_argument("--models", type=Path, default=argparse.SUPPRESS,
                        help="an extra models.toml whose profiles count as users (also: SPECCHAT_MODELS)")
    models.add_argument("--json", action="store_true", help="print one JSON object: the cache dir and its models")
    actions = models.add_subparsers(dest="models_command")
    rm = actions.add_parser("remove", help="delete a model's files from the cache (downloaded, converted, int4)")
    rm.add_argument("name", help="a model's name as `specchat models` lists it, or a profile: all the models it uses")
    rm.add_argument("--yes", "-y", action="store_true", help="do not ask before deleting")
    rm.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                    help="print one JSON object (what was deleted) on stdout; the rest goes to stderr")


def human(n: int) -> str:
    """``93_100_000 -> "93 MB"``, ``1_630_000_000 -> "1.63 GB"`` (decimal, as downloads are given)."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e3:.0f} kB"


def _say(text: str, stream: TextIO | None = None) -> None:
    """Print ``text`` with its control characters shown, not obeyed: the cache's file names come
    from wheels and profiles, and a name holding ``ESC ] 52`` would write the clipboard."""
    print(inert(text), file=stream or sys.stdout)


def cmd_models(args: argparse.Namespace, ask: Callable[[str], str] | None = None) -> int:
    """List the cache's models, or remove one (``ask`` asks for the confirmation; default: input)."""
    from engine.config.models_file import MODELS_ENV, load_profiles
    from engine.fetch.inventory import inventory
    from engine.paths import cache_dir, make_dir

    try:
        profiles = load_profiles(getattr(args, "models", None))
    except ProfileError as exc:  # the cache can still be listed and cleaned without the extra file's profiles
        if getattr(args, "models", None) is None and not os.environ.get(MODELS_ENV, "").strip():
            raise
        print(inert(f"specchat models: {exc}; its profiles are not counted as users"), file=sys.stderr)
        profiles = load_profiles(from_env=False)
    root = cache_dir()
    if root.exists() and not root.is_dir():  # read as an empty cache: "No models downloaded yet"
        make_dir(root, "SPECCHAT_CACHE_DIR")  # says what is in the way, and the variable that moves it
    models = inventory([profiles.get(name) for name in profiles.names()], root)
    if args.models_command == "remove":
        return _remove(args, models, root, ask or input, profiles.names())
    if args.json:
        rows = [{"name": m.name, "bytes": m.size, "profiles": m.profiles,
                 "files": [{"kind": f.kind, "path": str(f.path), "bytes": f.size} for f in m.files]} for m in models]
        print(json.dumps({"cache_dir": str(root), "models": rows}, indent=2))
        return 0
    if not models:
        _say(f"No models downloaded yet (cache: {root}). A profile downloads its models the first time it is used.")
        return 0
    width = max(len(m.name) for m in models)
    _say(f"Models in {root} ({human(sum(m.size for m in models))} in all):\n")
    for m in models:
        users = f"used by {', '.join(m.profiles)}" if m.profiles else "used by no profile"
        _say(f"  {m.name:<{width}}  {human(m.size):>9}  {users}")
        for f in m.files:
            _say(f"  {'':<4}{f.kind:<15} {human(f.size):>9}  {f.path.relative_to(root)}")
    _say("\nRemove one with `specchat models remove NAME` (or a profile's name: every model it uses).")
    return 0


def _remove(args: argparse.Namespace, models: "list[CachedModel]", root: Path, ask: Callable[[str], str],
            profile_names: Sequence[str] = ()) -> int:
    from engine.fetch.inventory import matching, remove

    chosen = matching(models, args.name)
    if not chosen:
        known = ", ".join(m.name for m in models) or "none: the cache is empty"
        if args.name in profile_names:  # it was said to be no profile at all
            raise SpecChatError(f"profile {args.name!r} has nothing downloaded in {root} (downloaded: {known})")
        raise SpecChatError(f"no downloaded model or profile is called {args.name!r} (downloaded: {known})")
    total = sum(m.size for m in chosen)
    users = sorted({p for m in chosen for p in m.profiles})
    as_json = bool(getattr(args, "json", False))
    say = partial(_say, stream=sys.stderr if as_json else sys.stdout)  # stdout holds only the JSON
    say(f"This deletes {human(total)} from {root}:")
    for m in chosen:
        say(f"  {m.name} ({human(m.size)}, {len(m.files)} {'entry' if len(m.files) == 1 else 'entries'})")
    if users:
        say(f"Used by {', '.join(users)}: the next start of {'it' if len(users) == 1 else 'any of them'} "
            "downloads it again.")
    if not args.yes:
        try:
            answer = _ask(ask, "Delete? [y/N] ", on_stderr=as_json)
        except EOFError:  # no answer (stdin closed): the question's line ends here, not under "Nothing deleted."
            answer = ""
            say("")
        if answer.strip().lower() not in ("y", "yes"):
            say("Nothing deleted.")
            if as_json:
                print(json.dumps({"cache_dir": str(root), "removed": [], "freed_bytes": 0}))
            return 1
    removed = [(m, remove(m, root)) for m in chosen]
    freed = sum(n for _, n in removed)
    say(f"Deleted {human(freed)}.")
    if as_json:
        print(json.dumps({"cache_dir": str(root), "removed": [{"name": m.name, "bytes": n} for m, n in removed],
                          "freed_bytes": freed}))
    return 0


def _ask(ask: Callable[[str], str], question: str, on_stderr: bool) -> str:
    """``ask(question)``. With ``input``: the question on stderr when ``on_stderr`` (stdout then
    holds only the JSON), and a closed stdin (``<&-``) read as the input's end, EOFError: input()
    raised "RuntimeError: lost sys.stdin", a traceback."""
    if ask is not input:
        return ask(question)
    if not on_stderr and sys.stdin is not None:
        return input(question)
    print(question, end="", file=sys.stderr if on_stderr else sys.stdout, flush=True)
    if sys.stdin is None:
        raise EOFError
    return input()
