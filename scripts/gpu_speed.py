"""``gpu_check.py --phase speed``: one table of where a token's time goes on a card (issue 35, item 6).

For the random pair built by gpu_check.py (and pocket's GGUF where ``--gguf`` names it), in one
process: specchat plain, spec-adaptive and n-gram, then transformers' own ``generate`` on the
same model object, eager and with ``cache_implementation="static"`` (which compiles the forward).
Each row: decode tok/s (one timed reply after two warm-ups or more, until one captured nothing
new: the tokens after the first over the reply's whole time less that of a one-token reply, the
prompt's pass; passes captured during the timed reply are counted beside it; ``tok_s_after_first``
is the older figure, counted from the first event, which flatters chained replies), then one more reply under ``torch.profiler``: kernel milliseconds a
token, kernels a token and launches a token (``cudaLaunchKernel`` and ``cudaGraphLaunch`` calls
on the host: what a captured pass saves). specchat's rows also say whether the reply equals the
plain one (near-ties aside: docs/gpu.md), how many passes were captured and replayed, whether
they were compiled, and the warm-ups' seconds (captures and compiles happen there).
``--speed-groups`` picks the groups (:data:`GROUPS`); the ``*-compiled`` ones load with
``SPECCHAT_COMPILE=1`` (a card's default), the others with ``SPECCHAT_COMPILE=0``.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

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
    by_name: list[tuple[float, int, str]] = []
    for event in prof.key_averages():
        if event.key in LAUNCHES:
            launches += event.count
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            us = float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0))
            kernels += event.count
            kernel_us += us
            by_name.append((us, event.count, event.key))
    tokens = max(tokens, 1)
    cuda = device.type == "cuda"
    return {"kernels_per_token": round(kernels / tokens, 1) if cuda else None,
            "kernel_ms_per_token": round(kernel_us / 1000 / tokens, 3) if cuda else None,
            "launches_per_token": round(launches / tokens, 1) if cuda else None,
            "kernels_by_name": [{"kernel": name[:90], "per_token": round(count / tokens, 2),
                                 "us_per_token": round(us / tokens, 2)} for us, count, name in sorted(by_name, reverse=True)[:24]]}


class Timed(NamedTuple):
    ids: list[int]
    whole_s: float  # from the call to the last token, the prompt's pass included
    after_first: float  # tok/s after the first event (the figure of the runs before 2026-11-27)


def specchat_reply(engine: Any, prompt: list[int], device: torch.device, max_new: int,
                   sampling: Any = None, events: list[Any] | None = None) -> Timed:
    """One reply's ids, its whole time and its rate after the first event.

    The rate after the first event flatters a reply that comes in few events: a chain of rounds
    queues the next chain before the host reads the first (engine/decode/chain.py), so when the
    first event arrives the card is already part-way through the tokens counted after it. A
    model-drafted chain of 8 rounds can bring half a 128-token reply in its first event. The
    rows' ``tok_s`` is therefore :func:`decode_rate`: the whole time less the prompt's pass.
    ``events``: each of the reply's events is appended to it."""
    from engine.events import GenerationParams, SamplingParams

    ids: list[int] = []
    began = 0.0
    first = 0
    # No stop token (an id no vocabulary has): every reply runs ``max_new`` tokens, as
    # transformers' rows do with ``min_new_tokens`` (the random pair says its EOS after ~50).
    params = GenerationParams(max_new_tokens=max_new, stop_token_ids=(-1,), sampling=sampling or SamplingParams())
    _sync(device)
    called = time.perf_counter()
    for event in engine.generate_ids(prompt, params):
        if not ids:
            _sync(device)
            began, first = time.perf_counter(), len(event.token_ids)
        ids += event.token_ids
        if events is not None:
            events.append(event)
    _sync(device)
    end = time.perf_counter()
    return Timed(ids, end - called, (len(ids) - first) / max(end - began, 1e-9))


def prompt_pass_s(engine: Any, prompt: list[int], device: torch.device) -> float:
    """The median time of three one-token replies to ``prompt``: its pass and the first token."""
    return statistics.median(specchat_reply(engine, prompt, device, 1).whole_s for _ in range(3))


def decode_rate(timed: Timed, prompt_s: float) -> float:
    """Tokens after the first a second, over the reply's whole time less :func:`prompt_pass_s`."""
    return (len(timed.ids) - 1) / max(timed.whole_s - prompt_s, 1e-9)


def specchat_row(label: str, engine: Any, prompt: list[int], device: torch.device, plain: list[int] | None,
                 max_new: int = MAX_NEW, sampling: Any = None) -> dict[str, Any]:
    runners = [engine.decoder.target, *([engine.decoder.drafter.runner] if hasattr(engine.decoder.drafter, "runner") else [])]
    captures = lambda: sum(r.capture.captures for r in runners)  # noqa: E731
    began = time.perf_counter()
    quiet = 0
    for _ in range(WARMUPS_MAX):  # kernels loaded, passes captured (and compiled): until two replies capture nothing
        before = captures()
        specchat_reply(engine, prompt, device, max_new, sampling)
        quiet = quiet + 1 if captures() == before else 0
        if quiet >= 2:
            break
    warmup_s = time.perf_counter() - began
    prompt_s = prompt_pass_s(engine, prompt, device)
    before = captures()
    events: list[Any] = []
    timed = specchat_reply(engine, prompt, device, max_new, sampling, events)
    stats = events[-1].stats if events else None
    ids, rate = timed.ids, decode_rate(timed, prompt_s)
    captured_while_timed = captures() - before  # a capture costs 10-100 ms, a whole reply here: not a speed
    prof = profiled(lambda: len(specchat_reply(engine, prompt, device, max_new, sampling).ids), device)
    captured = {f"{'target' if i == 0 else 'draft'}": {"cache": type(r.cache).__name__, "shapes": sorted(r.capture.captured_shapes()),
                                                     "captures": r.capture.captures, "replays": r.capture.replays,
                                                     "capture_s": round(r.capture.capture_s, 2),
                                                     "compiled": r.passes_compiled,
                                                     "off": r.capture.reason} for i, r in enumerate(runners)}
    first = None if plain is None else next((i for i, (a, b) in enumerate(zip(plain, ids)) if a != b), None)
    return shown({"row": label, "tok_s": round(rate, 1), "tok_s_after_first": round(timed.after_first, 1),
                  "prompt_ms": round(prompt_s * 1000, 2), "tokens": len(ids), **prof, "warmup_s": round(warmup_s, 1),
                  "captured_while_timed": captured_while_timed, "ids": ids,
                  "tau": None if stats is None or stats.tau is None else round(stats.tau, 2),
                  "alpha": None if stats is None or stats.alpha is None else round(stats.alpha, 3),
                  "rounds": None if stats is None else stats.rounds, "k": None if stats is None else stats.k,
                  "same_as_plain": None if plain is None else (ids == plain), "first_difference": first,
                  "captured": captured})


HEAD = ("row", "tok_s", "tok_s_after_first", "tokens", "kernel_ms_per_token", "kernels_per_token", "launches_per_token", "same_as_plain",
        "warmup_s", "captured_while_timed", "tau", "rounds")
WARMUPS_MAX = 7
"""Warm-up replies at most before the timed one: at least two, then until two in a row capture nothing new
(the adaptive schedule tries new K, hence new pass widths, for a while)."""


def shown(row: dict[str, Any]) -> dict[str, Any]:
    """Print ``row`` as a line of the table at once (a run cut short by its time limit keeps the
    rows it finished) and return it."""
    print("| " + " | ".join(str(row.get(k, row.get("error", "") if k == "tok_s" else "")) for k in HEAD) + " |",
          flush=True)
    return row


def transformers_row(label: str, model: Any, prompt: list[int], device: torch.device, static: bool,
                     max_new: int = MAX_NEW) -> dict[str, Any]:
    """transformers' ``generate`` on the same model: eager, or with its static cache (compiled)."""
    ids = torch.tensor([prompt], device=device)
    kwargs: dict[str, Any] = {"max_new_tokens": max_new, "min_new_tokens": max_new, "do_sample": False}
    if static:
        kwargs["cache_implementation"] = "static"

    def run(new: int = max_new) -> int:
        with torch.inference_mode():
            out = model.generate(ids, **{**kwargs, "max_new_tokens": new, "min_new_tokens": new})
        return int(out.shape[1] - ids.shape[1])

    def whole_s(new: int) -> float:
        _sync(device)
        began = time.perf_counter()
        run(new)
        _sync(device)
        return time.perf_counter() - began

    for _ in range(2):
        run()
    prompt_s = statistics.median(whole_s(1) for _ in range(3))  # as specchat's rows: the prompt's pass left out
    rate = (max_new - 1) / max(whole_s(max_new) - prompt_s, 1e-9)
    return shown({"row": label, "tok_s": round(rate, 1), "prompt_ms": round(prompt_s * 1000, 2), "tokens": max_new,
                  **profiled(run, device)})


class Group(NamedTuple):
    name: str
    plain_profile: str  # loaded for the plain row (and its own drafter's row)
    ngram: bool  # whether that profile's drafter is n-gram
    model_profile: str | None  # a model-drafted profile of the same target, or None
    transformers: bool  # whether transformers' rows run on its bf16 model
    compile: bool = False  # static passes through torch.compile (SPECCHAT_COMPILE=1)
    fused: bool = True  # a card's fused rope, cache write and attention (SPECCHAT_CARD_ATTENTION=1)
    brief: bool = False  # the plain row and its drafter's only (the A/B of a switch)


GROUPS: dict[str, Group] = {
    "pair": Group("pair bf16", "pair-ngram", True, "pair-bf16", True),
    "pair-int4": Group("pair int4", "pair-int4", False, None, False),
    "pair-compiled": Group("pair bf16 compiled", "pair-ngram", True, "pair-bf16", False, compile=True),
    "pocket": Group("pocket int4", "pocket-int4", True, None, False),
    "pocket-bf16": Group("pocket bf16", "pocket-bf16", True, "pocket-selfdraft", True),
    "pocket-compiled": Group("pocket int4 compiled", "pocket-int4", True, None, False, compile=True),
    "pocket-bf16-compiled": Group("pocket bf16 compiled", "pocket-bf16", True, "pocket-selfdraft", False, compile=True),
    # the same with SDPA's attention in place of the fused kernel (engine/model/card_attention.py)
    "pair-compiled-sdpa": Group("pair bf16 compiled, SDPA", "pair-ngram", True, None, False, True, False, True),
    "pocket-compiled-sdpa": Group("pocket int4 compiled, SDPA", "pocket-int4", True, None, False, True, False, True),
    "pocket-bf16-compiled-sdpa": Group("pocket bf16 compiled, SDPA", "pocket-bf16", True, None, False, True, False,
                                       True),
}
"""What ``--speed-groups`` can name: each group's rows share one target and one plain reply."""


def prompt_ids(engine: Any, text: str) -> list[int]:
    """``text`` as a user's message through the tokenizer's chat template where it has one (an
    instruct model answers a bare prompt with its end-of-turn token), else the bare ids."""
    from engine.chat.text import render_prompt
    from engine.events import ChatMessage

    if getattr(engine.tokenizer, "chat_template", None):
        return render_prompt(engine.tokenizer, [ChatMessage(role="user", content=text)])
    return list(engine.tokenizer(text)["input_ids"])


GROUNDED_PROMPT = "rewrite-formal"
"""The bench's grounded prompt whose reply copies most of it (app/bench/prompts.toml): the n-gram drafter's
own ground. The first prompt gives a lookup little to copy (pocket's n-gram: τ about 1.0 on a card)."""


def grounded_rows(name: str, engine: Any, device: torch.device, max_new: int) -> list[dict[str, Any]]:
    """Plain, then the profile's lookup drafter, on :data:`GROUNDED_PROMPT` (``engine``'s speculation
    is left on)."""
    from app.bench.inputs import load_prompt_set
    from engine.chat.text import render_prompt

    spec = next(s for s in load_prompt_set() if s.name == GROUNDED_PROMPT)
    prompt = render_prompt(engine.tokenizer, list(spec.messages))
    engine.set_speculation(False)
    plain = specchat_row(f"{name}: specchat plain, {GROUNDED_PROMPT}", engine, prompt, device, None, max_new)
    engine.set_speculation(True)
    lookup = specchat_row(f"{name}: specchat n-gram, {GROUNDED_PROMPT}", engine, prompt, device, plain["ids"], max_new)
    lookup["speedup"] = round(lookup["tok_s"] / max(plain["tok_s"], 1e-9), 2)
    return [plain, lookup]


def speed_phase(models: Path, device: torch.device, groups: list[str], out: Path,
                max_new: int = MAX_NEW) -> list[dict[str, Any]]:
    """Every row of ``groups`` (keys of :data:`GROUPS`), printed and written to
    ``out / gpu_speed-<groups>.json``. Per group: specchat plain with captured passes, the same
    engine's plain with capture turned off (eager passes over the same static cache), its
    speculative row(s), and transformers' eager and static-cache compiled ``generate`` on the
    same bf16 model object. Without a card the compiled baseline is left out (a dry run of the
    script, not a figure)."""
    from engine.config.models_file import load_profiles
    from engine.events import SamplingParams
    from engine.load.loader import load_engine

    profiles = load_profiles(models)
    text = "Write a Python function that merges two sorted lists, then explain how it works."
    rows: list[dict[str, Any]] = []
    for key in groups:
        name, plain_profile, ngram, model_profile, with_hf, compiled, fused, brief = GROUPS[key]
        os.environ["SPECCHAT_COMPILE"] = "1" if compiled else "0"  # read by each runner as the engine loads
        os.environ["SPECCHAT_CARD_ATTENTION"] = "1" if fused else "0"
        loading = time.perf_counter()
        engine = load_engine(profiles.get(plain_profile))
        load_s = round(time.perf_counter() - loading, 1)  # a card compiles the layers here
        prompt = prompt_ids(engine, text)
        engine.set_speculation(False)
        plain = specchat_row(f"{name}: specchat plain", engine, prompt, device, None, max_new)
        plain["load_s"] = load_s
        plain["fused"] = engine.decoder.target.why_unfused or "fused"
        print(f"{name}: loaded in {load_s} s (compiling included); attention: {plain['fused']}", flush=True)
        if not brief:
            rows.append(specchat_row(f"{name}: specchat plain, sampled (T 0.8, seed 1)", engine, prompt, device, None,
                                     max_new, SamplingParams(temperature=0.8, seed=1)))  # bursts too (read_once)
        engine.set_speculation(True)
        rows += [plain, specchat_row(f"{name}: specchat {'n-gram' if ngram else 'spec-adaptive'}", engine, prompt,
                                     device, plain["ids"], max_new)]
        if ngram and not brief:  # where a lookup has something to copy (issue 35's n-gram aim)
            rows += grounded_rows(name, engine, device, max_new)
        if with_hf:  # transformers' rows on the bf16 weights only
            model = engine.decoder.target.model
            for static in (False, True) if device.type == "cuda" else (False,):
                try:
                    rows.append(transformers_row(f"{name}: transformers {'static, compiled' if static else 'eager'}",
                                                 model, prompt, device, static, max_new))
                except Exception as exc:  # noqa: BLE001 - a baseline that breaks is a finding, not the end
                    rows.append(shown({"row": f"{name}: transformers {'static' if static else 'eager'}",
                                       "error": repr(exc)[:300]}))
        if engine.decoder.target.capture.active and not brief:  # last: turning capture off is for good
            engine.decoder.target.capture.disable("off for the eager row")
            engine.set_speculation(False)
            rows.append(specchat_row(f"{name}: specchat plain, capture off", engine, prompt, device, plain["ids"], max_new))
        engine.close()
        if model_profile is not None:
            engine = load_engine(profiles.get(model_profile))
            chain = engine.decoder.chain
            rows.append(specchat_row(f"{name}: specchat spec-adaptive ({model_profile}), chains of {chain}", engine,
                                     prompt, device, plain["ids"], max_new))
            if chain > 1:  # the same engine a round a read-back (engine/decode/chain.py off)
                engine.decoder.chain = 1
                rows.append(specchat_row(f"{name}: specchat spec-adaptive ({model_profile}), unchained", engine,
                                         prompt, device, plain["ids"], max_new))
            engine.close()
        del engine
        torch.cuda.empty_cache() if device.type == "cuda" else None
    print_table(rows)
    (out / f"gpu_speed-{'-'.join(groups)}.json").write_text(json.dumps(rows, indent=1, default=str))
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """The whole table again, once every row is in."""
    print("| " + " | ".join(HEAD) + " |")
    print("|" + " --- |" * len(HEAD))
    for r in rows:
        shown(r)
    for r in rows:  # where a plain token's card time goes
        if r.get("row", "").endswith("specchat plain") and r.get("kernels_by_name"):
            print(f"{r['row']}, kernels a token: " + "; ".join(
                f"{k['per_token']:g}× {k['kernel'][:48]} {k['us_per_token']:g} µs" for k in r["kernels_by_name"][:14]))
    plain_rates = [r["tok_s"] for r in rows if r.get("row", "").endswith("specchat plain")]
    if plain_rates:
        print(f"specchat plain, median over models: {statistics.median(plain_rates)} tok/s", flush=True)
