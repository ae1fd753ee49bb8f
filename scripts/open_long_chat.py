"""Time opening a 200-turn chat (400 messages) in the app through App.run_test()."""
import asyncio, os, sys, tempfile, time
from pathlib import Path

tmp = Path(tempfile.mkdtemp())
for k in ("DATA", "CONFIG", "CACHE", "STATE"):
    os.environ[f"SPECCHAT_{k}_DIR"] = str(tmp / k.lower())

from app.store.history import History
from app.ui.app import SpecChatApp
from tests.app.fakes import FakeLoader, make_profiles

REPLY = ("Here is how it works:\n\n1. First the draft proposes *K* tokens.\n2. The target checks them in one pass.\n"
         "3. Accepted tokens are kept.\n\n```python\ndef f(x):\n    return x * 2\n```\n\n"
         "| a | b |\n|---|---|\n| 1 | 2 |\n\nThat is **all** there is to it, turn {n}.")

def make_db() -> int:
    h = History.open()
    chat = h.create_chat("long chat", "fast")
    for n in range(200):
        h.add_message(chat, "user", f"question number {n}: how does speculative decoding work?", profile="fast")
        h.add_message(chat, "assistant", REPLY.format(n=n), profile="fast", finish_reason="eos",
                      pieces=[(REPLY.format(n=n), "target")])
    h.close()
    return chat

async def once(chat: int) -> float:
    app = SpecChatApp(loader=FakeLoader(), profiles_loader=make_profiles)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        t0 = time.perf_counter()
        await app.open_chat(chat)
        await pilot.pause()
        await app.screen._compositor_refresh() if False else None
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        dt = time.perf_counter() - t0
        print("mounted", len(app.conversation.chat_log.children), "older", len(getattr(app.conversation.chat_log, "older", [])), file=sys.stderr)
    return dt

chat = make_db()
n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
print(" ".join(f"{asyncio.run(once(chat)):.2f}" for _ in range(n)))
