"""A reply's ``(text, source)`` runs: adjacent runs of one source merged, empty ones dropped."""
from __future__ import annotations

from app.store.pieces import PIECE_SOURCES, extend_pieces, merge_pieces, piece_runs
from engine.events import TextPiece


def test_pieces_merge_by_source() -> None:
    pieces = merge_pieces([("a", "draft"), ("b", "draft"), ("", "target"), ("c", "target")])
    assert pieces == [("ab", "draft"), ("c", "target")]
    extend_pieces(pieces, [("d", "target"), ("e", "draft")])
    assert pieces == [("ab", "draft"), ("cd", "target"), ("e", "draft")]


def test_an_empty_run_between_two_of_one_source_does_not_split_them() -> None:
    assert merge_pieces([("x", "draft"), ("", "target"), ("y", "draft")]) == [("xy", "draft")]
    assert merge_pieces([]) == [] and merge_pieces([("", "draft")]) == []


def test_merge_returns_a_new_list_and_extend_changes_the_given_one() -> None:
    source = [("a", "draft")]
    merged = merge_pieces(source)
    extend_pieces(merged, iter([("b", "draft"), ("c", "target")]))  # any iterable, a generator too
    assert merged == [("ab", "draft"), ("c", "target")] and source == [("a", "draft")]


def test_draft_runs_are_named_after_who_drafted_them() -> None:
    pieces = [TextPiece("a", "draft", "chat"), TextPiece("b", "draft", "history"), TextPiece("c", "target"),
              TextPiece("d", "draft", "model"), TextPiece("e", "draft")]  # no origin: a server's, an old reply's
    assert list(piece_runs(pieces)) == [("a", "chat"), ("b", "history"), ("c", "target"), ("d", "draft"), ("e", "draft")]
    assert all(source in PIECE_SOURCES for _, source in piece_runs(pieces))
