"""Copy picker: the last reply, any message, or a code block, to the clipboard.

The app copies with ``App.copy_to_clipboard`` (OSC 52: works over SSH and in
tmux with ``set-clipboard on``, in most terminals).
"""
from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from app.ui.screens.dialog import Dialog
from app.ui.widgets.reply_markdown import reply_parser
from engine.text_safety import inert


@dataclass(frozen=True)
class CopyChoice:
    """One thing that can be copied: ``label`` describes it, ``text`` is what goes to the clipboard."""

    label: str
    text: str


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced or indented code block in ``markdown``, in order."""
    tokens = reply_parser().parse(markdown)  # as the reply is shown: "<details>" before a fence hid it here
    return [(t.info.strip().split(" ")[0] if t.info else "", t.content)
            for t in tokens if t.type in ("fence", "code_block")]


def last_reply(messages: list[tuple[str, str]]) -> str | None:
    """The text of the last reply with any, among ``(role, text)`` messages."""
    return next((text for role, text in reversed(messages) if role == "assistant" and text), None)


def last_code_block(messages: list[tuple[str, str]]) -> str | None:
    """The code of the last code block in the replies."""
    for role, text in reversed(messages):
        blocks = code_blocks(text) if role == "assistant" else []
        if blocks:
            return blocks[-1][1]
    return None


def preview(text: str, width: int = 60) -> str:
    """The first non-empty line, shortened to ``width`` characters."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def copy_choices(messages: list[tuple[str, str]]) -> list[CopyChoice]:
    """What the picker offers for ``(role, text)`` messages (oldest first): the last
    reply, then the code blocks of every reply, then every other message, newest first."""
    choices: list[CopyChoice] = []
    replies = [text for role, text in messages if role == "assistant" and text]
    if replies:
        choices.append(CopyChoice(f"Last reply · {preview(replies[-1])}", replies[-1]))
    for n, reply in enumerate(reversed(replies)):
        for lang, code in code_blocks(reply):
            lines = code.count("\n") + (0 if code.endswith("\n") else 1)
            where = "last reply" if n == 0 else f"reply −{n}"
            choices.append(CopyChoice(f"Code · {lang or 'text'} · {lines} line{'s' if lines != 1 else ''}"
                                      f" · {where} · {preview(code, 40)}", code))
    last = max((i for i, (role, text) in enumerate(messages) if role == "assistant" and text), default=None)
    for i, (role, text) in reversed(list(enumerate(messages))):
        if text and i != last:  # the last reply is offered first already
            who = "You" if role == "user" else "Reply"
            choices.append(CopyChoice(f"{who} · {preview(text)}", text))
    return choices


class CopyScreen(Dialog["CopyChoice | None"]):
    """Pick what to copy; dismisses with the choice, or None."""

    def __init__(self, choices: list[CopyChoice]) -> None:
        super().__init__()
        self._choices = choices

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog picker-dialog"):
            yield Label("Copy to the clipboard", classes="dialog-title")
            yield Label("Enter copies · Esc cancels", classes="dialog-hint")
            yield OptionList(*[Option(Content(inert(c.label)), id=str(i)) for i, c in enumerate(self._choices)],
                             id="copy-list")

    def on_mount(self) -> None:
        option_list = self.query_one(OptionList)
        option_list.highlighted = 0
        option_list.focus()

    def picked(self, option: Option) -> None:
        self.dismiss(self._choices[int(option.id or 0)])
