"""The bench's inputs and its progress line: the prompt set (``prompts.toml``
or ``--prompts FILE``), the choice by class, rendering with the target's chat
template, and the progress bar on stderr. Shared by the local and the server bench."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from engine.errors import SpecChatError
from engine.events import ChatMessage
from engine.text_safety import inert, json_text

if TYPE_CHECKING:
    from app.bench.run import BenchPrompt

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class PromptSpec:
    """A prompt of the set before rendering: name, class and messages."""

    name: str
    prompt_class: str
    messages: tuple[ChatMessage, ...]


def load_prompt_set(path: Path | None = None) -> list[PromptSpec]:
    """The prompts of a set file (the shipped ``prompts.toml`` by default)."""
    where = str(path) if path else "the shipped prompts.toml"
    try:
        text = path.read_text(encoding="utf-8") if path else resources.files("app.bench").joinpath("prompts.toml").read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SpecChatError(f"cannot read the prompt set {where}: {exc}") from None
    specs = [_prompt_spec(entry, where) for entry in data.get("prompt", [])]
    if not specs:
        raise SpecChatError(f"{where} has no [[prompt]] entries")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SpecChatError(f"{where}: prompt names must be unique")
    return specs


def _prompt_spec(entry: Any, where: str) -> PromptSpec:
    name = entry.get("name") if isinstance(entry, dict) else None
    cls = entry.get("class") if isinstance(entry, dict) else None
    messages = entry.get("messages") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not isinstance(cls, str) or not isinstance(messages, list) or not messages:
        raise SpecChatError(f"{where}: every [[prompt]] needs a name, a class and a non-empty messages list")
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise SpecChatError(f"{where}: prompt {name!r} has a message without a valid role and content")
        out.append(ChatMessage(m["role"], m["content"]))
    if out[-1].role != "user":
        raise SpecChatError(f"{where}: prompt {name!r} must end with a user message")
    return PromptSpec(inert(name), inert(cls), tuple(out))  # shown in progress lines and tables: never obeyed


def select_prompts(specs: Sequence[PromptSpec], classes: str | None, per_class: int | None) -> list[PromptSpec]:
    """The prompts of the chosen classes, at most ``per_class`` of each."""
    if per_class is not None and per_class < 1:
        raise SpecChatError(f"--per-class must be at least 1, got {per_class}")
    wanted = [c.strip() for c in classes.split(",") if c.strip()] if classes is not None else None
    known = {s.prompt_class for s in specs}
    if wanted == []:  # `--classes ""` (an unset shell variable) ran every class, minutes more than asked for
        raise SpecChatError(f"--classes names no class; the set has {', '.join(sorted(known))} (leave it out for all)")
    if wanted and not set(wanted) <= known:
        raise SpecChatError(f"--classes: unknown class(es) {', '.join(sorted(set(wanted) - known))}; the set has "
                            f"{', '.join(sorted(known))}")
    counts: dict[str, int] = {}
    chosen = []
    for spec in specs:
        if wanted and spec.prompt_class not in wanted:
            continue
        counts[spec.prompt_class] = counts.get(spec.prompt_class, 0) + 1
        if per_class is None or counts[spec.prompt_class] <= per_class:
            chosen.append(spec)
    return chosen


def render(specs: Sequence[PromptSpec], to_ids: Callable[[Sequence[ChatMessage]], list[int]]) -> list["BenchPrompt"]:
    """Token-id prompts through the target's chat template (``to_ids``)."""
    from app.bench.run import BenchPrompt

    return [BenchPrompt(s.name, s.prompt_class, tuple(to_ids(s.messages))) for s in specs]


class ProgressBar:
    """A one-line progress bar on a terminal; a line per tenth elsewhere."""

    def __init__(self, stream: TextIO = sys.stderr, width: int = 28) -> None:
        self.stream, self.width = stream, width
        self.tty = stream.isatty()
        self.start = time.perf_counter()
        self._last_tenth = -1

    def __call__(self, done: int, total: int, what: str) -> None:
        frac = done / total if total else 1.0
        elapsed = time.perf_counter() - self.start
        eta = f" eta {elapsed / frac - elapsed:5.0f}s" if 0 < frac < 1 else ""
        bar = "#" * int(frac * self.width) + "." * (self.width - int(frac * self.width))
        line = f"[{bar}] {done}/{total}{eta}  {what}"
        if self.tty:
            end = "\n" if done >= total else ""
            print(f"\r\033[K{line[:160]}", end=end, file=self.stream, flush=True)
        elif int(frac * 10) > self._last_tenth:
            self._last_tenth = int(frac * 10)
            print(line, file=self.stream, flush=True)




def check_output(path: Path | None, option: str) -> Path | None:
    """``path`` ready to be written once the bench is over, checked before any model loads (a bad
    one failed after the whole run, with a traceback, and took the measurements with it); a
    ``--chart`` without a suffix gets ``.png``, as matplotlib would write it anyway."""
    if path is None:
        return None
    if option == "--chart" and not path.suffix:
        path = path.with_suffix(".png")
    if path.is_dir():
        raise SpecChatError(f"{option} {path}: that is a folder; give a file name in it")
    folder = path.parent  # Path("x.json").parent is Path(".")
    if not folder.is_dir():
        raise SpecChatError(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SpecChatError(f"{option} {path}: not writable here")
    return path


def write_report(report: dict[str, Any], path: Path) -> bool:
    """The bench's figures as JSON at ``path`` (checked by :func:`check_output` before the run); a
    write that fails now (a disk that filled since) is said on stderr, and the table still follows.
    Whether it was written: the command then exits 1 (it exited 0, and a script lost the figures)."""
    try:
        path.write_text(json_text(report, indent=1), encoding="utf-8")
        print(f"JSON written to {path}", file=sys.stderr)
        return True
    except OSError as exc:
        print(inert(f"specchat bench: the JSON could not be written to {path}: {exc}"), file=sys.stderr)
        return False
