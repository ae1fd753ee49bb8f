"""A reply's text as ``(text, source)`` runs: which tokens a drafter proposed and the
target accepted, and which the target produced itself (the colour view reads them).

A run's source is ``"target"`` or the drafter of its accepted tokens: ``"draft"`` (a
draft model; also every accepted token of replies saved before origins were kept),
``"chat"`` (copied from this chat's earlier text) or ``"history"`` (from earlier chats).
"""
from __future__ import annotations

from collections.abc import Iterable

from engine.events import DraftOrigin, TextPiece

Pieces = list[tuple[str, str]]
"""Reply text as ``(text, source)`` runs, adjacent runs of one source merged."""

PIECE_SOURCES = ("draft", "chat", "history", "target")
_BY_ORIGIN: dict[DraftOrigin | None, str] = {"model": "draft", "chat": "chat", "history": "history", None: "draft"}


def drafted_source(origin: DraftOrigin | None) -> str:
    """The run source of a draft token proposed by ``origin`` (None: not known)."""
    return _BY_ORIGIN[origin]


def piece_runs(pieces: Iterable[TextPiece]) -> Iterable[tuple[str, str]]:
    """The engine's pieces as ``(text, source)`` runs (sources as in the module docstring)."""
    for p in pieces:
        yield p.text, "target" if p.source == "target" else drafted_source(p.origin)


def merge_pieces(pieces: Iterable[tuple[str, str]]) -> Pieces:
    """Merge adjacent runs that share a source, dropping empty ones."""
    merged: Pieces = []
    extend_pieces(merged, pieces)
    return merged


def extend_pieces(pieces: Pieces, new: Iterable[tuple[str, str]]) -> None:
    """Append ``new`` runs to ``pieces`` in place, merging with the last run (O(new))."""
    for text, source in new:
        if not text:
            continue
        if pieces and pieces[-1][1] == source:
            pieces[-1] = (pieces[-1][0] + text, source)
        else:
            pieces.append((text, source))
