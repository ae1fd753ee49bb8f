"""The int4 cache: the groups of a quantized model, kept so a warm start quantizes nothing.

A safetensors file per (model, group size, head setting) under ``cache_dir()/int4``, keyed by
the source location and the size and mtime of its weight files, so a changed checkpoint is
quantized again. Where specchat's CPU kernel runs, it holds each layer as that kernel reads it
(:class:`KernelLayout`: a warm start packs nothing); elsewhere 4-bit codes two to a byte with
fp32 scales and zeros. A cache of the second kind found where the first is wanted is read once,
rewritten and removed. Each is written to a temporary name and renamed into place, and the caches
it supersedes (the same model and settings from an older specchat, or from weights since changed:
1.5 GB each for coder's target) are removed then (:func:`_drop_superseded`). A disk that fills
while a cache is written stops the load with :class:`~engine.errors.StorageError` (where, how
much), the partial file removed.

:func:`apply_int4` (quantize a loaded model) and :func:`load_int4_streamed` (build one weight
at a time) read and write it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import engine.quant.cpu_isa as cpu_isa
import engine.quant.cpu_kernel as cpu_kernel
import engine.quant.cpu_pack as cpu_pack
from engine.paths import disk_full, disk_full_error, make_dir
from engine.quant.cpu_pack import KernelLayout
from engine.quant.int4 import Int4Weights, QuantReport, nibble_pairs, quantize_model

log = logging.getLogger(__name__)
CACHE_VERSION = 3  # 2: two-plane (8-bit) groups; 3: Q6_K carried as 6-bit groups of 16
_CACHE_NAME = re.compile(r"^(?P<model>.+)-(?P<key>[0-9a-f]{16})-(?P<tags>g\d+(?:-nohead)?(?:-planes)?)(?:-k(?P<layout>\d+(?:-vnni)?(?:-t\d+)?))?\.safetensors$")
"""What :func:`_cache_file` names a cache: the model's directory name, the key (source, version,
weight files), the settings, the kernel layout's version (``-vnni``: the VNNI variants' order, ``-t4``: Q4_K rows
in tiles of four; :func:`engine.quant.cpu_pack.layout_tag`)."""


def local_snapshot(location: str) -> Path | None:
    """The directory holding the weights of ``location``: itself when it is one, else the hub
    cache's snapshot of that repo when it is downloaded already (None otherwise: nothing is
    fetched here)."""
    root = Path(location)
    if root.is_dir():
        return root
    try:
        from huggingface_hub import snapshot_download

        found = Path(snapshot_download(location, local_files_only=True))
    except Exception:  # noqa: BLE001 - not a hub id, or not downloaded: no cache then
        return None
    return found if found.is_dir() else None


def _cache_file(location: str, group_size: int, quantize_head: bool, wide_planes: bool,
                layout: bool = False) -> Path | None:
    """Where the int4 groups of the weights in ``location`` are cached: a directory, or a hub
    repo's downloaded snapshot (its directory names the commit); None when neither is at hand.
    ``layout``: the cache that keeps specchat's CPU kernel's layout (:func:`_save`)."""
    from engine.paths import cache_dir

    root = local_snapshot(location)
    if root is None:
        return None
    if not Path(location).is_dir():
        location = str(root)  # a hub snapshot: its path names the repo and the commit
    ident = [location, str(CACHE_VERSION)]
    for f in sorted(root.glob("*.safetensors")):
        st = f.stat()
        ident.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    key = hashlib.sha256("|".join(ident).encode()).hexdigest()[:16]
    tags = (f"g{group_size}{'' if quantize_head else '-nohead'}{'-planes' if wide_planes else ''}"
            f"{f'-k{cpu_pack.layout_tag()}' if layout else ''}")
    return cache_dir(create=True) / "int4" / f"{root.name[:60]}-{key}-{tags}.safetensors"


def _save(path: Path, groups: dict[str, Int4Weights | KernelLayout], carried: list[str], packed: bool = False,
          layouts: dict[str, KernelLayout] | None = None, source: str | None = None) -> None:
    """Write ``groups`` (codes two to a byte already when ``packed``: :func:`engine.quant.stream.pack_for_cache`),
    those named in ``layouts`` as specchat's CPU kernel reads them instead; ``source``: the directory
    they were made from (:func:`_source_of`), recorded, and the caches this one supersedes removed."""
    from safetensors.torch import save_file

    layouts = layouts or {}
    tensors: dict[str, torch.Tensor] = {}
    for name, w in groups.items():
        if name in layouts:
            tensors[f"{name}.packed"] = layouts[name].packed.contiguous()
            if layouts[name].table.numel():  # a 6-bit weight keeps its scales in its rows
                tensors[f"{name}.table"] = layouts[name].table.contiguous()
            continue
        assert isinstance(w, Int4Weights), f"{name}: a kernel layout given without its layer's"
        tensors[f"{name}.codes"] = w.codes.contiguous() if packed else nibble_pairs(w.codes)
        tensors[f"{name}.scale"] = w.scale.contiguous()
        tensors[f"{name}.zero"] = w.zero.contiguous()
    make_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    group_size = max(w.group_size for w in groups.values())  # the model's (a Q6_K's groups of 16 are listed)
    meta = {"carried": json.dumps(carried), "group_size": str(group_size),
            "planes": json.dumps({name: w.planes for name, w in groups.items() if w.planes != 1}),
            "groups": json.dumps({name: w.group_size for name, w in groups.items() if w.group_size != group_size}),
            "layouts": json.dumps({name: [*l.shape, cpu_pack.layout_tag()] for name, l in layouts.items()})}
    if source is not None:
        meta["source"] = source
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    except Exception as exc:  # safetensors wraps the file system's errors in its own kind
        if disk_full(exc):
            needed = sum(t.numel() * t.element_size() for t in tensors.values())
            raise disk_full_error(path, f"the int4 cache {path.name}", needed) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)  # a cache half-written is never left behind
    if source is not None:
        _drop_superseded(path, source)


def _source_of(location: str) -> str | None:
    """The directory a cache is made from, as :func:`_save` records it."""
    root = local_snapshot(location)
    return str(root.resolve()) if root is not None else None


def _drop_superseded(path: Path, source: str) -> list[Path]:
    """Remove the caches that ``path`` (just written from ``source``) replaces: the same model
    name and settings under another key (an older version, weights since changed) or another
    version of the kernel's layout, written from the same source or before sources were recorded.
    Caches of other settings, of other directories, and the same key's cache for the other kernel
    (a card's codes beside the CPU's layout) or for another kernel variant this CPU runs stay (a layout no
    variant here reads, such as an AVX-512 machine's before its Q4_K rows came in tiles, goes).
    Returns the removed."""
    from safetensors import safe_open

    mine = _CACHE_NAME.match(path.name)
    if mine is None:
        return []
    removed = []
    for other in path.parent.glob(f"{_glob_escape(mine['model'])}-*.safetensors"):
        theirs = _CACHE_NAME.match(other.name)
        if other == path or theirs is None or (theirs["model"], theirs["tags"]) != (mine["model"], mine["tags"]):
            continue
        if theirs["key"] == mine["key"] and None in (theirs["layout"], mine["layout"]):
            continue
        if theirs["key"] == mine["key"] and theirs["layout"] in _layouts_here():
            continue  # another kernel variant's layout this CPU runs (SPECCHAT_CPU_KERNEL switches back)
        try:
            with safe_open(str(other), framework="pt") as f:
                recorded = (f.metadata() or {}).get("source")
        except Exception:  # noqa: BLE001 - an unreadable cache of this model is of no use either
            recorded = None
        if recorded not in (None, source):
            continue
        other.unlink(missing_ok=True)
        removed.append(other)
        log.info("int4: removed %s, superseded by %s", other.name, path.name)
    return removed


def _layouts_here() -> set[str]:
    """The layouts (:func:`engine.quant.cpu_pack.layout_tag`) of the kernel variants this CPU has the flags for."""
    return {cpu_pack.layout_tag(name) for name in cpu_kernel.VARIANTS if cpu_isa.has(name)}


def _glob_escape(text: str) -> str:
    """``text`` matched literally by :meth:`Path.glob`."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def _load(path: Path) -> tuple[dict[str, Int4Weights | KernelLayout], list[str]] | None:
    """What :func:`_save` wrote (None when the file is unreadable or laid out for another kernel version)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            group_size = int(meta["group_size"])
            names = {k.rsplit(".", 1)[0] for k in f.keys()}
            planes = json.loads(meta.get("planes", "{}"))
            sizes = json.loads(meta.get("groups", "{}"))
            layouts = json.loads(meta.get("layouts", "{}"))
            groups: dict[str, Int4Weights | KernelLayout] = {}
            for name in names:
                size, count = int(sizes.get(name, group_size)), int(planes.get(name, 1))
                if name in layouts:
                    n, k, version = layouts[name]
                    if str(version) != cpu_pack.layout_tag():
                        return None
                    table = (f.get_tensor(f"{name}.table") if f"{name}.table" in f.keys()
                             else torch.empty(n, 0, dtype=torch.uint8))  # on the file's mapping: Int4Linear copies
                    groups[name] = KernelLayout(f.get_tensor(f"{name}.packed"), table, (int(n), int(k)), size, count)
                    continue
                pairs = f.get_tensor(f"{name}.codes")
                codes = torch.stack([pairs >> 4, pairs & 0x0F], dim=-1).reshape(pairs.shape[0], -1)
                groups[name] = Int4Weights(codes, f.get_tensor(f"{name}.scale"), f.get_tensor(f"{name}.zero"), size, count)
            return groups, json.loads(meta.get("carried", "[]"))
    except Exception as exc:  # noqa: BLE001 - a damaged cache is rebuilt, never fatal
        log.warning("int4 cache %s is unreadable (%s); quantizing again", path, exc)
        return None


def load_int4_streamed(
    location: str, config: Any, *, dtype: torch.dtype, device: torch.device, group_size: int = 32,
    quantize_head: bool = True, gguf: Path | None = None, wide_planes: bool = False,
    on_layer: Callable[[int, int], None] | None = None,
) -> nn.Module | None:
    """An int4 model of the checkpoint at ``location`` (a directory, a GGUF's converted copy or a
    downloaded hub snapshot), built one weight at a time on ``device``
    (:func:`engine.quant.stream.stream_int4`; ``gguf`` and ``wide_planes`` as for
    :func:`apply_int4`), with the int4 cache read and written as :func:`apply_int4` does;
    ``on_layer`` is told ``(layers done, layers)`` as it goes. None: take the plain path."""
    from engine.quant.stream import stream_int4

    root = local_snapshot(location)
    if root is None:
        return None
    layout = device.type == "cpu" and cpu_kernel.matmul() is not None
    cache = _cache_file(location, group_size, quantize_head, wide_planes, layout)
    cached = _load(cache) if cache is not None and cache.is_file() else None
    built = stream_int4(root, config, dtype=dtype, device=device, group_size=group_size,
                        quantize_head=quantize_head, cached=cached[0] if cached else None,
                        gguf=gguf, wide_planes=wide_planes, on_layer=on_layer)
    if built is None:
        return None
    model, report = built
    if cached is not None:
        report.carried_over = [n for n in report.quantized if n in cached[1]]
    if cache is not None and report.groups and cached is None:
        _save(cache, report.groups, report.carried_over, packed=True, layouts=report.layouts if layout else None,
              source=_source_of(location))
    log.info("%s%s", report.summary(), f" (from the cache {cache})" if cached else "")
    return model


def apply_int4(
    model: nn.Module,
    *,
    location: str,
    gguf: Path | None,
    group_size: int = 32,
    quantize_head: bool = True,
    device: torch.device | None = None,
    wide_planes: bool = False,
    on_layer: Callable[[int, int], None] | None = None,
) -> QuantReport:
    """Quantize ``model`` (loaded in full precision) to int4 in place.

    Args:
        model: the causal LM; its linear layers are replaced.
        location: the directory its weights came from (the cache key), or a hub id.
        gguf: the GGUF file ``location`` was converted from, if any: its
            blocks are carried over when ``group_size`` is 32 (4-bit types as
            int4, wider ones as two int4 planes; :mod:`engine.quant.gguf_blocks`).
        group_size: 32, 64 or 128 inputs per scale and zero.
        quantize_head: quantize the output layer too.
        device: where the packed weights go.
        wide_planes: keep GGUF blocks of more than 4 bits as two int4 planes (8 bits; a Q6_K's
            in groups of 16, 6-bit codes on specchat's kernel); otherwise they are requantized
            to int4 from their weights.
        on_layer: told ``(layers done, layers)`` as each layer is packed (progress).
    """
    layout = (device is None or device.type == "cpu") and cpu_kernel.matmul() is not None
    cache = _cache_file(location, group_size, quantize_head, wide_planes, layout)
    cached = _load(cache) if cache is not None and cache.is_file() else None
    found = cache
    carry = gguf is not None and group_size == 32 and gguf.is_file()
    # an older cache of codes and scales: read once, rewritten below; not where the GGUF is at hand, whose Q4_K
    # and Q6_K blocks carry their own scales (the kernel's exact tables), which that cache lacks
    if cached is None and layout and not carry:
        found = _cache_file(location, group_size, quantize_head, wide_planes)
        cached = _load(found) if found is not None and found.is_file() else None
    if cached is not None:
        groups, carried_names = cached
        report = quantize_model(model, group_size=group_size, quantize_head=quantize_head, groups=groups, device=device,
                                on_layer=on_layer)
        report.carried_over = [n for n in report.quantized if n in carried_names]
        if found != cache and cache is not None and found is not None:
            _save(cache, report.groups, report.carried_over, layouts=report.layouts, source=_source_of(location))
            found.unlink(missing_ok=True)  # superseded (1.7 GB for coder's target); rebuilt if ever needed again
        log.info("%s (from the cache %s)", report.summary(), found)
        return report
    carried: dict[str, Int4Weights] = {}
    if carry:
        from engine.quant.gguf_blocks import carry_over

        carried = carry_over(gguf, model, wide_planes=wide_planes)
    report = quantize_model(model, group_size=group_size, quantize_head=quantize_head, groups=carried, device=device,
                            on_layer=on_layer)
    report.carried_over = [n for n in report.quantized if n in carried]
    if cache is not None and report.groups:
        _save(cache, report.groups, report.carried_over, layouts=report.layouts if layout else None,
              source=_source_of(location))
    log.info("%s", report.summary())
    return report

