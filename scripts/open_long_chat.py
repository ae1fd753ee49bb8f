"""Time opening a 200-turn saved chat (400 messages) in the app, through App.run_test().

Usage: PYTHONPATH=$PWD python scripts/open_long_chat.py [RUNS] [TURNS]

Each run starts the app on the fake backend (120x40), opens the chat and waits for the
first full paint; it prints the seconds per run, and on stderr how many messages were
mounted and how many wait above (app.ui.widgets.chat_log.ChatLog.older). Every reply
is Markdown with a list, a code block and a table. Uses temporary specchat folders.
"""
from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

_tmp = Path(tempfile.mkdtemp())
for _kind in ("DATA", "CONFIG", "CACHE", "STATE"):
    os.environ[f"SPECCHAT_{_kind}_DIR"] = str(_tmp / _kind.lower())

from app.store.history import History  # noqa: E402  (after the folders are set)
from app.ui.app import SpecChatApp  # noqa: E402
from tests.app.fakes import FakeLoader, make_profiles  # noqa: E402

REPLY = ("Here is how it works:\n\n1. First the draft proposes *K* tokens.\n2. The target checks them in one pass.\n"
         "3. Accepted tokens are kept.\n\n```python\ndef f(x):\n    return x * 2\n```\n\n"
         "| a | b |\n|---|---|\n| 1 | 2 |\n\nThat is **all** there is to it, turn {n}.")


def make_chat(turns: int) -> int:
    history = History.open()
    chat = history.create_chat("long chat", "fast")
    for n in range(turns):
        history.add_message(chat, "user", f"question number {n}: how does speculative decoding work?", profile="fast")
        reply = REPLY.format(n=n)
        history.add_message(chat, "assistant", reply, profile="fast", finish_reason="eos", pieces=[(reply, "target")])
    history.close()
    return chat


async def open_once(chat: int) -> float:
    app = SpecChatApp(loader=FakeLoader(), profiles_loader=make_profiles)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        start = time.perf_counter()
        await app.open_chat(chat)
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        seconds = time.perf_counter() - start
        log = app.conversation.chat_log
        print(f"mounted {len(log.children)}, waiting above {len(getattr(log, 'older', []))}", file=sys.stderr)
    return seconds


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    chat = make_chat(int(sys.argv[2]) if len(sys.argv) > 2 else 200)
    print(" ".join(f"{asyncio.run(open_once(chat)):.2f}" for _ in range(runs)))


if __name__ == "__main__":
    main()
