"""The app in a real terminal (tmux): real key decoding for Enter, ctrl+j, Esc, F-keys, ctrl+q.

Uses the fake backend, so it needs no model weights; skipped where tmux is absent.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.tmux import Tmux, saved_messages

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
ROOT = Path(__file__).resolve().parents[3]


def fake_app_env(tmp_path: Path) -> dict[str, str]:
    """The environment ``tests.app.tty_app`` runs in: its history and state in ``tmp_path``."""
    return {**os.environ, "TERM": "xterm-256color", "SPECCHAT_DATA_DIR": str(tmp_path / "data"),
            "SPECCHAT_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    socket = tmp_path / "tmux.sock"
    session = f"specchat-{uuid.uuid4().hex[:8]}"
    env = fake_app_env(tmp_path)
    t = Tmux.start(socket, session, f"{sys.executable} -m tests.app.tty_app; sleep 30", width=120, height=36,
                   cwd=ROOT, env=env)
    try:
        yield t
    finally:
        t.kill_server()


def test_real_terminal_keys(tmux: Tmux) -> None:
    tmux.wait_for("fake:0")
    tmux.keys("-l", "first line")
    tmux.keys("C-j")
    tmux.keys("-l", "second line")
    tmux.keys("Enter")
    screen = tmux.wait_for("12 tokens")  # the reply footer once it finished
    lines = screen.splitlines()
    first = next(i for i, line in enumerate(lines[1:], 1) if "first line" in line)  # below the header, which names the chat
    assert "second line" in lines[first + 1], screen
    assert "Hello there!" in screen
    tmux.keys("F4")
    tmux.wait_for("draft accepted")
    tmux.keys("F1")
    tmux.wait_for("specchat keys")
    tmux.keys("Escape")
    tmux.keys("C-q")
    deadline = time.monotonic() + 10
    while "fake:0" in tmux.screen() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "fake:0" not in tmux.screen()


def test_text_and_enter_in_one_burst_send_whole_messages(tmux: Tmux, tmp_path: Path) -> None:
    """Ten bursts of text + Enter, back to back (a script, or a fast typist on a busy machine)."""
    prompts = [f"Now shorten the text number {i} please" for i in range(10)]
    tmux.wait_for("fake:0")
    for text in prompts:
        tmux.run("send-keys", "-t", tmux.session, text, "Enter")  # one write to the terminal each
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = saved_messages(tmp_path / "data")
        if sum(1 for role, _, finish in rows if role == "assistant" and finish == "eos") == 10:
            break
        time.sleep(0.2)
    rows = saved_messages(tmp_path / "data")
    assert [content for role, content, _ in rows if role == "user"] == prompts, tmux.screen()
    assert [finish for role, _, finish in rows if role == "assistant"] == ["eos"] * 10
    assert "Now shorten" not in tmux.screen().split("╭")[-1]  # nothing left behind in the prompt box


def test_a_burst_with_tabs_fills_each_field_of_a_dialog_in_order(tmux: Tmux, tmp_path: Path) -> None:
    """F10 then "0.8 Tab 0.9 Tab Tab 42 Enter" in one write: the Tab moved the focus only after the
    keys behind it had gone to the field it left, and the chat was saved with top-p 0.942, no seed."""
    tmux.wait_for("fake:0")
    tmux.run("send-keys", "-t", tmux.session, "F10", "0.8", "Tab", "0.9", "Tab", "Tab", "42", "Enter")
    screen = tmux.wait_for("T 0.8 · top-p 0.9 · seed 42")  # on the prompt box's border
    assert "0.942" not in screen


@pytest.fixture
def real_app(tmp_path: Path, pocket_dir: Path) -> Iterator[Tmux]:
    """The real `specchat` command on the real SmolLM2 weights, in tmux."""
    socket = tmp_path / "tmux.sock"
    session = f"specchat-real-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TERM": "xterm-256color", "SPECCHAT_DATA_DIR": str(tmp_path / "data"),
           "SPECCHAT_CONFIG_DIR": str(tmp_path / "config"), "SPECCHAT_CACHE_DIR": str(tmp_path / "cache"),
           "SPECCHAT_STATE_DIR": str(tmp_path / "state")}
    command = f"{sys.executable} -m app.cli --target {pocket_dir}; sleep 30"
    t = Tmux.start(socket, session, command, width=140, height=45, cwd=ROOT, env=env)
    try:
        yield t
    finally:
        t.kill_server()


@pytest.mark.slow
def test_real_specchat_answers_and_shows_the_hud(real_app: Tmux) -> None:
    real_app.wait_for(r"\bready[.:]", timeout=120, regex=True)  # the notice, not the placeholder
    real_app.keys("-l", "Repeat after me exactly: the quick brown fox jumps over the lazy dog.")
    real_app.keys("Enter")
    screen = real_app.wait_for(r"· \d+ tokens", timeout=240, regex=True)  # the footer under a finished reply
    assert re.search(r"[Tt]he quick brown fox", screen.split("Repeat after me")[-1]), screen
    hud_alpha = re.search(r"accepted\s+\d+% of proposed", screen)  # the acceptance rate row
    hud_tps = re.search(r"tok/s\s+(\d+\.\d)", screen)
    assert hud_alpha and hud_tps, screen  # measured values, not the "—" shown before a reply
    assert float(hud_tps.group(1)) > 0
    real_app.keys("C-q")


def test_keys_right_after_a_reply_and_after_a_dialog_closes(tmux: Tmux) -> None:
    """Issue 11's report: F8/F9 pressed as a reply finished did nothing, and keys typed right
    after Esc closed a dialog went missing. Each key here goes out the moment the footer shows;
    Esc and the next word go in one write, as a fast typist's keys arrive on a busy machine."""
    tmux.wait_for("fake:0")
    dialogs = {"F9": "Export chat to Markdown", "F8": "System prompt for this chat"}
    for round_, key in enumerate(["F9", "F8", "F9"]):
        tmux.run("send-keys", "-t", tmux.session, f"question {round_}", "Enter")
        deadline = time.monotonic() + 15
        while "12 tokens" not in tmux.screen().split(f"question {round_}")[-1]:  # this reply's footer
            assert time.monotonic() < deadline, tmux.screen()
            time.sleep(0.02)
        tmux.run("send-keys", "-t", tmux.session, key)
        tmux.wait_for(dialogs[key], timeout=5)
        tmux.run("send-keys", "-t", tmux.session, "Escape", f"typed{round_}")
        screen = tmux.wait_for(f"typed{round_}", timeout=5)
        prompt_box = screen.split("╭")[-1]
        assert f"typed{round_}" in prompt_box, screen  # the keys after Esc reached the chat's box, not the dialog's
        # and the dialog is gone (on a busy machine its last frame can outlive the keys' first by a repaint)
        tmux.wait_gone(dialogs[key], timeout=5)
        tmux.run("send-keys", "-t", tmux.session, *["BSpace"] * len(f"typed{round_}"))
        tmux.wait_for("Ask something", timeout=5)  # the empty box's placeholder
    tmux.keys("C-q")


def test_alt_enter_from_a_terminal_adds_a_line_and_sends_nothing(tmux: Tmux) -> None:
    """Terminals send ESC CR for Alt+Enter; Textual's parser read it as Enter, so the prompt went
    out half typed where README's key table promises a new line (a hostile tester, in tmux)."""
    tmux.wait_for("fake:0")
    tmux.keys("-l", "alt line one")
    tmux.keys("M-Enter")
    tmux.keys("-l", "line two")
    tmux.wait_for("line two", timeout=5)
    time.sleep(1.0)  # time for a reply, had Alt+Enter sent the prompt
    screen = tmux.screen()
    box = screen.split("╭")[-1]
    assert "alt line one" in box and "line two" in box, screen  # both lines still in the prompt box
    assert box.index("alt line one") < box.index("line two") and "─ you" not in screen, screen
    tmux.keys("Enter")
    tmux.wait_for("12 tokens", timeout=15)  # Enter alone sends both lines as one prompt
    tmux.keys("C-q")


@pytest.mark.parametrize("way", ["COLUMNS and LINES exported", "stdout to a file"])
def test_the_app_is_drawn_at_the_terminals_own_size_and_follows_it(tmp_path: Path, way: str) -> None:
    """Textual asks :func:`shutil.get_terminal_size`, which believes COLUMNS and LINES in the
    environment (a snapshot some shells export) before the terminal, and asks stdout, not the
    stderr the app draws on: either way the app was drawn at a wrong size in a corner of the
    terminal (80x24 with stdout sent to a file), deaf to resizes."""
    env = fake_app_env(tmp_path)
    command = f"{sys.executable} -m tests.app.tty_app"
    if way == "stdout to a file":
        command += f" > {tmp_path / 'out.txt'}"
    else:
        env.update(COLUMNS="60", LINES="20")
    t = Tmux.start(tmp_path / "tmux.sock", f"specchat-size-{uuid.uuid4().hex[:8]}", f"{command}; sleep 30",
                   width=120, height=36, cwd=ROOT, env=env)

    def drawn_at(height: int, box_width: int) -> None:
        """Until the footer is on the terminal's last row and the prompt box is ``box_width``
        wide: a repaint on a busy machine can be caught half done."""
        deadline = time.monotonic() + 15
        while True:
            rows = t.screen().splitlines()
            boxes = [row[row.index("╭"):row.index("╮") + 1] for row in rows if "╭" in row and "╮" in row]
            if len(rows) == height and "^q Quit" in rows[-1] and boxes and len(boxes[-1]) == box_width:
                return
            assert time.monotonic() < deadline, "\n".join(rows)
            time.sleep(0.1)

    try:
        t.wait_for("fake:0")  # the full HUD, shown beside the chat only on a wide terminal
        drawn_at(36, 78)  # the full HUD beside the box
        t.run("resize-window", "-t", t.session, "-x", "90", "-y", "30")
        drawn_at(30, 88)  # the HUD folded: the box spans the terminal, less its margins
    finally:
        t.kill_server()


def test_the_app_draws_on_the_terminal_when_stderr_goes_to_a_file(tmp_path: Path) -> None:
    """Textual draws on stderr: ``specchat 2>/dev/null`` (a common way to hide library warnings)
    drew the whole app into the file and left the terminal blank, keys still read."""
    errors = tmp_path / "errors.txt"
    env = fake_app_env(tmp_path)
    t = Tmux.start(tmp_path / "tmux.sock", f"specchat-stderr-{uuid.uuid4().hex[:8]}",
                   f"{sys.executable} -m tests.app.tty_app 2> {errors}; echo exit $?; sleep 30",
                   width=120, height=36, cwd=ROOT, env=env)
    try:
        t.wait_for("fake:0")
        t.keys("-l", "hello")
        t.keys("Enter")
        t.wait_for("12 tokens")  # the reply's footer: drawn, and the keys were read
        t.keys("C-q")
        t.wait_for("exit 0")
        assert "\x1b[" not in errors.read_text(errors="replace")  # not one escape sequence went to the file
    finally:
        t.kill_server()
