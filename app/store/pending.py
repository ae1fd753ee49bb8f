"""What the history saver is handed: a chat that may not be written yet, and a reply to save.

:class:`ChatRef` is shared by the conversation and the saver (:mod:`app.store.saver`), so a
chat the saver creates, or moves after it was deleted elsewhere, is the one the user goes on in;
:class:`ReplyRecord` is one prompt and its reply as they should be saved.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from app.store.pieces import Pieces

RECOVERED = " (recovered)"
"""Added to a deleted chat's title to name the new chat its unsaved exchanges go to."""


@dataclass(eq=False)
class ChatRef:
    """A chat that may not be in the database yet (created by the saver's first write)."""

    title: str
    profile: str | None = None
    system_prompt: str | None = None
    sampling: dict[str, Any] | None = None
    """The chat's own sampling, saved with it when the saver creates it."""
    id: int | None = None
    deleted_id: int | None = None
    """Set while its unsaved exchanges wait to be written to a new chat: the id deleted elsewhere."""


Setting = Literal["profile", "system_prompt", "sampling"]
"""A chat setting the saver writes from its :class:`ChatRef` (a rename, in F3, is written there, once)."""
SETTINGS: tuple[Setting, ...] = ("profile", "system_prompt", "sampling")


class SupportsToDict(Protocol):
    """Statistics the saver turns into a dict only when it writes them (an engine's frozen
    ``ReplyStats``): the reply worker hands over every round's, the saver writes about one a second."""

    def to_dict(self) -> dict[str, Any]: ...


Stats = dict[str, Any] | SupportsToDict | None
"""A reply's statistics as handed to :meth:`HistorySaver.update`."""


def stats_dict(stats: Stats) -> dict[str, Any] | None:
    """``stats`` as the history stores them."""
    return stats if stats is None or isinstance(stats, dict) else stats.to_dict()


@dataclass
class ReplyRecord:
    """One prompt and its reply as they should be saved; ``version`` counts updates."""

    chat: ChatRef
    prompt: str
    profile: str | None
    text: str = ""
    pieces: Pieces = field(default_factory=list)
    stats: Stats = None
    finish: str | None = None
    version: int = 0
    written: int = -1
    user_id: int | None = None
    assistant_id: int | None = None
    supersedes: "ReplyRecord | int | None" = None
    """The earlier exchange an edited prompt replaces: its prompt's row id, or its record
    (whose rows are written first: the saver writes in order)."""

    @property
    def saved(self) -> bool:
        return self.written == self.version and self.finish is not None
