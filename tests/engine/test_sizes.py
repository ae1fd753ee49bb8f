"""parse_size: byte counts as people write them, and a message saying how to write one."""
from __future__ import annotations

import pytest

from engine.errors import ProfileError
from engine.sizes import parse_size


@pytest.mark.parametrize(
    "text, expected",
    [(1024, 1024), ("1024", 1024), ("2GiB", 2 * 2**30), ("512MB", 512 * 10**6), ("1.5 G", 3 * 2**29),
     ("64 kib", 65536), ("3gb", 3 * 10**9), ("10B", 10)],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "2 GiBs", "-1", 0, -5, "1e9", True, "0MB"])
def test_parse_size_rejects(text: str | int) -> None:
    with pytest.raises(ProfileError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize(
    "text, expected",
    [("2TB", 2 * 10**12), ("1t", 2**40), ("3 TiB", 3 * 2**40), (".5k", 512), ("1.", 1), (" 7 MiB ", 7 * 2**20),
     ("1.5B", 1)],  # a fraction of a byte is dropped
)
def test_units_fractions_and_spaces(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_a_malformed_size_says_how_to_write_one() -> None:
    with pytest.raises(ProfileError) as err:
        parse_size("lots")
    assert str(err.value) == "invalid size 'lots': use bytes or a number with a unit, e.g. 2GiB, 512MB, 1.5GB"
    with pytest.raises(ProfileError, match=r"^invalid size True: use bytes or a number with a unit"):
        parse_size(True)  # a TOML boolean is not 1 byte


@pytest.mark.parametrize("text, shown", [(0, "0"), (-5, "-5"), ("0MB", "'0MB'"), ("0.5B", "'0.5B'"),
                                          ("-1GiB", "'-1GiB'"), (" -2", "' -2'")])
def test_zero_or_less_says_it_must_be_positive(text: str | int, shown: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_size(text)
    assert str(err.value) == f"invalid size {shown}: it must be positive"


def test_a_fraction_without_a_unit_asks_for_one() -> None:
    """``--memory-budget 0.5`` said "it must be positive" (it was read as half a byte)."""
    with pytest.raises(ProfileError) as err:
        parse_size("0.5")
    assert str(err.value) == "invalid size '0.5': that is less than one byte; give a unit, e.g. 0.5GB"
