"""The bench's prompt set: read from a file, checked with a message that names it, chosen by class."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.bench.inputs import load_prompt_set, select_prompts
from engine.errors import SpecChatError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prompts.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, says", [
    ("", "has no [[prompt]] entries"),
    ("[[prompt]]\nname = \"a\"\nclass = \"c\"\n", "needs a name, a class and a non-empty messages list"),
    ("[[prompt]]\nname = \"a\"\nclass = \"c\"\nmessages = [{ role = \"robot\", content = \"x\" }]\n",
     "has a message without a valid role and content"),
    ("[[prompt]]\nname = \"a\"\nclass = \"c\"\nmessages = [{ role = \"assistant\", content = \"x\" }]\n",
     "must end with a user message"),
    ("not toml =", "cannot read the prompt set"),
])
def test_a_bad_prompt_set_names_the_file_and_the_fix(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecChatError) as err:
        load_prompt_set(path)
    assert says in str(err.value) and str(path) in str(err.value)


def test_names_must_be_unique(tmp_path: Path) -> None:
    one = "[[prompt]]\nname = \"a\"\nclass = \"c\"\nmessages = [{ role = \"user\", content = \"x\" }]\n"
    with pytest.raises(SpecChatError, match="prompt names must be unique"):
        load_prompt_set(write(tmp_path, one + one))


def test_prompts_are_chosen_by_class_in_order() -> None:
    specs = load_prompt_set()
    chosen = select_prompts(specs, "code,repeat-edit", per_class=2)
    assert [s.prompt_class for s in chosen] == ["code", "code", "repeat-edit", "repeat-edit"]
    with pytest.raises(SpecChatError, match="unknown class"):
        select_prompts(specs, "poetry", None)


@pytest.mark.parametrize("classes", ["", " , "])
def test_classes_naming_none_is_refused_not_read_as_all(classes: str) -> None:
    """``--classes ""`` (an unset shell variable) ran every class."""
    with pytest.raises(SpecChatError, match="--classes names no class; the set has .*code.* \\(leave it out for all\\)"):
        select_prompts(load_prompt_set(), classes, None)
    assert select_prompts(load_prompt_set(), "code,", 1)[0].prompt_class == "code"  # a stray comma is harmless
