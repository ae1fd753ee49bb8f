"""What the cache holds, model by model: ``specchat models`` lists it and removes from it.

A model from the package index leaves up to four kinds of files in :func:`engine.paths.cache_dir`:

==================  ==========================================  ======================================
kind                where                                       made by
==================  ==========================================  ======================================
wheel               ``wheels/DIST-VERSION-*.whl``               a download not extracted yet
GGUF                ``files/DIST-VERSION/`` or ``files/joined-KEY/``  :mod:`engine.fetch.wheels`, ``.parts``
converted copy      ``converted/KEY`` (``KEY.lean``)             :mod:`engine.fetch.convert`
int4 cache          ``int4/NAME-KEY-TAGS.safetensors``           :mod:`engine.quant`
==================  ==========================================  ======================================

:func:`inventory` groups them by the model they belong to and names the profiles that use it;
whatever no profile claims is listed under its own name, so it can be removed too.
:func:`remove` deletes only paths inside the cache, never following a link out of it.
"""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engine.config.profiles import ModelProfile, ModelSpec
from engine.config.source_names import WHEEL_SOURCE
from engine.errors import ModelSourceError
from engine.fetch.convert import LEAN_SUFFIX
from engine.fetch.parts import joined_key
from engine.fetch.wheels import norm_dist
from engine.fetch.sources import classify, known_local_copy
from engine.progress import model_name

INT4_CACHE = re.compile(r"^(?P<model>.+)-[0-9a-f]{16}-g\d+")
"""The start of an int4 cache's name (:func:`engine.quant._cache_file`): the converted copy's
directory name, cut to 60 characters, then the key and the settings."""


@dataclass(frozen=True)
class CachedFile:
    """One entry of the cache (a file, or a directory counted whole)."""

    kind: str
    path: Path
    size: int


@dataclass
class CachedModel:
    """A model's files in the cache and the profiles that use them (none: left over)."""

    name: str
    files: list[CachedFile] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class ToDownload:
    """What a profile's first load downloads: the sources not in the cache, and their bytes
    (None when one's size is not known: a hub id, which transformers fetches)."""

    sources: tuple[str, ...]
    bytes: int | None

    def words(self) -> str:
        """``about 6.20 GB``, ``about 93 MB``, or ``its models`` (size unknown)."""
        n = self.bytes
        return (f"about {n / 1e9:.2f} GB" if n >= 1e9 else f"about {n / 1e6:.0f} MB") if n else "its models"


def local_specs(profile: ModelProfile) -> list[ModelSpec]:
    """The models loading ``profile`` here reads, one per source (where target and draft share a file,
    the spec with the larger ``download_size``); none for a server profile."""
    specs = [s for s in (profile.target, profile.draft) if s is not None and profile.backend == "local"]
    return list({s.source: s for s in sorted(specs, key=lambda s: s.download_size or 0)}.values())


def to_download(profile: ModelProfile) -> ToDownload:
    """What loading ``profile`` here would download first (nothing for a server profile)."""
    from engine.fetch.sources import in_hub_cache, is_fetched

    missing = [s for s in local_specs(profile) if is_fetched(s) is False or in_hub_cache(s) is False]
    known = bool(missing) and all(s.download_size for s in missing)
    return ToDownload(tuple(s.source for s in missing), sum(s.download_size or 0 for s in missing) if known else None)


def disk_size(path: Path) -> int:
    """Bytes ``path`` takes (a directory: every file under it; links are not followed)."""
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    total = 0
    for folder, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += (Path(folder) / name).lstat().st_size
            except OSError:
                pass
    return total


def _entries(root: Path) -> list[CachedFile]:
    """Every unit in the cache: wheels, extracted or joined GGUF folders, converted copies, int4 caches."""
    found: list[CachedFile] = []
    for sub, kind, pattern in (("wheels", "wheel", "*.whl"), ("files", "GGUF", "*"),
                               ("converted", "converted copy", "*"), ("int4", "int4 cache", "*.safetensors")):
        folder = root / sub
        if folder.is_dir():
            for path in sorted(folder.glob(pattern)):
                if not path.name.startswith("."):  # temporary names: cleaned at the next start
                    found.append(CachedFile(kind, path, disk_size(path)))
    return found


def _owned(spec: ModelSpec, root: Path) -> tuple[set[Path], set[str]]:
    """The cache entries of ``spec``'s files (paths), and the names its int4 caches start with."""
    paths: set[Path] = set()
    converted: list[str] = []
    if spec.parts:  # as engine.fetch.parts.joined_path and engine.fetch.sources._converted_dir name them
        key = joined_key(spec.sha256)
        paths.add(root / "files" / key)
        converted.append(f"{key}-{Path(spec.source).name}")
        dists = [WHEEL_SOURCE.fullmatch(p) for p in spec.parts]
    else:
        m = WHEEL_SOURCE.fullmatch(spec.source)
        if m is None:
            return _owned_local(spec, root)
        dist, version, inner = m.groups()
        paths.add(root / "files" / f"{norm_dist(dist)}-{version}")
        converted.append(f"{norm_dist(dist)}-{version}-" + re.sub(r"[^\w.-]", "_", inner))
        dists = [m]
    for m in dists:
        if m is not None:
            paths.update(w for w in (root / "wheels").glob(f"{norm_dist(m.group(1))}-{m.group(2)}-*.whl"))
    names = {name + suffix for name in converted for suffix in ("", LEAN_SUFFIX)}
    paths.update(root / "converted" / name for name in names)
    return paths, {name[:60] for name in names}


def _owned_local(spec: ModelSpec, root: Path) -> tuple[set[Path], set[str]]:
    """A local GGUF's converted copies (the file itself lies outside the cache: never claimed)."""
    kind, value = classify(spec.source)
    copy = known_local_copy(Path(value), root) if kind == "gguf" else None
    if copy is None:
        return set(), set()
    names = {copy.name, copy.name + LEAN_SUFFIX}
    return {copy.parent / name for name in names}, {name[:60] for name in names}


def _specs(profile: ModelProfile) -> list[ModelSpec]:
    if profile.backend != "local":
        return []
    draft = [profile.draft] if profile.drafter == "model" and profile.draft is not None else []
    return [profile.target, *draft]


def inventory(profiles: Iterable[ModelProfile], root: Path) -> list[CachedModel]:
    """The models in the cache at ``root``, biggest first, each with its files and the profiles
    that use it; entries no profile claims come last, one model each, named by the entry."""
    entries = _entries(root)
    models: dict[str, CachedModel] = {}
    claimed: set[Path] = set()
    for profile in profiles:
        for spec in _specs(profile):
            paths, int4_names = _owned(spec, root)
            mine = [e for e in entries if e.path in paths or (
                e.kind == "int4 cache" and (m := INT4_CACHE.match(e.path.name)) is not None
                and m.group("model") in int4_names)]
            if not mine:
                continue
            model = models.setdefault(model_name(spec.source), CachedModel(model_name(spec.source)))
            for entry in mine:
                if entry.path not in claimed:
                    claimed.add(entry.path)
                    model.files.append(entry)
            if profile.name not in model.profiles:
                model.profiles.append(profile.name)
    used = sorted(models.values(), key=lambda m: -m.size)
    unused = [CachedModel(e.path.name, [e]) for e in entries if e.path not in claimed]
    return used + unused


def matching(models: list[CachedModel], name: str) -> list[CachedModel]:
    """The models ``name`` means: every model a profile of that name uses, else the model of that
    very name, else the one model whose name it is in any case, a space, dot or dash alike (so it
    need not be quoted). Raises :class:`ModelSourceError` when that last reading fits several:
    ``a.b`` deleted ``a-b`` and ``a b`` too."""
    def plain(text: str) -> str:
        return re.sub(r"[\s.-]+", "-", text.strip().lower())

    by_profile = [m for m in models if name in m.profiles]
    exact = [m for m in models if m.name == name]
    loose = [m for m in models if plain(m.name) == plain(name)]
    if by_profile or exact or len(loose) <= 1:
        return by_profile or exact or loose
    raise ModelSourceError(f"{name!r} could mean any of {', '.join(repr(m.name) for m in loose)}: give one of "
                           "those names exactly (quoted)")


def remove(model: CachedModel, root: Path) -> int:
    """Delete ``model``'s files, each checked to lie inside ``root``; returns the bytes freed.

    Raises:
        ModelSourceError: an entry that is not inside the cache (nothing is deleted then), or
            a file that could not be deleted (a read-only disk, another user's files; the
            entries before it are gone), named.
    """
    base = root.resolve()
    for entry in model.files:
        where = entry.path.parent.resolve() / entry.path.name  # the link itself, not what it points to
        if not where.is_relative_to(base) or where == base:
            raise ModelSourceError(f"refusing to remove {entry.path}: it is not inside the cache {root}")
    freed = 0
    for entry in model.files:
        try:
            if entry.path.is_dir() and not entry.path.is_symlink():
                shutil.rmtree(entry.path)  # stops at the first file it cannot delete
            else:
                entry.path.unlink(missing_ok=True)
                record = entry.path.parent / f".{entry.path.name}.record.json"
                record.unlink(missing_ok=True)
        except FileNotFoundError:
            pass  # gone already (another window's remove)
        except OSError as exc:
            raise ModelSourceError(f"could not delete {exc.filename or entry.path}: {exc.strerror or exc}. Check "
                                   "the cache folder's permissions, or whether its disk is mounted read-only") from None
        freed += entry.size
    return freed
