"""A reply's ``(text, source)`` runs: adjacent runs of one source merged, empty ones dropped."""
from __future__ import annotations

from app.store.pieces import extend_pieces, merge_pieces


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
