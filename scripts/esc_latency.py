"""How long Esc takes to stop a streaming reply in the real app (a Textual pilot, the real engine).

Loads ``--profile`` (default pocket) in the app under ``App.run_test()``, sends a prompt that
makes a long reply, waits ``--after`` seconds, then does what the terminal's input thread does
on Esc (``SpecChatApp._stop_early``, from a thread of its own) and times until the reply has
ended (the engine's last event reached the UI: ``conversation.generating`` is False) and
until its widget shows "stopped". Repeats ``--repeats`` times in one app; prints each and the median.

    PYTHONPATH=$PWD .venv/bin/python scripts/esc_latency.py --repeats 5
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Write a long story about a lighthouse keeper and the sea, in ten chapters."


async def run(args: argparse.Namespace) -> list[tuple[float, float]]:
    from app.ui.app import SpecChatApp
    from app.ui.widgets.chat_view import AssistantMessage
    from app.ui.widgets.prompt import PromptArea

    app = SpecChatApp(args.profile)
    out: list[tuple[float, float]] = []
    async with app.run_test(size=(160, 48)) as pilot:
        while app.engine.backend is None or app.engine.loading:
            await pilot.pause(0.1)
        for _ in range(args.repeats):
            prompt = app.query_one(PromptArea)
            prompt.focus()
            prompt.insert(PROMPT)
            await pilot.press("enter")
            while not app.conversation.generating:
                await pilot.pause(0.01)
            await pilot.pause(args.after)
            sent = time.monotonic()
            threading.Thread(target=app._stop_early).start()
            # asyncio.sleep, not pilot.pause: a pause waits until the app is idle, so it also
            # waited for the finished reply's full re-render (20-150 ms after the reply had ended).
            while app.conversation.generating:
                await asyncio.sleep(0.002)
            ended = time.monotonic()
            reply = app.query(AssistantMessage).last()
            while reply.finish_reason is None:
                await asyncio.sleep(0.002)
            shown = time.monotonic()
            if reply.finish_reason != "cancelled":  # it ended by itself before Esc: nothing to time
                print(f"the reply ended by itself ({reply.finish_reason}) before Esc; not counted", flush=True)
                await pilot.pause(1.0)
                continue
            out.append((ended - sent, shown - sent))
            print(f"Esc to the reply's end {1000 * (ended - sent):.0f} ms · to 'stopped' {1000 * (shown - sent):.0f} ms",
                  flush=True)
            await pilot.pause(1.0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="pocket")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--after", type=float, default=1.5, help="seconds of streaming before Esc")
    args = parser.parse_args()
    import os

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("SPECCHAT_DATA_DIR", str(Path(tmp) / "data"))
        os.environ.setdefault("SPECCHAT_STATE_DIR", str(Path(tmp) / "state"))
        rows = asyncio.run(run(args))
    print(f"median Esc to the reply's end {1000 * statistics.median(e for e, _ in rows):.0f} ms, "
          f"to 'stopped' {1000 * statistics.median(s for _, s in rows):.0f} ms over {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
