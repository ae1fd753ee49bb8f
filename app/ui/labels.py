"""Short names the screens show: a model, a profile's pair, a chat's title."""
from __future__ import annotations

from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from engine.api import EngineInfo
    from engine.config.profiles import ModelProfile, ModelSpec


def spec_label(spec: "ModelSpec") -> str:
    """The model's short name; ``ModelSpec.label`` already carries its quantization."""
    label = getattr(spec, "label", None)
    if label:
        return str(label)
    if spec.quantization and spec.quantization != "none":
        return f"{spec.source} ({spec.quantization})"
    return spec.source


def header_title(profile: "ModelProfile | None", private: bool = False, dropped_for: str | None = None) -> str:
    """The header's second part: the profile and its models, after "private chat" in one;
    ``dropped_for``: the drafter that runs in place of a draft model the engine dropped."""
    parts = ["private chat"] if private else []
    if profile is not None:
        parts.append(f"{profile.name} · {profile_pair(profile, dropped_for)}")
    return " · ".join(parts)


def dropped_drafter(profile: "ModelProfile | None", info: "EngineInfo | None") -> str | None:
    """What drafts in place of the drafter ``profile`` names, where the engine dropped it: ``"none"``
    (decoding plainly: dropped while decoding, out of memory) or ``"ngram"`` (a draft model dropped
    at load, for memory or a tokenizer that differs: its lookup mode, or no draft bytes loaded, says
    so); None where it runs as its profile says. The HUD and the header read it alike."""
    if profile is None or info is None or profile.drafter == "none":
        return None
    if info.drafter == "none":
        return "none"
    if profile.drafter == "model" and (info.mode == "ngram" or not info.draft_bytes):
        return "ngram"
    return None


def profile_pair(profile: "ModelProfile", dropped_for: str | None = None) -> str:
    """``"target ← draft"`` with quantizations, or the n-gram/none drafter; with ``dropped_for``,
    the drafter that replaced the profile's draft model, said so. For a server profile, the model
    and the server's address."""
    server = getattr(profile, "server", None)
    if server is not None:
        return f"{server.model or 'its first model'} @ {server.root} (server)"
    target = spec_label(profile.target)
    if dropped_for == "none":
        return f"{target} (drafter dropped: plain decoding)"
    if dropped_for is not None:
        return f"{target} ← n-gram lookup (draft model dropped)"
    if profile.drafter == "model" and profile.draft is not None:
        return f"{target} ← {spec_label(profile.draft)}"
    if profile.drafter == "ngram":
        return f"{target} ← n-gram lookup"
    if profile.drafter == "suffix":
        return f"{target} ← suffix lookup (this chat and earlier ones)"
    return f"{target} (no drafter)"


TITLE_SHOWN = 100
"""The most characters of a chat's title shown (the list, the header, dialogs, notices)."""


def message_count(n: int) -> str:
    """``n`` messages in words: "1 message", "2 messages"."""
    return f"{n} message{'' if n == 1 else 's'}"


UNTITLED = "(untitled)"


def one_line(text: str, limit: int) -> str:
    """``text`` on one line (its white space run together), at most ``limit`` characters, with …
    where it was cut."""
    flat = " ".join(text[: limit * 4].split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def shown_title(title: str, limit: int = TITLE_SHOWN) -> str:
    """A saved title as shown: :func:`one_line`, at most ``limit`` characters. Titles are renamed
    by hand or come from a history file: one of 100,000 characters wrapped into 1,400 rows of the
    chats list, re-wrapped at each key typed into its search (minutes). An empty one (a history
    file edited) reads "(untitled)": the list showed only its badge."""
    return one_line(title, limit) or UNTITLED


def chat_title(prompt: str, limit: int = 48) -> str:
    """A chat title from its first prompt: first line, shortened."""
    line = next((ln.strip() for ln in prompt.splitlines() if ln.strip()), "New chat")
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"
