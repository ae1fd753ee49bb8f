"""A chat's own sampling: temperature, top-p, top-k and seed, each over its profile's value.

Set in the sampling dialog (:mod:`app.ui.screens.sampling`), saved with the chat (the
``sampling`` JSON column, :mod:`app.store.schema` step 4), sent with every request
(:func:`app.ui.requests.generation_params`) and shown on the prompt box's border. A
value left unset follows the profile; no seed means each reply draws fresh randomness
(ctrl+r answers differently when T > 0), a seed makes a reply reproducible.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from engine.events import MIN_TEMPERATURE, SEED_LIMIT

if TYPE_CHECKING:
    from engine.events import ReplySettings

@dataclass(frozen=True)
class ChatSampling:
    """A chat's sampling overrides; None follows the profile (for the seed: no seed)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None

    def to_dict(self) -> dict[str, Any] | None:
        """What the history keeps: the values that are set (None when none is)."""
        data = {key: value for key, value in asdict(self).items() if value is not None}
        return data or None

    @classmethod
    def from_dict(cls, data: object) -> "ChatSampling":
        """Read back what :meth:`to_dict` saved; a value that is missing or invalid (an
        edited or damaged file) follows the profile instead of breaking the chat."""
        if not isinstance(data, dict):
            return cls()
        fields = {key: str(data[key]) for key in ("temperature", "top_p", "top_k", "seed")
                  if isinstance(data.get(key), (int, float)) and not isinstance(data.get(key), bool)}
        out = {}
        for key, text in fields.items():
            parsed = parse_sampling(**{key: text})
            if isinstance(parsed, ChatSampling):
                out[key] = getattr(parsed, key)
        return cls(**out)

    def overrides(self) -> dict[str, Any]:
        """Keyword arguments for :func:`engine.events.generation_params`."""
        return asdict(self)

    def label(self, profile: "ReplySettings | None") -> str:
        """A short line for the prompt box's border, e.g. ``T 0.7 · top-p 0.9 · seed 42``:
        empty while the chat is greedy by its profile (nothing to say)."""
        temperature = self.temperature if self.temperature is not None else (
            profile.temperature if profile is not None else 0.0)
        if temperature <= 0:
            return "greedy" if self.to_dict() else ""
        top_p = self.top_p if self.top_p is not None else (profile.top_p if profile is not None else 1.0)
        top_k = self.top_k if self.top_k is not None else (profile.top_k if profile is not None else 0)
        parts = [f"T {exact(temperature)}"]
        if top_p < 1:
            parts.append(f"top-p {exact(top_p)}")
        if top_k > 0:
            parts.append(f"top-k {top_k}")
        parts.append(f"seed {self.seed}" if self.seed is not None else "no seed")
        return " · ".join(parts)

    def own_label(self) -> str:
        """Only the values the chat sets, e.g. ``T 0.7 · seed 5`` (where the profile is not at
        hand: an export read "greedy" for a chat whose profile samples at 0.7); empty when none is."""
        parts = [f"{name} {exact(value) if isinstance(value, float) else value}"
                 for name, value in (("T", self.temperature), ("top-p", self.top_p), ("top-k", self.top_k),
                                     ("seed", self.seed)) if value is not None]
        return " · ".join(parts)


def exact(value: float) -> str:
    """``value`` as the shortest text that reads back as the same float (``0.7000001``, ``1``,
    ``1e+300``): ``:g`` showed 0.9999999 as "top-p 1", and saving the dialog again stored 1."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


QUOTED_CHARS = 40
"""The most of a wrong value an error quotes: a 5,000-digit paste filled the dialog and pushed its
fields and buttons off the screen."""


@dataclass(frozen=True)
class BadValue:
    """A field the dialog cannot take: which one, and a sentence saying what it takes."""

    field: str
    message: str


def parse_sampling(temperature: str = "", top_p: str = "", top_k: str = "",
                   seed: str = "") -> ChatSampling | BadValue:
    """The dialog's fields as a :class:`ChatSampling` (a blank field: the profile's value,
    or no seed), or the first field that is wrong."""
    values: dict[str, Any] = {}
    rules: tuple[tuple[str, str, Callable[[str], float | int | None], Callable[[Any], bool], str], ...] = (
        ("temperature", temperature, _number, lambda v: v == 0 or v >= MIN_TEMPERATURE,
         f"Temperature must be 0 (greedy) or a number of at least {MIN_TEMPERATURE:g}"),
        ("top_p", top_p, _number, lambda v: 0 < v <= 1,
         "Top-p must be a number above 0 and at most 1 (1 keeps every token)"),
        ("top_k", top_k, _whole, lambda v: v >= 0,
         "Top-k must be a whole number of 0 or more (0 keeps every token)"),
        ("seed", seed, _whole, lambda v: 0 <= v < SEED_LIMIT,
         f"The seed must be a whole number from 0 to {SEED_LIMIT - 1}, or blank for none"),
    )
    for name, raw, read, valid, rule in rules:
        text = raw.strip()
        if not text:
            continue
        value = read(text)
        if value is None or not valid(value):
            shown = text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS] + "…"
            return BadValue(name, f"{rule}, not “{shown}”.")
        values[name] = value
    return ChatSampling(**values)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _whole(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
