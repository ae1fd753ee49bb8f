"""A stand-in for ``python -m pip download`` used by the kill -9 cache test: it writes
part of a wheel into the -d directory, records its PID, then hangs."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

dest = Path(sys.argv[sys.argv.index("-d") + 1])
(dest / "partial.whl.part").write_bytes(b"\0" * 1_000_000)
Path(os.environ["FAKE_PIP_PIDFILE"]).write_text(str(os.getpid()))
time.sleep(120)
