"""Does the app's engine process cost speed? pocket, plain, one reply of up to 512 tokens, three times
after a warm-up, with the engine (a) in this process, as ``specchat generate`` runs it, (b) in the
app's child process (``ProcessBackend``) loaded without a drafter, (c) in the child with the
profile's drafter and speculation switched off, as the app's F5 leaves it. No UI: what is left
of the app's gap to headless ``generate`` is then the UI's own work (``scripts/app_speed.py``).

    for i in 1 2 3; do for w in inproc child-plain child-f5; do
        PYTHONPATH=$PWD .venv/bin/python scripts/child_speed.py $w; done; done
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any

from engine.child.backend import ProcessBackend
from engine.config.models_file import load_profiles
from engine.events import ChatMessage, generation_params
from engine.load.loader import load_engine

PROMPT = "Write a long story about a lighthouse keeper and the sea, in ten chapters."


def rate(engine: Any, messages: list[ChatMessage], params: Any) -> tuple[float, int]:
    last = None
    for event in engine.chat(messages, params):
        last = event
    assert last is not None
    return last.stats.tokens_per_s, last.stats.tokens


def main() -> int:
    which = sys.argv[1] if len(sys.argv) > 1 else "inproc"
    pocket = load_profiles(None).get("pocket")
    plain = dataclasses.replace(pocket, drafter="none", draft=None)
    params = generation_params(pocket, 512)
    messages = ([ChatMessage("system", pocket.system_prompt)] if pocket.system_prompt else []) + [ChatMessage("user", PROMPT)]
    if which == "inproc":
        engine: Any = load_engine(plain, memory_budget=None)
    elif which == "child-plain":
        engine = ProcessBackend.start(plain)
    elif which == "child-f5":
        engine = ProcessBackend.start(pocket)
        engine.set_speculation(False)
    else:
        raise SystemExit("inproc, child-plain or child-f5")
    try:
        rate(engine, messages, params)  # warm-up
        runs = [rate(engine, messages, params) for _ in range(3)]
    finally:
        engine.close()
    print(which, " ".join(f"{r:.1f}" for r, _ in runs), "tok/s;", runs[0][1], "tokens")
    return 0


if __name__ == "__main__":  # the child is spawned: it imports this module again
    sys.exit(main())
