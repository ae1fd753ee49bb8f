"""Host time a speculative round spends outside the model passes (issue 35: on a card the host's
share of a round adds to every round). A tiny random pair on the CPU, one thread, a model draft
(adaptive K), 400 tokens after a prompt of ``N`` tokens; everything outside
``ModelRunner._pass`` is counted. Median of 5 replies after a warm-up.

    PYTHONPATH=$PWD .venv/bin/python scripts/host_round.py [N]
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.decode.decoder import SpecDecoder  # noqa: E402
from engine.decode.drafters import ModelDrafter  # noqa: E402
from engine.decode.runner import ModelRunner  # noqa: E402
from engine.events import GenerationParams  # noqa: E402
from engine.model.device import Device  # noqa: E402
from tests.tiny import noisy_copy, tiny_llama  # noqa: E402


def main() -> int:
    torch.set_num_threads(1)
    spent = [0.0]
    real_pass = ModelRunner._pass

    def timed(self: ModelRunner, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return real_pass(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - began

    ModelRunner._pass = timed  # type: ignore[method-assign]
    cpu = Device(torch.device("cpu"))
    target = tiny_llama(seed=1)
    decoder = SpecDecoder(target, cpu, ModelDrafter(noisy_copy(target, 0.05, seed=2), cpu), auto_off_window=0)
    prompt = [3 + (i * 7) % 90 for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 8)]

    def reply() -> tuple[float, float]:
        tokens = rounds = 0
        spent[0] = 0.0
        began = time.perf_counter()
        for event in decoder.generate(prompt, GenerationParams(max_new_tokens=400, stop_token_ids=(-1,))):
            tokens += len(event.token_ids)
            rounds += 1
        return (time.perf_counter() - began - spent[0]) / rounds * 1e6, tokens / rounds

    reply()
    runs = [reply() for _ in range(5)]
    print(f"host µs a round outside the passes: median {statistics.median(r for r, _ in runs):.0f} "
          f"(runs {[round(r) for r, _ in runs]}), {runs[0][1]:.2f} tokens a round, prompt {len(prompt)} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
