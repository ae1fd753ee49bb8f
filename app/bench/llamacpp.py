"""llama.cpp side by side in ``specchat bench``: ``llama.cpp-plain``, ``llama.cpp-spec``, ``llama.cpp-lookup``.

Each method is one ``llama-server`` (:class:`app.bench.llamacpp_tools.LlamaServer`) on the very GGUF file the
profile's target source reads, started once before the bench and stopped after it:

* ``llama.cpp-plain``: the GGUF alone;
* ``llama.cpp-spec``: ``-md DRAFT.gguf --spec-type draft-simple``, the profile's model draft's GGUF
  (only for a profile with a model draft);
* ``llama.cpp-lookup``: ``--spec-type ngram-simple``, llama.cpp's n-gram drafter (only for a profile
  that uses specchat's n-gram drafter).

Every reply is the same prompt token ids the other methods get, greedy (temperature 0, top_k 1), no
prompt cache, at most ``max_new_tokens`` new tokens, ``-t``/``-tb`` set to the bench's threads. The
reply is streamed so that its tokens are time-stamped by the bench's own clock as they arrive, the
same decode tok/s definition as every other method; llama-server's own figure
(``timings.predicted_per_second``) is kept beside it. α comes from ``timings.draft_n_accepted /
timings.draft_n``. llama.cpp's output is compared with specchat's plain output as information only
(other kernels, other rounding), never as a failure.
"""
from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.bench.run import BenchPrompt, ExternalRunner, Run, _Reply, first_difference
from app.bench.methods import LLAMA_METHODS, Method
from engine.errors import LlamaCppError
from app.bench.llamacpp_tools import (LlamaCpp, LlamaServer, completion_payload, find_llama_cpp, gguf_for, how_to_get,
                             request_json, run_llama_bench, stream_completion)

SPEC_ARGS = ("--spec-type", "draft-simple")
LOOKUP_ARGS = ("--spec-type", "ngram-simple")


@dataclass
class LlamaPlan:
    """What llama.cpp will run: the binaries, the GGUF files, one server command per method."""

    llama: LlamaCpp | None = None
    gguf: Path | None = None
    draft_gguf: Path | None = None
    threads: int = 1
    args: dict[str, list[str]] = field(default_factory=dict)  # method -> llama-server arguments
    notes: list[str] = field(default_factory=list)


def plan_llama(methods: Sequence[Method], profile: Any, threads: int, prompts: Sequence[BenchPrompt],
               max_new_tokens: int, explicit: str | Path | None = None) -> tuple[list[Method], LlamaPlan]:
    """The methods that can run (the llama.cpp ones dropped where they cannot, with a note each) and
    the servers to start. A ``--llama-cpp`` directory without llama-server is an error."""
    plan = LlamaPlan(threads=threads)
    wanted = [m for m in methods if m.name in LLAMA_METHODS]
    others = [m for m in methods if m.name not in LLAMA_METHODS]
    if not wanted:
        return others, plan
    plan.llama = find_llama_cpp(explicit)
    if plan.llama is None:
        plan.notes.append(f"llama.cpp rows skipped: {how_to_get()}")
        return others, plan
    plan.gguf = gguf_for(profile.target)
    if plan.gguf is None:
        plan.notes.append(f"llama.cpp rows skipped: the target source {profile.target.source} is not a GGUF file "
                          "(llama.cpp runs GGUF only)")
        return others, plan
    longest = max((len(p.ids) for p in prompts), default=0)
    common = ["-c", str(_round_up(longest + max_new_tokens + 16, 256)), "-np", "1", "--no-webui"]
    kept = []
    for method in wanted:
        extra = _method_args(method.name, profile, plan)
        if extra is not None:
            plan.args[method.name] = [*common, *extra]
            kept.append(method)
    return [*others, *kept], plan


def _method_args(name: str, profile: Any, plan: LlamaPlan) -> list[str] | None:
    if name == "llama.cpp-plain":
        return []
    if name == "llama.cpp-lookup":
        if profile.drafter != "ngram":
            plan.notes.append("llama.cpp-lookup skipped: the profile does not use the n-gram drafter")
            return None
        return list(LOOKUP_ARGS)
    if profile.drafter != "model" or profile.draft is None:
        plan.notes.append("llama.cpp-spec skipped: the profile has no model draft")
        return None
    plan.draft_gguf = gguf_for(profile.draft)
    if plan.draft_gguf is None:
        plan.notes.append(f"llama.cpp-spec skipped: the draft source {profile.draft.source} is not a GGUF file")
        return None
    return ["-md", str(plan.draft_gguf), *SPEC_ARGS, "-td", str(plan.threads), "-tbd", str(plan.threads)]


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def run_llama(url: str, ids: Sequence[int], max_new_tokens: int, on_emit: Callable[[int], None],
              pid: int | None = None, timeout_s: float = 600.0) -> _Reply:
    """One streamed greedy reply of the llama-server at ``url`` to the token ids ``ids`` (shape [T]).

    Emissions are counted from each chunk's ``tokens_predicted`` (llama-server holds back the chunk of
    a token that ends inside a UTF-8 character, so its ids can be missing from the stream); when the
    streamed ids fall short of the count, the ids are fetched again by one untimed non-streamed request.
    """
    _reset_peak(pid)
    tokens: list[int] = []
    text: list[str] = []
    last: dict[str, Any] = {}
    seen = 0
    for chunk in stream_completion(url, completion_payload(ids, max_new_tokens), timeout_s):
        tokens.extend(int(t) for t in chunk.get("tokens") or ())
        count = int(chunk.get("tokens_predicted") or 0)
        if count > seen:
            on_emit(count - seen)
            seen = count
        text.append(str(chunk.get("content", "")))
        last = chunk
    peak = _peak(pid)
    timings = last.get("timings") or {}
    if not last.get("stop") or not timings:
        raise LlamaCppError("llama-server's stream ended without its final message (stop and timings)")
    if int(timings.get("prompt_n", len(ids))) != len(ids):
        raise LlamaCppError(f"llama-server read {timings.get('prompt_n')} prompt tokens, not the {len(ids)} sent")
    source = "stream"
    if len(tokens) != seen:
        whole = request_json(url, "/completion", completion_payload(ids, max_new_tokens), timeout_s)
        tokens, source = [int(t) for t in whole.get("tokens") or ()], "non-streamed repeat (untimed)"
    proposed = _int_or_none(timings.get("draft_n"))
    accepted = _int_or_none(timings.get("draft_n_accepted"))
    extra = {
        "server_tokens_per_s": timings.get("predicted_per_second"),
        "server_prompt_tokens_per_s": timings.get("prompt_per_second"),
        "timings": timings, "stop_type": last.get("stop_type"), "text": "".join(text), "token_ids_from": source,
    }
    return _Reply(tokens=tokens, target_passes=max(len(tokens) - (accepted or 0), 0), proposed=proposed,
                  accepted=accepted, peak_memory=peak, extra=extra)


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None


def _reset_peak(pid: int | None) -> None:
    """Reset the server process's peak RSS (Linux ``clear_refs``), so each reply reports its own."""
    if pid is not None:
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/clear_refs").write_text("5")


def _peak(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@contextlib.contextmanager
def llama_servers(plan: LlamaPlan, max_new_tokens: int) -> Iterator[dict[str, ExternalRunner]]:
    """Start one llama-server per planned method (stopped on leaving); yields method -> runner."""
    runners: dict[str, ExternalRunner] = {}
    with contextlib.ExitStack() as stack:
        for name, args in plan.args.items():
            assert plan.llama is not None and plan.gguf is not None
            print(f"specchat bench: starting llama-server for {name}", file=sys.stderr)
            server = stack.enter_context(LlamaServer(plan.llama, plan.gguf, args, threads=plan.threads))
            runners[name] = _runner(server, max_new_tokens)
        yield runners


def _runner(server: LlamaServer, max_new_tokens: int) -> ExternalRunner:
    def run(ids: Sequence[int], on_emit: Callable[[int], None]) -> _Reply:
        pid = server.proc.pid if server.proc is not None else None
        return run_llama(server.url, ids, max_new_tokens, on_emit, pid, server.request_timeout_s)
    return run


def plan_report(plan: LlamaPlan, max_new_tokens: int, reference: bool = True) -> dict[str, Any]:
    """The JSON's ``llama_cpp`` section: binaries, files, each server's command, and (``reference``)
    one ``llama-bench -p 0 -n max_new_tokens -t threads`` figure on the same GGUF."""
    if plan.llama is None:
        return {"found": False, "notes": plan.notes}
    out: dict[str, Any] = {
        "found": True, "bin_dir": str(plan.llama.bin_dir), "found_via": plan.llama.where,
        "version": plan.llama.version(), "gguf": str(plan.gguf) if plan.gguf else None,
        "draft_gguf": str(plan.draft_gguf) if plan.draft_gguf else None, "threads": plan.threads,
        "server_args": plan.args, "notes": plan.notes,
        "tokens_per_s": "client wall clock on streamed tokens, as for every method; server_tokens_per_s: "
                        "llama-server's timings.predicted_per_second",
        "alpha": "timings.draft_n_accepted / timings.draft_n; target passes = new tokens - accepted",
        "agreement": "llama.cpp's token ids against specchat plain's on the same prompt (information only)",
    }
    if reference and plan.gguf is not None and plan.llama.bench is not None:
        try:
            started = time.perf_counter()
            out["llama_bench"] = run_llama_bench(plan.llama, plan.gguf, max_new_tokens, plan.threads)
            out["llama_bench"]["seconds"] = round(time.perf_counter() - started, 1)
        except LlamaCppError as exc:
            out["llama_bench"] = {"error": str(exc)}
    return out


def _strip(tokens: Sequence[int], stop_ids: Sequence[int]) -> tuple[int, ...]:
    out = tuple(tokens)
    while out and out[-1] in stop_ids:
        out = out[:-1]
    return out


def agreement(runs: Sequence[Run], refs: dict[str, tuple[int, ...]], stop_ids: Sequence[int] = ()) -> dict[str, Any]:
    """How far llama.cpp's outputs agree with specchat plain's (a trailing stop token ignored):
    runs identical, and the mean length of the common prefix as a share of plain's reply."""

    same, shares, compared = 0, [], 0
    for run in runs:
        ref = refs.get(run.prompt)
        if ref is None:
            continue
        a, b = _strip(ref, stop_ids), _strip(run.tokens, stop_ids)
        at = first_difference(a, b)
        compared += 1
        same += at is None
        shares.append(1.0 if at is None else at / max(len(a), 1))
    return {"runs_identical": same, "runs_compared": compared,
            "common_prefix_share": statistics.fmean(shares) if shares else None}


def llama_figures(runs: Sequence[Run], refs: dict[str, tuple[int, ...]], stop_ids: Sequence[int] = ()) -> dict[str, Any]:
    """What a llama.cpp row adds to (or changes in) a summary: server tok/s, agreement with plain,
    and no time split or identical-output verdict (its passes are not visible to the bench)."""
    server = [r.extra["server_tokens_per_s"] for r in runs if r.extra and r.extra.get("server_tokens_per_s")]
    return {
        "server_tokens_per_s": statistics.median(server) if server else None,
        "agreement": agreement(runs, refs, stop_ids),
        "identical": None, "mismatches": [],
        "alpha_source": "llama-server timings: draft_n_accepted / draft_n" if any(r.proposed for r in runs) else None,
        "time_split": {"draft": None, "verify": None, "other": None},
        "ms_per_token": {"draft": None, "verify": None, "other": None},
    }


def same_cell(result: dict[str, Any]) -> str:
    """The table's ``same`` cell: yes/NO for specchat and transformers, ``k/n*`` runs equal for llama.cpp."""
    agree = result.get("agreement")
    if agree is not None:
        return f"{agree['runs_identical']}/{agree['runs_compared']}*"
    return "yes" if result["identical"] else "NO"


TABLE_FOOTNOTE = ("* llama.cpp rows: runs whose output equals specchat plain's, information only (other kernels "
                  "and rounding; its int4 blocks are not ours)")
