"""Messages on screen: the colour view of a reply's pieces, and the states a message shows."""
from __future__ import annotations

from app.ui.widgets.chat_view import AssistantMessage, UserMessage


def test_colour_view_reads_markdown_and_keeps_each_tokens_colour() -> None:
    from app.ui.widgets.chat_view import SOURCE_STYLES, pieces_content

    pieces = [("## Plan\n", "draft"), ("Run:\n\n```sh\n", "target"), ("ls -l\n", "draft"), ("```\n", "target"),
              ("done", "draft")]
    content = pieces_content(pieces)
    assert content.plain == "Plan\nRun:\n\n  ls -l\ndone"

    def style_at(i: int) -> str:
        return next(str(s.style) for s in content.spans if s.start <= i < s.end)

    plain = content.plain
    assert style_at(plain.index("ls")) == SOURCE_STYLES["draft"]
    assert style_at(plain.index("Run")) == SOURCE_STYLES["target"]
    assert style_at(plain.index("Plan")) == SOURCE_STYLES["draft"] + " bold"
    assert SOURCE_STYLES["draft"] != SOURCE_STYLES["target"]


def test_a_prompt_shows_whether_it_waits_and_whether_it_was_asked_again() -> None:
    prompt = UserMessage("hi")
    prompt.set_waiting("waiting for the reply above")
    assert prompt.waiting and prompt.border_subtitle == "⧗ waiting for the reply above"
    prompt.set_waiting(None)
    assert not prompt.waiting and prompt.border_subtitle == ""
    prompt.set_superseded()
    assert prompt.superseded and prompt.border_title == "you · earlier"


def test_a_reply_waits_until_it_is_finished_and_says_when_it_was_answered_again() -> None:
    reply = AssistantMessage("fast")
    assert reply.streaming and reply.waiting and not reply.superseded
    done = AssistantMessage("fast", text="ok", finish_reason="eos")
    assert not done.waiting
    done.set_superseded()
    assert done.superseded and done.border_title == "fast · earlier reply"
