"""Downloads report bytes and percent through the ProgressFn (pip's raw progress lines)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import engine.fetch.wheels as wheels
from engine.errors import ModelSourceError

FAKE_PIP = r"""
import sys, pathlib
args = sys.argv[1:]
dest = pathlib.Path(args[args.index("-d") + 1])
if "--progress-bar" in args and "{old}" == "yes":
    print("pip download: error: argument --progress-bar: invalid choice: 'raw'", flush=True)
    sys.exit(2)
print("Collecting demo==1.0")
if "--progress-bar" in args:
    for done in (0, 1_000_000, 2_500_000):
        print(f"Progress {{done}} of 2500000", flush=True)
(dest / "demo-1.0-py3-none-any.whl").write_bytes(b"PK")
print("Saved demo-1.0-py3-none-any.whl")
"""


def fake_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, old: bool = False) -> None:
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP.format(old="yes" if old else "no"))
    monkeypatch.setattr(wheels, "die_with_parent_argv", lambda module, *args: [sys.executable, str(script), *args])


def test_download_reports_megabytes_and_fraction(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_pip(monkeypatch, tmp_path)
    calls: list[tuple[str, float | None]] = []
    got = wheels.download_wheel("demo", "1.0", tmp_path / "wheels", lambda s, f: calls.append((s, f)))
    assert got == tmp_path / "wheels" / "demo-1.0-py3-none-any.whl" and got.exists()
    assert calls == [
        ("downloading demo==1.0", None),
        ("downloading demo==1.0: 0.0 MB of 2.5 MB", 0.0),
        ("downloading demo==1.0: 1.0 MB of 2.5 MB", 0.4),
        ("downloading demo==1.0: 2.5 MB of 2.5 MB", 1.0),
    ]


def test_an_old_pip_without_raw_progress_still_downloads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_pip(monkeypatch, tmp_path, old=True)
    calls: list[tuple[str, float | None]] = []
    got = wheels.download_wheel("demo", "1.0", tmp_path / "wheels", lambda s, f: calls.append((s, f)))
    assert got.exists() and calls == [("downloading demo==1.0", None)]


def test_failed_download_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "failing_pip.py"
    script.write_text("import sys\nprint('ERROR: No matching distribution found for demo==9')\nsys.exit(1)\n")
    monkeypatch.setattr(wheels, "die_with_parent_argv", lambda module, *args: [sys.executable, str(script), *args])
    with pytest.raises(ModelSourceError, match="No matching distribution found"):
        wheels.download_wheel("demo", "9", tmp_path / "wheels")


def test_ticking_reports_bytes_and_fraction(tmp_path: Path) -> None:
    import time

    from engine.fetch.convert import _dir_bytes, _ticking

    calls: list[tuple[str, float | None]] = []
    out = tmp_path / "out"
    with _ticking(lambda s, f: calls.append((s, f)), "writing", 0.6, lambda: _dir_bytes(out), 2_000_000, 0.8,
                  every_s=0.02):
        out.mkdir()
        (out / "a").write_bytes(b"x" * 1_000_000)
        time.sleep(0.2)
    assert calls[0] == ("writing", 0.6)
    assert ("writing: 1.0 of 2.0 MB", pytest.approx(0.7)) in calls
    with _ticking(lambda s, f: calls.append((s, f)), "reading", 0.0, every_s=0.02):
        time.sleep(0.1)
    assert any(s.startswith("reading: ") and s.endswith(" s") and f == 0.0 for s, f in calls)
