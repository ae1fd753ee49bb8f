"""How close is an int4 model to the fp32 conversion of the same GGUF? (docs/performance.md)

    .venv/bin/python scripts/int4_accuracy.py [--profile pocket] [--new-tokens 256] [--json OUT]

For the profile's target source, loads the fp32 conversion (the GGUF's blocks
dequantized by the ``gguf`` package, llama.cpp's reference arithmetic) and int4
models: as the profile sets it, with every wider GGUF block requantized to int4
(``wide_blocks = "int4"``), with wider blocks kept as two int4 planes
(``"planes"``), and with the output layer kept in full precision. Then on every
prompt of the shipped bench set it reports:

* the max abs difference of the logits over the prompt's positions, and the
  largest fp32 logit for scale;
* greedy agreement: the int4 model decodes ``--new-tokens`` tokens; how many
  come out before the first token the fp32 model would not have chosen, and
  the share of positions where fp32, teacher-forced on int4's text, picks the
  same token;
* for a GGUF: the error that rounding each block's scale and zero to bf16
  adds, against the ``gguf`` package's dequantization, per kind of block.

Timing-free: it can run on a busy machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from app.bench.inputs import load_prompt_set
from engine.chat.text import render_prompt
from engine.model.device import Device
from engine.load.weights import load_tokenizer, load_weights
from engine.config.models_file import load_profiles
from engine.quant.gguf_blocks import bf16_rounding_error, carry_over
from engine.decode.runner import ModelRunner
from engine.fetch.sources import gguf_origin, locate, prepare


def greedy(runner: ModelRunner, prompt: list[int], n: int) -> list[int]:
    logits = runner.forward(prompt, logits_to_keep=1)
    out = []
    for _ in range(n):
        token = int(torch.argmax(logits[-1]))
        out.append(token)
        logits = runner.forward([token], logits_to_keep=1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="pocket")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    device = Device(torch.device("cpu"))
    spec = load_profiles().get(args.profile).target
    resolved = prepare(locate(dataclasses.replace(spec, quantization="none")))  # the full float32 copy: the reference
    tokenizer = load_tokenizer(resolved, spec)
    fp32 = ModelRunner(load_weights(resolved, dataclasses.replace(spec, quantization="none"), device), device)
    variants = {
        "int4, wider blocks requantized to int4": dataclasses.replace(spec, quantization="int4", wide_blocks="int4"),
        "int4, wider blocks as two planes": dataclasses.replace(spec, quantization="int4", wide_blocks="planes"),
        "int4, output layer fp32": dataclasses.replace(spec, quantization="int4", quantize_head=False),
    }
    report: dict[str, object] = {"source": spec.source, "new_tokens": args.new_tokens, "variants": {}}
    gguf = gguf_origin(resolved)
    if gguf is not None:
        from transformers import AutoModelForCausalLM

        reference = AutoModelForCausalLM.from_pretrained(resolved.location, dtype=torch.float32)
        by_planes: dict[str, list[tuple[float, float]]] = {}
        for w in carry_over(gguf, reference).values():
            by_planes.setdefault(f"{w.planes} plane(s)", []).append(bf16_rounding_error(w))
        report["bf16_rounding"] = {kind: {"tensors": len(errs), "max_abs": max(e[0] for e in errs),
                                          "max_of_range": max(e[1] for e in errs)}
                                   for kind, errs in by_planes.items()}
        del reference
    prompts = [(p.name, render_prompt(tokenizer, p.messages)) for p in load_prompt_set()]
    for label, vspec in variants.items():
        q = ModelRunner(load_weights(resolved, vspec, device), device)
        rows = []
        for name, ids in prompts:
            fp32.truncate(0)
            q.truncate(0)
            ref = fp32.forward(ids, logits_to_keep=len(ids))
            got = q.forward(ids, logits_to_keep=len(ids))
            q.truncate(0)
            text = greedy(q, ids, args.new_tokens)
            fp32.truncate(0)
            forced = fp32.forward(ids + text[:-1], logits_to_keep=len(text)).argmax(-1).tolist()
            agree = [a == b for a, b in zip(forced, text)]
            first = agree.index(False) if False in agree else len(agree)
            rows.append({"prompt": name, "max_abs_logit_diff": float((ref - got).abs().max()),
                         "max_abs_logit": float(ref.abs().max()), "tokens_before_first_difference": first,
                         "agreement": sum(agree) / len(agree)})
        report["variants"][label] = rows  # type: ignore[index]
        print(f"{label}:")
        for r in rows:
            print(f"  {r['prompt']:<22} max|dlogit| {r['max_abs_logit_diff']:.3f} (of {r['max_abs_logit']:.1f})  "
                  f"same until token {r['tokens_before_first_difference']:>3}  agreement {r['agreement']:.1%}")
    if "bf16_rounding" in report:
        print("bf16 rounding of block scales/zeros:", report["bf16_rounding"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
