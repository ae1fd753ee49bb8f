"""F7 says "Copied" only where a clipboard took the text: a desktop tool that succeeded; otherwise
it says what it sent to the terminal (OSC 52) and what to set (issue 37: "F7 says Copied where no
clipboard received anything")."""
from __future__ import annotations

import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from app.ui import clipboard
from app.ui.app import SpecChatApp
from app.ui.clipboard import desktop_copy, sent_notice
from tests.app.helpers import ready
from tests.app.ui.test_turns import asked


def fake_tool(folder: Path, name: str, code: int = 0) -> Path:
    """A clipboard tool that writes what it reads to ``<name>.out`` and exits with ``code``."""
    out = folder / f"{name}.out"
    script = folder / name
    script.write_text(f"#!/bin/sh\n{shutil.which('cat')} > '{out}'\nexit {code}\n")  # PATH holds the fakes only
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return out


def test_the_first_tool_with_its_desktop_that_succeeds_takes_the_text(tmp_path: Path) -> None:
    out = fake_tool(tmp_path, "xclip")
    env = {"PATH": str(tmp_path), "DISPLAY": ":0"}
    assert desktop_copy("héllo\nworld", env, platform="linux") == "xclip"
    assert out.read_text(encoding="utf-8") == "héllo\nworld"
    assert desktop_copy("x", {"PATH": str(tmp_path)}, platform="linux") is None  # no X display: not used
    wl = fake_tool(tmp_path, "wl-copy", code=1)  # a Wayland tool that fails: the next one is tried
    assert desktop_copy("y", {**env, "WAYLAND_DISPLAY": "wayland-0"}, platform="linux") == "xclip"
    assert wl.read_text() == "y" and out.read_text() == "y"


def test_no_tool_at_all_is_none(tmp_path: Path) -> None:
    assert desktop_copy("x", {"PATH": str(tmp_path), "DISPLAY": ":0", "WAYLAND_DISPLAY": "w"}, platform="linux") is None
    fake_tool(tmp_path, "pbcopy")
    assert desktop_copy("x", {"PATH": str(tmp_path)}, platform="linux") is None  # pbcopy is macOS's
    assert desktop_copy("x", {"PATH": str(tmp_path)}, platform="darwin") == "pbcopy"


def test_the_notice_without_a_tool_says_what_was_sent_and_what_to_set() -> None:
    text = sent_notice("the last reply", "12 characters, 1 line", {"TMUX": "/tmp/tmux-0/default,1,0"})
    assert "OSC 52" in text and "set -g set-clipboard on" in text and "Copied" not in text
    assert "tmux" not in sent_notice("the last reply", "12 characters, 1 line", {})




@pytest.mark.anyio
@pytest.mark.parametrize("tool", [None, "xclip"], ids=["terminal only", "desktop tool"])
async def test_f7_says_copied_only_where_a_clipboard_took_it(make_app: Callable[..., SpecChatApp], monkeypatch,
                                                             tool: str | None) -> None:
    taken: list[str] = []
    monkeypatch.setattr(clipboard, "desktop_copy", lambda text: taken.append(text) or tool)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await asked(pilot, "Show me some code")
        await app.run_action("copy_last_reply")
        await pilot.pause()
        last = list(app._notifications)[-1]
        assert taken == [app.clipboard]  # the terminal (OSC 52) and the desktop tool got the same text
        if tool is None:
            assert last.title == "Sent to the terminal" and "OSC 52" in last.message
            assert "Copied" not in last.message
        else:
            assert last.title == "Copied" and "(xclip)" in last.message


@pytest.mark.anyio
async def test_the_copy_notice_counts_the_lines_copied(make_app: Callable[..., SpecChatApp], monkeypatch) -> None:
    """A code block ends with a newline: two lines of code read "3 lines" (a reviewer's F7)."""
    monkeypatch.setattr(clipboard, "desktop_copy", lambda text: "xclip")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        for text, said in (("def f(s):\n    return s[::-1]\n", "29 characters, 2 lines"),
                           ("one line", "8 characters, 1 line"), ("a\n\nb", "4 characters, 3 lines")):
            app.copy_text(text, "the code")
            await pilot.pause()
            assert said in list(app._notifications)[-1].message
