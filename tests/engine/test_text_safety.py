"""The sanitizer every boundary uses: controls and escape sequences shown, never obeyed."""
from __future__ import annotations

import json

import pytest

from engine.text_safety import inert, is_inert, json_text
from tests.hostile import ALL, HOSTILE, raw_in


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_sequence_comes_out_inert_and_visible(name: str) -> None:
    out = inert(f"a{HOSTILE[name]}b")
    assert raw_in(out) == [] and is_inert(out)
    assert out.startswith("a") and out.endswith("b")
    assert len(out) >= len(HOSTILE[name]) + 2  # nothing dropped: every character has a stand-in


def test_the_stand_ins() -> None:
    assert inert("\x1b]52;c;cm0gLXJmIH4=\x07") == "␛]52;c;cm0gLXJmIH4=␇"
    assert inert("\x1b[2J") == "␛[2J"
    assert inert("\x9b2J") == "<U+009B>2J"
    assert inert("\x1bP1$r\x1b\\") == "␛P1$r␛\\"
    assert inert("\x00\x08\x7f") == "␀␈␡"
    assert inert("ls \u202e#\u2066 x\u2069\u202c") == "ls <U+202E>#<U+2066> x<U+2069><U+202C>"


def test_right_to_left_text_needs_no_override_and_is_kept() -> None:
    text = "שלום עולם · مرحبا · a\u200fb"  # Hebrew, Arabic, a right-to-left mark (a mark, not an override)
    assert inert(text) is text


def test_text_lines_and_tabs_are_kept() -> None:
    text = "# Title\n\n```py\n\tprint('hi')\n```\nnaïve — ☃ 日本\n"
    assert inert(text) is text
    assert inert("a\r\nb") == "a\nb"
    assert inert("secret\rshown") == "secret␍shown"


def test_pieces_made_inert_one_at_a_time_join_to_the_whole() -> None:
    pieces = [ALL[i:i + 3] for i in range(0, len(ALL), 3)]
    assert "".join(inert(p) for p in pieces) == inert(ALL)


def test_json_text_escapes_c1_and_keeps_the_value() -> None:
    obj = {"text": ALL + "\u2028é"}
    out = json_text(obj)
    assert raw_in(out) == [] and is_inert(out)
    assert "é" in out
    assert json.loads(out) == obj


def test_lone_surrogates_show_as_replacement_characters_and_json_has_no_infinity() -> None:
    """A server's "\\ud800" printed by generate raised UnicodeEncodeError; --json wrote "speedup": Infinity."""
    assert inert("ok \ud800 end") == "ok \ufffd end" and inert("ok \ud800 end").encode("utf-8")
    assert json.loads(json_text({"speedup": float("inf"), "rates": [1.5, float("nan")]})) == {
        "speedup": None, "rates": [1.5, None]}
