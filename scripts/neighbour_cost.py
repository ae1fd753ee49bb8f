"""What a busy neighbour costs the engine: tok/s alone against tok/s beside a process
that takes ``busy`` seconds of a core every ``period`` seconds (a UI painting, say).

On a machine with as many cores as the engine has threads, a step spread over
every core waits for whichever core the neighbour holds, so even a small
neighbour costs more than its share; one thread fewer than the cores leaves it
room. Runs alternate (alone, beside) per setting; prints each and the medians.

    .venv/bin/python scripts/neighbour_cost.py --profile pocket --threads 2 1 \\
        --neighbour 0.01/0.5 0.005/0.1 0.025/0.1 --repeats 3

Run it on a quiet machine: every other process shifts the figures.
"""
from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = ("Write a detailed, step-by-step explanation of how a hash table works, "
          "with a short Python example and its output.")


def neighbour(stop: "multiprocessing.synchronize.Event", busy: float, period: float) -> None:
    """Spin for ``busy`` seconds, sleep the rest of ``period``, until ``stop``."""
    while not stop.is_set():
        start = time.perf_counter()
        while time.perf_counter() - start < busy:
            sum(range(200))
        time.sleep(max(0.0, period - busy))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="pocket", help="profile to load (default: pocket)")
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="torch threads to try (default: 2 1)")
    parser.add_argument("--neighbour", nargs="+", default=["0.01/0.5", "0.005/0.1", "0.025/0.1"],
                        help="BUSY/PERIOD seconds of the neighbour process (default: 0.01/0.5 0.005/0.1 0.025/0.1)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="reply length (default: 512)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating pairs per setting (default: 3)")
    args = parser.parse_args()

    import torch

    from engine.events import ChatMessage, generation_params
    from engine.load.loader import load_engine
    from engine.config.models_file import load_profiles

    profile = load_profiles().get(args.profile)
    engine = load_engine(profile)
    params = generation_params(profile, args.max_new_tokens)
    messages = [ChatMessage("user", PROMPT)]

    def tok_s(threads: int) -> float:
        torch.set_num_threads(threads)
        last = None
        for last in engine.chat(messages, params):
            pass
        assert last is not None
        return last.stats.tokens_per_s

    tok_s(max(args.threads))  # warm up
    settings = [(threads, *map(float, spec.split("/"))) for spec in args.neighbour for threads in args.threads]
    runs: dict[tuple[int, float, float], list[tuple[float, float]]] = {s: [] for s in settings}
    for repeat in range(args.repeats):
        for threads, busy, period in settings:
            alone = tok_s(threads)
            stop = multiprocessing.Event()
            process = multiprocessing.Process(target=neighbour, args=(stop, busy, period))
            process.start()
            try:
                beside = tok_s(threads)
            finally:
                stop.set()
                process.join()
            runs[(threads, busy, period)].append((alone, beside))
            print(f"run {repeat + 1}: {threads} thread(s), neighbour {busy * 1000:.0f} ms every {period:.2f} s: "
                  f"alone {alone:.1f} tok/s, beside {beside:.1f} ({beside / alone:.3f})", flush=True)
    for (threads, busy, period), pairs in runs.items():
        alone = statistics.median(a for a, _ in pairs)
        beside = statistics.median(b for _, b in pairs)
        print(f"median: {threads} thread(s), neighbour {busy * 1000:.0f} ms every {period:.2f} s "
              f"({busy / period:.0%} of a core): alone {alone:.1f}, beside {beside:.1f}, ratio {beside / alone:.3f}")


if __name__ == "__main__":
    main()
