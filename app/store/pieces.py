"""A reply's text as ``(text, source)`` runs: which tokens the draft proposed and the
target accepted, and which the target produced itself (the colour view reads them)."""
from __future__ import annotations

from collections.abc import Iterable

Pieces = list[tuple[str, str]]
"""Reply text as ``(text, source)`` runs, adjacent runs of one source merged."""


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
