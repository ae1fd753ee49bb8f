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
