"""What F7 and the palette's copy commands pick: code blocks, the last reply, the last code block."""
from __future__ import annotations

from app.ui.screens.copy import code_blocks, last_code_block, last_reply

FENCED = "Here:\n\n```python\nprint(1)\n```\n\nand\n\n```\nls -l\n```\n"


def test_code_blocks_are_found_in_order_with_their_language() -> None:
    assert code_blocks(FENCED) == [("python", "print(1)\n"), ("", "ls -l\n")]
    assert code_blocks("no code") == []


def test_the_last_reply_skips_prompts_and_empty_replies() -> None:
    messages = [("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "")]
    assert last_reply(messages) == "a1"
    assert last_reply([("user", "q")]) is None


def test_the_last_code_block_comes_from_the_latest_reply_that_has_one() -> None:
    messages = [("assistant", FENCED), ("user", "```\nnot mine\n```"), ("assistant", "no code here")]
    assert last_code_block(messages) == "ls -l\n"
    assert last_code_block([("user", "```\nx\n```")]) is None
