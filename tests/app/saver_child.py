"""Run by test_history's kill -9 tests: stream a reply through HistorySaver, reporting
on stdout each state the saver confirmed written, until killed."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import app.store.history as history_module
import app.store.saver as saver_module
from app.store.history import History
from app.store.saver import HistorySaver
from app.store.pending import ChatRef


def main(path: str, rounds: int, finish: bool) -> None:
    history_module.BUSY_TIMEOUT_S = 0.1
    saver_module.BACKOFF_S = (0.02, 0.1)
    history = History.open(Path(path))
    saver = HistorySaver(history)
    record = saver.start_reply(ChatRef("killed", "fast"), "count", "fast")
    text = ""
    for i in range(rounds):
        text += f" r{i}"
        last = finish and i == rounds - 1
        saver.update(record, text, [(text, "target")], {"tokens": i + 1}, "length" if last else None)
        if saver.flush(0.05) and record.written == record.version:
            print(f"saved {i + 1}", flush=True)
        else:
            print(f"pending {i + 1}", flush=True)
    while not saver.flush(0.2):
        pass
    print(f"all saved {rounds}", flush=True)
    time.sleep(60)  # wait to be killed


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1")
