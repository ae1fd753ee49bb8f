"""``gpu_check.py --phase speed``: one table of where a token's time goes on a card (issue 35, item 6).

For the random pair built by gpu_check.py (and pocket's GGUF where ``--gguf`` names it), in one
process: specchat plain, spec-adaptive and n-gram, then transformers' own ``generate`` on the
same model object, eager and with ``cache_implementation="static"`` (which compiles the forward).
Each row: decode tok/s (one timed reply after two warm-ups; the first event, which holds the
prefill, is not counted), then one more reply under ``torch.profiler``: kernel milliseconds a
token, kernels a token and launches a token (``cudaLaunchKernel`` and ``cudaGraphLaunch`` calls
on the host: what a captured pass saves). specchat's rows also say whether the reply equals the
plain one (near-ties aside: docs/gpu.md) and how many passes were captured and replayed.
"""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
MAX_NEW = 128


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profiled(run: Callable[[], int], device: torch.device) -> dict[str, Any]:
    """Run ``run`` (returns the tokens it made) under torch.profiler: per-token kernels, kernel
    milliseconds and host launches (None for the kernel figures without a card)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        tokens = run()
        _sync(device)
    kernels, kernel_us, launches = 0, 0.0, 0
    for event in prof.key_averages():
        if event.key in LAUNCHES:
            launches += event.count
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            kernels += event.count
            kernel_us += float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0))
    tokens = max(tokens, 1)
    cuda = device.type == "cuda"
    return {"kernels_per_token": round(kernels / tokens, 1) if cuda else None,
            "kernel_ms_per_token": round(kernel_us / 1000 / tokens, 3) if cuda else None,
            "launches_per_token": round(launches / tokens, 1) if cuda else None}


def specchat_reply(engine: Any, prompt: list[int], device: torch.device, max_new: int) -> tuple[list[int], float]:
    """One greedy reply's ids and its decode rate (tok/s after the first event)."""
    from engine.events import GenerationParams

    ids: list[int] = []
    began = 0.0
    first = 0
    for event in engine.generate_ids(prompt, GenerationParams(max_new_tokens=max_new)):
        if not ids:
            _sync(device)
            began, first = time.perf_counter(), len(event.token_ids)
        ids += event.token_ids
    _sync(device)
    return ids, (len(ids) - first) / max(time.perf_counter() - began, 1e-9)


def specchat_row(label: str, engine: Any, prompt: list[int], device: torch.device, plain: list[int] | None,
                 max_new: int = MAX_NEW) -> dict[str, Any]:
    for _ in range(2):  # warm-ups: kernels loaded, passes captured
        specchat_reply(engine, prompt, device, max_new)
    ids, rate = specchat_reply(engine, prompt, device, max_new)
    prof = profiled(lambda: len(specchat_reply(engine, prompt, device, max_new)[0]), device)
    runners = [engine.decoder.target, *([engine.decoder.drafter.runner] if hasattr(engine.decoder.drafter, "runner") else [])]
    captured = {f"{'target' if i == 0 else 'draft'}": {"cache": type(r.cache).__name__, "shapes": sorted(r.capture.captured_shapes()),
                                                     "captures": r.capture.captures, "replays": r.capture.replays,
                                                     "off": r.capture.reason} for i, r in enumerate(runners)}
    first = None if plain is None else next((i for i, (a, b) in enumerate(zip(plain, ids)) if a != b), None)
    return {"row": label, "tok_s": round(rate, 1), **prof, "ids": ids,
            "same_as_plain": None if plain is None else (ids == plain), "first_difference": first, "captured": captured}


def transformers_row(label: str, model: Any, prompt: list[int], device: torch.device, static: bool,
                     max_new: int = MAX_NEW) -> dict[str, Any]:
    """transformers' ``generate`` on the same model: eager, or with its static cache (compiled)."""
    ids = torch.tensor([prompt], device=device)
    kwargs: dict[str, Any] = {"max_new_tokens": max_new, "min_new_tokens": max_new, "do_sample": False}
    if static:
        kwargs["cache_implementation"] = "static"

    def run() -> int:
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)
        return int(out.shape[1] - ids.shape[1])

    for _ in range(2):
        run()
    _sync(device)
    began = time.perf_counter()
    n = run()
    _sync(device)
    rate = n / (time.perf_counter() - began)  # the prefill included: a prompt of a few dozen tokens
    return {"row": label, "tok_s": round(rate, 1), **profiled(run, device)}


def speed_phase(models: Path, device: torch.device, with_gguf: bool, out: Path, max_new: int = MAX_NEW) -> list[dict[str, Any]]:
    """Every row of the table, printed and written to ``out / gpu_speed.json``. Without a card the
    compiled baseline is left out (a dry run of the script, not a figure)."""
    from engine.config.models_file import load_profiles
    from engine.load.loader import load_engine

    profiles = load_profiles(models)
    groups = [("pair bf16", "pair-bf16", "pair-ngram")]
    if with_gguf:
        groups += [("pocket int4", None, "pocket-int4"), ("pocket bf16", None, "pocket-bf16")]
    rows: list[dict[str, Any]] = []
    for name, model_profile, ngram_profile in groups:
        engine = load_engine(profiles.get(ngram_profile))
        text = "Write a Python function that merges two sorted lists, then explain how it works."
        prompt = list(engine.tokenizer(text)["input_ids"])
        engine.set_speculation(False)
        plain = specchat_row(f"{name}: specchat plain", engine, prompt, device, None, max_new)
        engine.set_speculation(True)
        rows += [plain, specchat_row(f"{name}: specchat n-gram", engine, prompt, device, plain["ids"], max_new)]
        if not name.endswith("int4"):  # transformers' rows on the bf16 weights only
            model = engine.decoder.target.model
            for static in (False, True) if device.type == "cuda" else (False,):
                try:
                    rows.append(transformers_row(f"{name}: transformers {'static, compiled' if static else 'eager'}",
                                                 model, prompt, device, static, max_new))
                except Exception as exc:  # noqa: BLE001 - a baseline that breaks is a finding, not the end
                    rows.append({"row": f"{name}: transformers {'static' if static else 'eager'}", "error": repr(exc)[:300]})
        engine.close()
        if model_profile is not None:
            engine = load_engine(profiles.get(model_profile))
            rows.append(specchat_row(f"{name}: specchat spec-adaptive", engine, prompt, device, plain["ids"], max_new))
            engine.close()
        del engine
        torch.cuda.empty_cache() if device.type == "cuda" else None
    print_table(rows)
    (out / "gpu_speed.json").write_text(json.dumps(rows, indent=1, default=str))
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("row", "tok_s", "kernel_ms_per_token", "kernels_per_token", "launches_per_token", "same_as_plain")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, r.get("error", "") if k == "tok_s" else "")) for k in head) + " |", flush=True)
    plain_rates = [r["tok_s"] for r in rows if r.get("row", "").endswith("specchat plain")]
    if plain_rates:
        print(f"specchat plain, median over models: {statistics.median(plain_rates)} tok/s", flush=True)
