"""The UI's CPU per paint of a streaming reply, by kind of Markdown (no engine, no terminal).

Streams a sample reply into the app's reply widget (a headless Textual app at
the given size) ``--chunk`` characters a paint, and prints the UI thread's CPU
milliseconds per paint (the append and the layout and composition it causes):
median and the last paints, where the reply is longest.

    .venv/bin/python scripts/ui_paint_cost.py                 # every sample
    .venv/bin/python scripts/ui_paint_cost.py --sample list --chunk 40

Figures are for comparing changes on one machine, side by side in one run.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARAGRAPH = ("A hash table stores key-value pairs in an array of buckets. To find where a key lives, it "
             "runs the key through a hash function and takes the result modulo the number of buckets.")
SAMPLES = {
    "paragraphs": "\n\n".join([PARAGRAPH] * 8),
    "list": "".join(f"- Item {i}: a good hash function spreads keys evenly; a poor one puts many keys in one "
                    "bucket.\n" for i in range(16)),
    "code": "```python\n" + "".join(f"    value_{i} = table.get('key{i}') + compute(i, {i})\n"
                                    for i in range(40)) + "```\n",
    "mixed": (f"{PARAGRAPH}\n\n## Step by step\n\n"
              + "".join(f"{i}. **Step {i}.** `index = hash(key) % len(buckets)` and so on.\n" for i in range(1, 6))
              + "\n```python\n" + "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(8)) + "```\n\n"
              + "".join(f"- point {i}, said plainly\n" for i in range(6)) + f"\n{PARAGRAPH}\n"),
}


async def paint_costs(text: str, chunk: int, size: tuple[int, int]) -> list[float]:
    from textual.app import App, ComposeResult
    from textual.containers import VerticalScroll

    from app.ui.widgets.chat_view import AssistantMessage

    class Bench(App[None]):
        def compose(self) -> ComposeResult:
            with VerticalScroll():
                yield AssistantMessage("bench")

    app = Bench()
    costs = []
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.2)
        message = app.query_one(AssistantMessage)
        for start in range(0, len(text), chunk):
            before = time.thread_time()
            with app.batch_update():
                await message.append(text[start:start + chunk], [])
            await pilot.pause(0.02)  # let the layout and composition it caused run
            costs.append((time.thread_time() - before) * 1000)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", choices=sorted(SAMPLES), action="append", help="sample(s) to stream (default: all)")
    parser.add_argument("--chunk", type=int, default=80, help="characters per paint (default: 80)")
    parser.add_argument("--textual-lists", action="store_true",
                        help="rebuild lists as Textual does (to compare with the app's growing lists)")
    parser.add_argument("--width", type=int, default=120, help="terminal columns (default: 120)")
    parser.add_argument("--height", type=int, default=40, help="terminal rows (default: 40)")
    args = parser.parse_args()
    if args.textual_lists:
        from textual.widgets import Markdown

        from app.ui.widgets.reply_markdown import ReplyMarkdown

        ReplyMarkdown.BLOCKS = {**ReplyMarkdown.BLOCKS, **{k: Markdown.BLOCKS[k] for k in ReplyMarkdown.BLOCKS
                                                            if k.endswith("list_open")}}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("SPECCHAT_DATA_DIR", tmp)
        for name in args.sample or sorted(SAMPLES):
            costs = asyncio.run(paint_costs(SAMPLES[name], args.chunk, (args.width, args.height)))
            print(f"{name:10s} {len(costs):3d} paints  median {statistics.median(costs):6.1f} ms  "
                  f"last 5: {' '.join(f'{c:.0f}' for c in costs[-5:])} ms", flush=True)


if __name__ == "__main__":
    main()
