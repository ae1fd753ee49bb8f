"""The checks a CUDA card owes specchat (docs/gpu.md), in one run that downloads nothing.

    python scripts/gpu_check.py --out DIR [--gguf SmolLM2-135M-Instruct.Q4_1.gguf] [--device cuda] [--phase pair|gguf|speed|all]

Models are built here, seeded: a random Llama-shaped **pair** whose draft is the target's first
layers (the target's further layers add small corrections, so the draft agrees often and costs a
fraction of a target pass, as a real pair's does), saved with a word-level tokenizer over the
bench's own prompts; a **big draft** for the out-of-memory check; and, where ``--gguf`` names
it, SmolLM2-135M's GGUF (the ``pocket`` profile's file) on the card. Each check prints one line
and lands in ``DIR/gpu_check.json``; a failing check is recorded with its error and the run goes on.

``--device cpu`` runs the same code on the CPU (a dry run for the script itself: the
card-only parts say they were skipped). ``--phase speed`` prints one table of tok/s, kernel
milliseconds, kernels and launches a token: specchat's methods beside transformers' ``generate``
on the same models (scripts/gpu_speed.py).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

RESULTS: dict[str, Any] = {}


def check(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the decorated check at once-called time, record its dict (or its error)."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                got = fn(*args, **kwargs)
                RESULTS[name] = {"ok": True, **(got or {})}
            except Exception as exc:  # a check that breaks is a finding: keep going
                RESULTS[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                 "traceback": traceback.format_exc(limit=8)}
            RESULTS[name]["seconds"] = round(time.perf_counter() - start, 2)
            shown = {k: v for k, v in RESULTS[name].items() if k != "traceback"}
            print(f"[{name}] {json.dumps(shown, default=str)[:1500]}", flush=True)
            return RESULTS[name]
        return run
    return wrap


# -- the card, torch's int4 kernel, SDPA's backends -------------------------------------------

@check("card")
def card(device: torch.device) -> dict[str, Any]:
    from engine.model.device import Device

    d = Device(device)
    free, total = d.memory_free_total()
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "device": d.description,
            "capability": d.compute_capability(), "fast_bf16": d.fast_bf16,
            "free_gib": round(free / 2**30, 2), "total_gib": round(total / 2**30, 2)}


@check("int4_kernel")
def int4_kernel(device: torch.device) -> dict[str, Any]:
    """Int4Linear on ``device`` against its own dequantized weights, for the shapes the models here
    have (576: SmolLM2, 4 tiles), one and two planes; and whether a row's result depends on how
    many rows share the call (batch invariance: what makes greedy spec exact, not just near)."""
    from engine.quant.int4 import Int4Linear, cuda_inner_k_tiles, quantize_weight, quantize_weight8

    torch.manual_seed(0)
    out: dict[str, Any] = {}
    for n, k in ((4096, 4096), (1536, 576), (576, 1536), (8960, 1536)):
        for planes, make in ((1, quantize_weight), (2, quantize_weight8)):
            q = make(torch.randn(n, k), 32)
            layer = Int4Linear(q, None, device)
            x = torch.randn(9, k, device=device)
            ref = x.float() @ q.dequantize().to(device).float().T
            y9 = layer(x.to(torch.bfloat16)).float()
            y1 = layer(x[:1].to(torch.bfloat16)).float()
            err = float((y9 - ref).abs().max() / ref.abs().max())
            out[f"{n}x{k}/{planes}p"] = {"tiles": cuda_inner_k_tiles(k * planes), "rel_err": f"{err:.1e}",
                                         "row0_1_vs_9_rows": float((y9[0] - y1[0]).abs().max())}
    worst = max(float(v["rel_err"]) for v in out.values())
    if worst > 2e-2:
        raise AssertionError(f"int4 error {worst:.1e} of the largest output (expect < 2e-2): {out}")
    return {"worst_rel_err": f"{worst:.1e}", "shapes": out}


@check("int4_join")
def int4_join(device: torch.device) -> dict[str, Any]:
    """q, k and v of SmolLM2's shape (576, 192, 192 rows of 576) joined into one int4 matmul
    (:meth:`Int4Linear.join`: the packs' rows concatenated, 8-row blocks on CUDA) against the three
    layers one by one: the same bits expected, for 1 and 9 rows."""
    from engine.quant.int4 import Int4Linear, quantize_weight

    torch.manual_seed(1)
    layers = [Int4Linear(quantize_weight(torch.randn(n, 576), 32), None, device) for n in (576, 192, 192)]
    out: dict[str, Any] = {}
    for rows in (1, 9):
        x = torch.randn(rows, 576, device=device).to(torch.bfloat16)
        apart = torch.cat([layer(x) for layer in layers], dim=-1).float()
        joint = Int4Linear.fuse(layers)(x).float()
        out[f"{rows}_rows_max_diff"] = float((joint - apart).abs().max())
    if any(v != 0.0 for v in out.values()):
        raise AssertionError(f"joined int4 layers differ from the layers one by one: {out}")
    return out


@check("sdpa_backends")
def sdpa_backends(device: torch.device) -> dict[str, Any]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = torch.bfloat16
    q1 = torch.randn(1, 28, 512, 128, device=device, dtype=dt)
    kv = torch.randn(1, 4, 4096, 128, device=device, dtype=dt)
    q9 = q1[:, :, :9]
    mask = torch.ones(9, 4096, dtype=torch.bool, device=device).tril(4096 - 9)
    calls = {"prefill": lambda: F.scaled_dot_product_attention(q1, kv[:, :, :512], kv[:, :, :512], is_causal=True, enable_gqa=True),
             "verify_9_rows": lambda: F.scaled_dot_product_attention(q9, kv, kv, attn_mask=mask, enable_gqa=True),
             "one_token": lambda: F.scaled_dot_product_attention(q9[:, :, :1], kv, kv, enable_gqa=True)}
    out = {}
    for name, call in calls.items():
        ok = []
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
            try:
                with sdpa_kernel(backend):
                    call()
                ok.append(backend.name)
            except RuntimeError:
                pass
        out[name] = ok
    return out


# -- models built here ------------------------------------------------------------------------

def prompt_words() -> list[str]:
    """Every word of the bench's shipped prompts (so its prompts tokenize to real ids)."""
    text = (REPO / "app" / "bench" / "prompts.toml").read_text(encoding="utf-8")
    words = sorted(set(re.findall(r"[A-Za-z]+", text)))
    return [w for w in words if w not in ("unk", "s")]


def build_pair(root: Path, *, hidden: int, draft_layers: int, extra_layers: int, seed: int = 0) -> tuple[Path, Path]:
    """A target of ``draft_layers + extra_layers`` layers and a draft of its first ``draft_layers``
    (same embeddings, final norm and head). The extra layers' output projections are scaled down,
    so they nudge the draft's hidden state rather than replace it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tiny import make_tokenizer

    tokenizer = make_tokenizer(prompt_words())
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=int(hidden * 2.75) // 128 * 128,
                         num_hidden_layers=draft_layers + extra_layers, num_attention_heads=hidden // 64,
                         num_key_value_heads=max(1, hidden // 256), max_position_embeddings=4096,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in target.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, p.shape[1] ** -0.5)
        target.lm_head.weight.mul_(4.0)  # logits a few units apart, as a trained model's are
        for layer in target.model.layers[draft_layers:]:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
    target_dir, draft_dir = root / "target", root / "draft"
    target.to(torch.bfloat16)  # half the bytes to write and read; the card computes in bf16 anyway
    target.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    config.num_hidden_layers = draft_layers
    draft = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    missing = draft.load_state_dict(target.state_dict(), strict=False)
    assert not missing.missing_keys, missing.missing_keys
    draft.save_pretrained(draft_dir)
    tokenizer.save_pretrained(draft_dir)
    return target_dir, draft_dir


def _profile(name: str, description: str, target: Path, drafter: str, device: str, context: int, *,
             draft: Path | None = None, int4: tuple[bool, bool] = (False, False), k_max: int = 8) -> str:
    """One ``[profiles.NAME]`` table; ``int4``: whether the target, and the draft, run torch's int4 kernels."""
    quant = [', quantization = "int4"' if q else "" for q in int4]
    lines = [f"[profiles.{name}]", f'description = "{description}"', f'target = {{ source = "{target}"{quant[0]} }}',
             f'drafter = "{drafter}"', f'device = "{device}"', f"context_length = {context}", f"k_max = {k_max}"]
    if draft is not None:
        lines.insert(4, f'draft = {{ source = "{draft}"{quant[1]} }}')
    return "\n".join(lines) + "\n\n"


def models_file(path: Path, pair: tuple[Path, Path], big: tuple[Path, Path], gguf: Path | None, device: str) -> Path:
    """The profiles of the models built here (and of pocket's GGUF, if given) on ``device``."""
    (target, draft), (small, big_draft) = pair, big
    text = [_profile("pair-bf16", "random pair, bf16", target, "model", device, 4096, draft=draft),
            _profile("pair-ngram", "random pair's target, bf16, n-gram drafts", target, "ngram", device, 4096, k_max=16),
            _profile("pair-int4", "random pair, int4", target, "model", device, 4096, draft=draft, int4=(True, True)),
            _profile("big-draft", "a tiny target and a big draft (out of memory)", small, "model", device, 4096,
                     draft=big_draft)]
    if gguf is not None:
        text += [_profile("pocket-int4", "SmolLM2-135M, the GGUF's Q4_1 blocks", gguf, "ngram", device, 2048,
                          int4=(True, False), k_max=16),
                 _profile("pocket-bf16", "SmolLM2-135M from the GGUF", gguf, "ngram", device, 2048, k_max=16),
                 _profile("pocket-selfdraft", "SmolLM2-135M drafted by its int4 copy", gguf, "model", device, 2048,
                          draft=gguf, int4=(False, True))]
    path.write_text("".join(text), encoding="utf-8")
    return path


# -- the product's own commands ----------------------------------------------------------------

def cli(args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def bench(name: str, models: Path, profile: str, methods: str, out: Path, *, k_range: str = "2,4",
          max_new: int = 96, repeats: int = 2, per_class: int = 2, timeout: int = 240) -> None:
    @check(name)
    def run() -> dict[str, Any]:
        path = out / f"bench-{profile}.json"
        done = cli(["bench", "--models", str(models), "--profile", profile, "--methods", methods, "--k-range", k_range,
                    "--max-new-tokens", str(max_new), "--repeats", str(repeats), "--per-class", str(per_class),
                    "--json", str(path)], timeout)
        (out / f"bench-{profile}.txt").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr[-20000:])
        if not path.is_file():
            raise RuntimeError(f"bench exited {done.returncode} without JSON: {done.stderr[-1500:]}")
        r = json.loads(path.read_text())
        table = [line for line in done.stdout.splitlines() if line.strip()]
        return {"exit": done.returncode, "mismatches": len(r["mismatches"]), "near_tie_flips": r["near_tie_flips"][:12],
                "table": table[-24:]}
    run()


def generate(name: str, models: Path, profile: str, *, mode: str, prompt: str, extra: list[str] | None = None) -> dict[str, Any]:
    @check(name)
    def run() -> dict[str, Any]:
        done = cli(["generate", "--models", str(models), "--profile", profile, "--mode", mode, "--json",
                    "--max-new-tokens", "96", *(extra or []), prompt], 240)
        if done.returncode:
            raise RuntimeError(f"generate exited {done.returncode}: {done.stderr[-1500:]}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        st = r["stats"]
        return {"text": r["text"][:300], "ids": r["token_ids"], "mode": st.get("mode"), "alpha": st.get("alpha"),
                "tau": st.get("tau"), "tokens_per_s": st.get("tokens_per_s"), "speedup": st.get("speedup"),
                "fallback": st.get("fallback_reason"), "stderr_tail": done.stderr[-300:]}
    return run()


def same_ids(name: str, a: dict[str, Any], b: dict[str, Any]) -> None:
    @check(name)
    def run() -> dict[str, Any]:
        x, y = a.get("ids"), b.get("ids")
        if x is None or y is None:
            raise RuntimeError("a reply is missing")
        first = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)
        return {"identical": x == y, "first_difference": first, "lengths": (len(x), len(y))}
    run()


# -- out of memory, for real -----------------------------------------------------------------

@check("attention_ab")
def attention_ab(models: Path, device: torch.device, rounds: int = 3) -> dict[str, Any]:
    """Plain replies of 128 tokens, each with a prompt length not seen before, alternating SDPA
    left free to pick its kernel (``before``: cuDNN's on an H100/H200, which plans every new
    shape) and :meth:`Device.attention_kernels` (``after``); decode tok/s of each reply."""
    import contextlib
    import statistics

    from engine.config.models_file import load_profiles
    from engine.events import GenerationParams
    from engine.load.loader import load_engine
    from engine.model.device import Device

    engine = load_engine(load_profiles(models).get("pair-bf16"))
    engine.set_speculation(False)
    real = Device.attention_kernels
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    rates: dict[str, list[float]] = {"before": [], "after": []}
    length = 150
    try:
        for _ in range(rounds):
            for name in ("before", "after"):
                Device.attention_kernels = (lambda self: contextlib.nullcontext()) if name == "before" else real  # type: ignore[method-assign]
                length += 41
                prompt = [5 + (i * 31) % 500 for i in range(length)]
                count, first, began = 0, 0, 0.0
                for ev in engine.generate_ids(prompt, GenerationParams(max_new_tokens=128)):
                    if not count:
                        sync()
                        began, first = time.perf_counter(), len(ev.token_ids)
                    count += len(ev.token_ids)
                sync()
                rates[name].append(round((count - first) / (time.perf_counter() - began), 1))
    finally:
        Device.attention_kernels = real  # type: ignore[method-assign]
        engine.close()
    return {**rates, "median_before": statistics.median(rates["before"]), "median_after": statistics.median(rates["after"])}


def card_index(device: torch.device) -> torch.device:
    """``cuda`` with its index (the allocator's cap wants one)."""
    return torch.device("cuda", torch.cuda.current_device()) if device.index is None else device


@check("oom_mid_reply")
def oom_mid_reply(models: Path, device: torch.device) -> dict[str, Any]:
    """Load the big-draft pair and answer a long prompt plainly (the target's cache then holds it).
    Cap the caching allocator a little above what is reserved and answer the same prompt with
    speculation on: the target has almost nothing left to read, the draft must read all of it
    (its cache, and SDPA's score matrices over 512-token chunks: hundreds of MiB), so the draft's
    pass fails with a real CUDA out-of-memory error; the draft must be dropped and the reply
    finish with the plain reply's tokens. (On the CPU: the two replies without a cap.)"""
    from engine.config.models_file import load_profiles
    from engine.events import GenerationParams
    from engine.load.loader import load_engine

    cuda = device.type == "cuda"
    engine = load_engine(load_profiles(models).get("big-draft"))
    vocab = len(engine.tokenizer)
    prompt = [5 + (i * 7919) % (vocab - 5) for i in range(3500)]

    def reply(mode: str) -> tuple[list[int], list[str]]:
        engine.set_speculation(mode == "spec")
        ids: list[int] = []
        notices: list[str] = []
        for ev in engine.generate_ids(prompt, GenerationParams(max_new_tokens=48)):
            ids += ev.token_ids
            if ev.notice:
                notices.append(ev.notice)
        return ids, notices

    plain, _ = reply("plain")
    if not cuda:
        spec, notices = reply("spec")
        engine.close()
        return {"skipped": "the allocator cap needs a card", "spec_equals_plain": spec == plain, "notices": notices}
    card = card_index(device)
    gc.collect()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved(card)
    cap = reserved + (64 << 20)
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(card).total_memory, card)
    try:
        capped, notices = reply("spec")
        info = engine.info
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, card)
        engine.close()
    out = {"reserved_mib": reserved >> 20, "cap_mib": cap >> 20, "notices": notices,
           "capped_equals_plain": capped == plain, "first_difference": next(
               (i for i, (a, b) in enumerate(zip(plain, capped)) if a != b), None),
           "mode_after": info.mode, "fallback_reason": info.fallback_reason}
    if not any("out of memory" in n for n in notices):
        raise AssertionError(f"no out-of-memory notice under the cap: {out}")
    return out


@check("oom_at_load")
def oom_at_load(models: Path, device: torch.device) -> dict[str, Any]:
    """Cap the allocator to the small target and some room: the draft's load must fail for real
    and the engine start with the n-gram drafter, saying why."""
    if device.type != "cuda":
        return {"skipped": "needs a card"}
    from engine.config.models_file import load_profiles
    from engine.load.loader import load_engine

    card = card_index(device)
    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(card).total_memory
    cap = torch.cuda.memory_reserved(card) + (256 << 20)
    torch.cuda.set_per_process_memory_fraction(cap / total, card)
    try:
        engine = load_engine(load_profiles(models).get("big-draft"))
        info = engine.info
        engine.close()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, card)
    if not (info.fallback_reason or "").startswith("draft model dropped"):
        raise AssertionError(f"the draft loaded under a {cap >> 20} MiB cap: {info}")
    return {"cap_mib": cap >> 20, "drafter": info.drafter, "fallback_reason": info.fallback_reason}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gguf", type=Path, default=None, help="SmolLM2-135M-Instruct.Q4_1.gguf, if you have it")
    ap.add_argument("--phase", choices=("pair", "gguf", "speed", "all"), default="all",
                    help="pair: the card, the kernel and the built models; gguf: SmolLM2's GGUF only; "
                         "speed: one table, specchat against transformers (the pair, and the GGUF if given)")
    ap.add_argument("--speed-groups", default="pair,pair-int4,pocket,pocket-bf16",
                    help="the speed phase's groups (scripts/gpu_speed.py GROUPS); pocket's need --gguf")
    ap.add_argument("--quick", action="store_true", help="fewer tokens and prompts (the CPU dry run)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(a.device)
    os.environ.setdefault("SPECCHAT_CACHE_DIR", str(a.out.parent / "specchat-cache"))
    gguf = a.gguf if a.gguf is not None and a.gguf.is_file() else None
    if a.gguf is not None and gguf is None:
        RESULTS["gguf"] = {"ok": False, "error": f"{a.gguf} not found"}
    work = a.out.parent / "gpu-check-models"
    work.mkdir(parents=True, exist_ok=True)
    q = {"max_new": 32 if a.quick else 96, "repeats": 1, "per_class": 1}

    card(device)
    pair_phase = a.phase in ("pair", "all")
    if pair_phase:
        int4_kernel(device)
        if device.type == "cuda":
            sdpa_backends(device)
        pair = build_pair(work / "pair", hidden=512 if a.quick else 1024, draft_layers=2, extra_layers=6)
        big = build_pair(work / "big", hidden=256 if a.quick else 2048, draft_layers=1 if a.quick else 6,
                         extra_layers=0, seed=1)
        small = build_pair(work / "small", hidden=128, draft_layers=1, extra_layers=0, seed=1)[0]
    elif a.phase == "speed" and any(g.startswith("pair") for g in a.speed_groups.split(",")):
        pair = build_pair(work / "pair", hidden=512 if a.quick else 1024, draft_layers=2, extra_layers=6)
        big, small = (work / "big" / "target",), work / "small" / "target"
    else:
        pair, big, small = (work / "pair" / "target", work / "pair" / "draft"), (work / "big" / "target",), work / "small" / "target"
    models = models_file(work / "gpu.toml", pair, (small, big[0]), gguf, a.device)
    prompt = (REPO / "app" / "bench" / "prompts.toml").read_text().split('content = "')[1].split('"')[0]
    if pair_phase:
        for profile in ("pair-int4", "pair-bf16"):
            bench(f"bench_{profile}", models, profile, "plain,spec,spec-adaptive", a.out, **q)
            plain = generate(f"seeded_plain_{profile}", models, profile, mode="plain", prompt=prompt,
                             extra=["--temperature", "0.8", "--seed", "7"])
            spec = generate(f"seeded_spec_{profile}", models, profile, mode="spec", prompt=prompt,
                            extra=["--temperature", "0.8", "--seed", "7"])
            same_ids(f"seeded_same_{profile}", plain, spec)
        attention_ab(models, device)
        oom_mid_reply(models, device)
        oom_at_load(models, device)
    if a.phase == "speed":
        int4_join(device)
        sys.path.insert(0, str(REPO / "scripts"))
        import gpu_speed

        groups = [g for g in a.speed_groups.split(",") if g and (gguf is not None or not g.startswith("pocket"))]
        check("speed")(lambda: {"rows": [{k: v for k, v in r.items() if k != "ids"}
                                         for r in gpu_speed.speed_phase(models, device, groups, a.out,
                                                                        16 if a.quick else 128)]})()
    if gguf is not None and a.phase in ("gguf", "all"):
        ask = "Write a Python function that checks whether a string is a palindrome, then explain it."
        for profile in ("pocket-int4", "pocket-bf16"):
            plain = generate(f"plain_{profile}", models, profile, mode="plain", prompt=ask)
            spec = generate(f"ngram_{profile}", models, profile, mode="ngram", prompt=ask)
            same_ids(f"greedy_same_{profile}", plain, spec)
            bench(f"bench_{profile}", models, profile, "plain,ngram,suffix", a.out, k_range="4", **q)
        bench("bench_pocket-selfdraft", models, "pocket-selfdraft", "plain,spec,spec-adaptive", a.out, **q)
    (a.out / f"gpu_check-{a.phase}.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    bad = [k for k, v in RESULTS.items() if not v.get("ok")]
    print("failed checks:", bad or "none", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
