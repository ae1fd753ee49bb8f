"""``specchat bench --server URL``: a server's plain and speculative replies side by side.

Every prompt of the set is sent twice per repeat, once as the server speculates
and once plain, in alternating order (after one warm-up round). The plain side is
the same server with ``speculative.n_max = 0`` per request where it obeys that
(some llama-server builds), else a second server named by ``--plain-server``
(the same model started without speculation). Rates are the server's own decode
rates where it reports them (llama-server ``timings``), else the rate seen here.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import SpecChatError
from engine.events import GenerationParams, SamplingParams
from engine.text_safety import inert

if TYPE_CHECKING:
    from app.bench.inputs import PromptSpec
    from engine.config.profiles import ModelProfile
    from engine.remote.backend import ServerBackend


def server_bench_profile(args: argparse.Namespace) -> "ModelProfile | None":
    """The server profile the bench options name (``--server`` or a server ``--profile``), else None."""
    from app.models_cli import resolve_profile

    if getattr(args, "plain_server", None) and not getattr(args, "server", None):
        profile = resolve_profile(args)
        if profile.backend != "server":
            raise SpecChatError("--plain-server needs --server URL (or a backend = \"server\" profile)")
        return profile
    if not getattr(args, "server", None) and getattr(args, "target", None):
        return None
    profile = resolve_profile(args)
    return profile if profile.backend == "server" else None


@dataclass(frozen=True)
class Run:
    """One measured reply."""

    prompt: str
    prompt_class: str
    side: str  # "spec" or "plain"
    repeat: int
    tokens: int
    rate: float | None
    rate_source: str
    proposed: int
    accepted: int
    alpha: float | None
    tau: float | None
    text: str

    def seconds(self) -> float | None:
        return self.tokens / self.rate if self.rate else None


@dataclass
class Sides:
    spec: "ServerBackend"
    plain: "ServerBackend | None"
    plain_speculates: bool  # False: the same server asked not to; True: a second server without speculation
    description: str
    notes: list[str]
    stopped: str | None = None
    """Why the run ended before its last reply (a server error that retries did not clear)."""


TRIES = 3
"""Tries of one reply that failed in a way that passes (429, 503, a refused or cut connection)."""
RETRY_WAIT_S = 2.0
"""The wait before the first retry where the server named none (doubled each time)."""
RETRY_WAIT_MAX_S = 60.0
"""The longest wait for a retry, whatever the server's ``Retry-After``."""


def _passing(exc: Exception) -> bool:
    """Whether a failed reply is worth trying again: the server was busy, loading, or restarting."""
    from engine.remote.server_errors import ServerError

    return isinstance(exc, ServerError) and (exc.status in (429, 503) or exc.kind in ("refused", "cut"))


def _connect(profile: "ModelProfile", args: argparse.Namespace) -> Sides:
    from engine.remote.backend import LLAMA_CPP, ServerBackend
    from engine.config.server import ServerSpec

    assert profile.server is not None
    spec = ServerBackend.connect(profile.server, profile.name)
    notes: list[str] = []
    if args.plain_server:
        plain_spec = ServerSpec(args.plain_server, model=profile.server.model, api_key_env=profile.server.api_key_env,
                                timeout=profile.server.timeout)
        plain = ServerBackend.connect(plain_spec, "plain")
        return Sides(spec, plain, True, f"a second server at {plain_spec.root}", notes)
    if spec.kind == LLAMA_CPP:
        return Sides(spec, spec, False, "the same server, speculative.n_max = 0 per request", notes)
    notes.append(f"{spec.kind} has no per-request switch for speculation: no plain side. Start the same model "
                 "without speculation and pass --plain-server URL")
    return Sides(spec, None, True, "none", notes)


def _measure(backend: "ServerBackend", spec: "PromptSpec", params: GenerationParams, side: str, repeat: int,
             speculate: bool) -> Run:
    text, s = backend.measure(spec.messages, params, speculate=speculate)
    source = "server" if s.tokens_per_s is not None and s.tokens_per_s != s.client_tokens_per_s else "client"
    return Run(spec.name, spec.prompt_class, side, repeat, s.tokens, s.tokens_per_s, source,
               s.proposed, s.accepted, s.alpha, s.tau, text)


def _measure_again(sides: Sides, backend: "ServerBackend", spec: "PromptSpec", params: GenerationParams,
                   side: str, repeat: int) -> Run | None:
    """:func:`_measure`, tried up to :data:`TRIES` times while the server is busy (429, waiting its
    ``Retry-After``), loading (503) or restarting; None (``sides.stopped`` says why) when that did
    not clear. One 429 threw away a whole run, its JSON unwritten (a review's)."""
    for attempt in range(TRIES):
        try:
            return _measure(backend, spec, params, side, repeat, side == "spec" or sides.plain_speculates)
        except SpecChatError as exc:
            if not _passing(exc) or attempt == TRIES - 1:
                sides.stopped = f"{spec.name} ({side}, repeat {repeat}): {exc}"
                return None
            asked = getattr(exc, "retry_after_s", None)
            wait = min(asked if asked is not None else RETRY_WAIT_S * 2 ** attempt, RETRY_WAIT_MAX_S)
            sides.notes.append(f"{spec.name} ({side}, repeat {repeat}) tried again after {wait:.0f} s: {exc}")
            time.sleep(wait)
    return None


def run_server_bench(sides: Sides, specs: Sequence["PromptSpec"], params: GenerationParams, repeats: int,
                     progress: Any = None) -> list[Run]:
    """Warm-up (repeat -1, not summarised), then ``repeats`` rounds, spec and plain alternating first."""
    runs: list[Run] = []
    total = (repeats + 1) * len(specs) * (2 if sides.plain else 1)
    for repeat in range(-1, repeats):
        for spec in specs:
            order = ["spec", "plain"] if repeat % 2 == 0 else ["plain", "spec"]
            for side in order:
                if side == "plain" and sides.plain is None:
                    continue
                backend = sides.spec if side == "spec" else sides.plain
                assert backend is not None
                run = _measure_again(sides, backend, spec, params, side, repeat)
                if run is None:  # a failure retries did not clear: the repeats measured whole are reported
                    return [r for r in runs if 0 <= r.repeat < repeat]  # a half repeat compares unlike sets
                if side == "plain" and run.proposed > 0:
                    sides.notes.append(f"the plain side drafted {run.proposed} tokens ({sides.description}): the "
                                       "server ignores speculative.n_max = 0; no plain side. Pass --plain-server URL")
                    sides.plain = None
                    runs = [r for r in runs if r.side != "plain"]
                    continue
                runs.append(run)
                if progress:
                    progress(len(runs), total, f"{spec.name} {side}")
    return [r for r in runs if r.repeat >= 0]


def _rate(runs: Sequence[Run]) -> float | None:
    """Tokens over the time they took, summed over ``runs`` (None if any run has no rate)."""
    secs = [r.seconds() for r in runs]
    if not runs or any(s is None for s in secs):
        return None
    return sum(r.tokens for r in runs) / sum(s for s in secs if s is not None)


def summarise(runs: Sequence[Run], repeats: int) -> list[dict[str, Any]]:
    """Per class and over all: median rates and speedup over repeats, α and τ over every spec run."""
    classes = sorted({r.prompt_class for r in runs}) + ["all"]
    out = []
    for cls in classes:
        mine = [r for r in runs if cls == "all" or r.prompt_class == cls]
        spec_rates, plain_rates, speedups = [], [], []
        for rep in range(repeats):
            s = _rate([r for r in mine if r.side == "spec" and r.repeat == rep])
            p = _rate([r for r in mine if r.side == "plain" and r.repeat == rep])
            spec_rates += [s] if s else []
            plain_rates += [p] if p else []
            if s and p:
                speedups.append(s / p)
        spec_runs = [r for r in mine if r.side == "spec"]
        proposed, accepted = sum(r.proposed for r in spec_runs), sum(r.accepted for r in spec_runs)
        tokens = sum(r.tokens for r in spec_runs)
        first = {(r.prompt, r.side): r.text for r in mine if r.repeat == 0}
        prompts = sorted({r.prompt for r in mine})
        compared = [p for p in prompts if (p, "plain") in first]
        differ = [p for p in compared if first[(p, "spec")] != first[(p, "plain")]]
        out.append({
            "prompt_class": cls,
            "spec_tokens_per_s": statistics.median(spec_rates) if spec_rates else None,
            "plain_tokens_per_s": statistics.median(plain_rates) if plain_rates else None,
            "speedup": statistics.median(speedups) if speedups else None,
            "speedup_min": min(speedups) if speedups else None,
            "speedup_max": max(speedups) if speedups else None,
            "alpha": accepted / proposed if proposed else None,
            "tau": tokens / (tokens - accepted) if proposed and tokens > accepted else None,
            "proposed": proposed, "accepted": accepted,
            "compared_prompts": len(compared), "differing_prompts": differ,
        })
    return out


def _f(value: float | None, spec: str, width: int) -> str:
    return ("-" if value is None else format(value, spec)).rjust(width)


def format_table(results: Sequence[dict[str, Any]]) -> str:
    head = f"{'class':<14}{'spec tok/s':>11}{'plain tok/s':>12}{'speedup':>9}{'min-max':>13}{'α':>6}{'τ':>6}  same text"
    lines = [head, "-" * len(head)]
    for r in results:
        spread = (f"{r['speedup_min']:.2f}-{r['speedup_max']:.2f}" if r["speedup"] is not None else "-")
        same = ("-" if not r["compared_prompts"] else
                "yes" if not r["differing_prompts"] else f"NO ({len(r['differing_prompts'])}/{r['compared_prompts']})")
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        lines.append(f"{r['prompt_class']:<14}{_f(r['spec_tokens_per_s'], '.1f', 11)}"
                     f"{_f(r['plain_tokens_per_s'], '.1f', 12)}{speedup:>9}{spread:>13}"
                     f"{_f(r['alpha'], '.2f', 6)}{_f(r['tau'], '.2f', 6)}  {same}")
    return "\n".join(lines)


def cmd_bench_server(args: argparse.Namespace, profile: "ModelProfile") -> int:
    """Run the server bench, print the table, write the JSON."""
    from app.bench.inputs import ProgressBar, load_prompt_set, select_prompts, write_report

    if args.repeats < 1 or args.max_new_tokens < 1:
        raise SpecChatError("--repeats and --max-new-tokens must be at least 1")
    specs = select_prompts(load_prompt_set(args.prompts), args.classes, args.per_class)
    params = GenerationParams(sampling=SamplingParams(temperature=0.0), max_new_tokens=args.max_new_tokens)
    sides = _connect(profile, args)
    ignored = [opt for opt in ("methods", "k_range", "lookup_tokens", "threads", "llama_cpp", "chart")
               if getattr(args, opt, None) not in (None, "1-6")]
    if ignored:
        sides.notes.append(f"ignored with a server: --{', --'.join(o.replace('_', '-') for o in ignored)}")
    runs = run_server_bench(sides, specs, params, args.repeats, ProgressBar())
    measured = len({r.repeat for r in runs})  # all of them unless a server error stopped the run
    results = summarise(runs, measured)
    rate_sources = sorted({r.rate_source for r in runs})
    report = {
        "server": {"url": sides.spec.spec.root, "kind": sides.spec.kind, "build": sides.spec.build,
                   "model": sides.spec.model},
        "plain_side": sides.description if sides.plain is not None else "none",
        "rates_from": rate_sources,
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "repeats_measured": measured, "greedy": True,
        "results": results, "notes": sides.notes,
        "runs": [r.__dict__ for r in runs],
        "definitions": {
            "speedup": "median over repeats of (spec rate / plain rate in the same repeat and class); a rate "
                       "is tokens over time summed over the class's prompts",
            "alpha": "accepted / drafted tokens over the spec runs (the server's figures)",
            "tau": "tokens / (tokens - accepted): tokens per target pass",
            "same text": "greedy spec and plain replies of the first measured repeat compared as text",
        },
    }
    if sides.stopped is not None:
        report["stopped"] = sides.stopped
    written = write_report(report, args.json_out) if args.json_out else True
    for note in sides.notes:
        print(inert(f"specchat bench: {note}"), file=sys.stderr)
    if sides.stopped is not None:
        print(inert(f"specchat bench: error: stopped early, the figures below are from the {measured} whole "
                    f"repeat(s) before: {sides.stopped}"), file=sys.stderr)
    from engine.remote.reply_run import shown_model

    print(inert(f"{sides.spec.kind} server at {sides.spec.spec.root} ({shown_model(sides.spec.model)}); plain side: "
                f"{report['plain_side']}; {args.max_new_tokens} new tokens, {args.repeats} repeat(s), greedy; "
                f"rates from the {' and '.join(rate_sources)}"))  # the model's name is the server's: one line, cut
    print(format_table(results))
    return 0 if written and sides.stopped is None else 1
