"""A :class:`~engine.api.ChatBackend` whose decoding happens on an
OpenAI-compatible server (llama.cpp's llama-server, vLLM, ...).

The server drafts and verifies; specchat streams the text (every piece is the
target's: a server does not say which tokens were drafted) and shows what the
server measured (:mod:`engine.remote.figures`).

The speedup needs a plain reply from the same server. llama-server reads
``speculative.n_max`` per request in some builds: after a speculative reply,
specchat sends the same conversation once more with ``speculative.n_max = 0``
(at most :data:`CALIBRATION_TOKENS` tokens; again every
:data:`CALIBRATE_EVERY` replies) and divides the two decode rates the server
reports. If that calibration reply still drafted, the build ignores the option
and the speedup stays unknown, as it does on servers without such a switch
(vLLM fixes speculation when it starts).
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import closing
from typing import Any

from engine.api import EngineInfo
from engine.progress import ProgressFn, no_progress
from engine.errors import EngineError
from engine.events import ChatEvent, ChatMessage, FinishReason, GenerationParams, TextPiece
from engine.remote.client import ServerClient
from engine.remote.reply_run import ReplyRun, read_reply, shown_model
from engine.remote.server_errors import ServerError
from engine.config.server import DEFAULT_TIMEOUT_S, ServerSpec
from engine.remote.figures import (
    Figures, ServerStats, SpecCounters, parse_spec_counters, reply_figures,
)
from engine.text_safety import inert

CHAT_PATH = "/v1/chat/completions"
SPEC_OFF: dict[str, int] = {"speculative.n_max": 0, "speculative.n_min": 0}
"""llama-server's per-request options that turn drafting off (where the build reads them)."""
CALIBRATE_EVERY = 8
CALIBRATION_TOKENS = 64
PROBE_TIMEOUT_S = 10.0
METRICS_SETTLE_S = 0.2
LLAMA_CPP, VLLM = "llama.cpp", "vLLM"
CALIBRATING = "measuring: one short reply from the same server with speculation off"


class ServerBackend:
    """Chat turns answered by a server; one reply at a time (``cancel`` may be set from any thread)."""

    def __init__(self, spec: ServerSpec, *, profile: str, client: ServerClient | None = None) -> None:
        self.spec = spec
        self.client = client or ServerClient(spec)
        self.profile_name = profile
        self.kind = "OpenAI-compatible"
        self.build: str | None = None
        self.model: str | None = spec.model
        self.metrics_known = False
        self.speculation_on = True
        self.switch_honoured: bool | None = None
        """Whether the server obeyed ``speculative.n_max = 0``; None until seen."""
        self.plain_tokens_per_s: float | None = None
        self._plain_age = 0
        self._calibration_note = "not measured yet"
        self._closed = False

    @classmethod
    def connect(cls, spec: ServerSpec, profile: str, progress: ProgressFn = no_progress) -> "ServerBackend":
        """Check the server answers (models list), learn what it is, and return a backend."""
        backend = cls(spec, profile=profile)
        backend.probe(progress)
        return backend

    def probe(self, progress: ProgressFn = no_progress) -> None:
        """``GET /v1/models`` (errors propagate: refused, 401, 404), then ``/props`` and ``/metrics`` (optional)."""
        progress(f"connecting to {self.spec.root}", None)
        listing = self.client.get_json("/v1/models", self.probe_timeout)
        data = listing.get("data") if isinstance(listing, dict) else None
        models = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        ids = [str(m.get("id")) for m in models if m.get("id")]
        owners = {str(m.get("owned_by", "")).lower() for m in models}
        if "vllm" in owners:
            self.kind = VLLM
        elif "llamacpp" in owners:
            self.kind = LLAMA_CPP
        progress("asking the server what it is", None)
        try:
            props = self.client.get_json("/props", self.probe_timeout)
            if isinstance(props, dict) and ("build_info" in props or "default_generation_settings" in props):
                self.kind = LLAMA_CPP
                self.build = str(props.get("build_info") or "") or None
        except ServerError:
            pass
        self.metrics_known = self._scrape() is not None
        if self.model is None:
            if not ids:
                raise EngineError(f"{self.spec.root} lists no models at /v1/models: name one with --server-model NAME, "
                                  "or model = \"...\" in the profile")
            self.model = ids[0]
        elif self.kind == VLLM and ids and self.model not in ids:
            served = ", ".join(shown_model(i) for i in ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
            raise EngineError(inert(f"{self.spec.root} does not serve model {shown_model(self.model)!r}; "
                                    f"it serves {served}"))
        progress("connected", 1.0)

    @property
    def probe_timeout(self) -> float:
        """Seconds the start-up requests wait: the profile's ``timeout`` where it sets one (a busy
        server), else :data:`PROBE_TIMEOUT_S` (a dead one is said soon)."""
        return self.spec.timeout if self.spec.timeout != DEFAULT_TIMEOUT_S else PROBE_TIMEOUT_S

    @property
    def info(self) -> EngineInfo:
        """What the HUD and ``generate --json`` show; the server's own words (model name,
        build) made :func:`~engine.text_safety.inert`, as they reach a terminal."""
        figures = "reply timings" if self.kind == LLAMA_CPP else None
        if self.metrics_known:
            figures = f"{figures} + /metrics" if figures else "/metrics"
        model = shown_model(self.model) if self.model else None
        plan: dict[str, Any] = {"summary": inert(f"served by {self.kind} at {self.spec.root}"), "model": model}
        if self.build:
            plan["build"] = inert(self.build)
        plan["figures"] = figures or "none reported"
        return EngineInfo(
            profile=self.profile_name, target=model or "?", drafter="the server's",
            mode="spec" if self.speculation_on else "plain", device=f"{self.kind} server", plan=plan,
        )

    def learn(self, texts: Sequence[str]) -> None:
        """Nothing: the server drafts as it was started to."""

    def set_speculation(self, enabled: bool) -> None:
        """Ask for plain decoding (``speculative.n_max = 0`` on each request) or speculation again."""
        if not enabled and self.kind != LLAMA_CPP:
            raise EngineError(f"{self.kind} fixes speculation when it starts; there is no per-request switch. "
                              "Start a second server without speculation to compare")
        if not enabled and self.switch_honoured is False:
            raise EngineError("this llama-server ignores per-request speculative options; start one without "
                              "-md/--spec-type for plain decoding")
        self.speculation_on = enabled

    def close(self) -> None:
        """Nothing stays open between replies; later chats are refused."""
        self._closed = True

    # -- replies ------------------------------------------------------------------------

    def chat(self, messages: Sequence[ChatMessage], params: GenerationParams,
             cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        """Stream the server's reply; text events as chunks arrive, the figures on the last event."""
        if self._closed:
            raise EngineError("the connection to the server was closed; load the profile again")
        return self._reply(list(messages), params, cancel or threading.Event())

    def request_body(self, messages: Sequence[ChatMessage], params: GenerationParams, spec_on: bool) -> dict[str, Any]:
        """The ``/v1/chat/completions`` request for ``messages``."""
        s = params.sampling
        body: dict[str, Any] = {
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": params.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
        }
        if self.model:
            body["model"] = self.model
        if s.top_k:
            body["top_k"] = s.top_k
        if s.seed is not None:
            body["seed"] = s.seed
        if params.stop_strings:
            body["stop"] = list(params.stop_strings)
        if not spec_on:
            body.update(SPEC_OFF)
        return body

    def stream_text(self, body: dict[str, Any], cancel: threading.Event, run: ReplyRun) -> Iterator[str]:
        """Each piece of reply text as it arrives; ``run`` collects timings, usage and finish.

        A server that ignores ``body["max_tokens"]`` is cut there: each text chunk holds
        at least one token, so a chunk past that many (or a stream of twice as many
        events) means the server would go on. The stream is closed, the reply ends
        with finish ``length`` and ``run.over_budget`` set."""
        budget = body.get("max_tokens")
        run.budget = budget if isinstance(budget, int) else None
        with closing(self.client.stream(CHAT_PATH, body, cancel)) as payloads:
            yield from read_reply(payloads, budget if isinstance(budget, int) else None, cancel, run)

    def measure(self, messages: Sequence[ChatMessage], params: GenerationParams, *, speculate: bool,
                cancel: threading.Event | None = None) -> tuple[str, ServerStats]:
        """One reply with no calibration and no speedup: its text and the server's figures (the bench)."""
        cancel = cancel or threading.Event()
        before = self._counters_before(cancel)
        run = ReplyRun()
        for _ in self.stream_text(self.request_body(messages, params, speculate), cancel, run):
            pass
        figures = reply_figures(run.timings, self._delta(before, run, cancel), run.tokens,
                                metrics_known=self.metrics_known, server=self.kind)
        return "".join(run.text), self._stats(run, speculate, figures)

    def _reply(self, messages: list[ChatMessage], params: GenerationParams,
               cancel: threading.Event) -> Iterator[ChatEvent]:
        spec_on = self.speculation_on
        before = self._counters_before(cancel)  # Esc while it waits: the request below is never sent
        run = ReplyRun()
        for text in self.stream_text(self.request_body(messages, params, spec_on), cancel, run):
            yield ChatEvent(text, (TextPiece(text, "target"),), (), self._stats(run, spec_on, Figures(
                reason="the server reports α and τ when the reply ends")))
        if cancel.is_set():
            stopped = Figures(reason="the reply was stopped before the server reported its figures")
            yield ChatEvent("", (), (), self._stats(run, spec_on, stopped, speedup_reason="reply stopped"),
                            "cancelled")
            return
        figures = reply_figures(run.timings, self._delta(before, run, cancel), run.tokens,
                                metrics_known=self.metrics_known, server=self.kind)
        notice = None
        if not run.text and run.reasoning_chars:
            notice = (f"the server's model spent the reply reasoning ({run.reasoning_chars:,} characters of "
                      "reasoning_content, which specchat does not show) and wrote no answer: raise the token limit "
                      "(max_new_tokens in the profile, or --max-new-tokens)")
        elif not run.text:  # it read as a whole, empty reply: "0 tokens", nothing said
            notice = (f"the server sent {'no answer' if not run.events else f'{run.events} event(s)'} but no reply "
                      f"text{f' (finish_reason {str(run.finish)[:40]!r})' if run.finish else ''}: check the server's log and "
                      "its model")
        elif run.over_budget:
            notice = (f"the server went on past the {params.max_new_tokens}-token limit it was sent "
                      "(max_tokens); specchat stopped reading there")
        if not spec_on and figures.proposed > 0:
            self.switch_honoured, self.speculation_on = False, True
            notice = ("the server ignored speculative.n_max = 0 and drafted anyway (this llama-server build "
                      "reads no per-request speculative options): speculation is back on")
        if self._calibration_due(run, figures, spec_on):  # the text is complete: say what the wait is for
            yield ChatEvent("", (), (), self._stats(run, spec_on, figures, speedup_reason=CALIBRATING))
        plain, speedup, why = self._speedup(messages, params, run, figures, spec_on, cancel)
        stats = dataclasses.replace(self._stats(run, spec_on, figures, speedup_reason=why),
                                    plain_tokens_per_s=plain, speedup=speedup)
        yield ChatEvent("", (), (), stats, _finish(run.finish, params), notice)

    def _stats(self, run: ReplyRun, spec_on: bool, figures: Figures, speedup_reason: str | None = None) -> ServerStats:
        end = run.t_last or time.perf_counter()
        client_rate = run.client_rate()
        tokens = run.tokens
        return ServerStats(
            mode="spec" if spec_on else "plain", drafter="server", tokens=tokens,
            proposed=figures.proposed, accepted=figures.accepted, alpha=figures.alpha, tau=figures.tau,
            per_position=figures.per_position, target_passes=tokens - figures.accepted if tokens else 0,
            prefill_s=(run.t_first - run.t0) if run.t_first else 0.0, elapsed_s=end - run.t0,
            tokens_per_s=run.server_rate() or client_rate,
            itl_ms=1000.0 / client_rate if client_rate else None,
            server=self.kind, figures_from=figures.source, figures_reason=figures.reason,
            speedup_reason=speedup_reason, client_tokens_per_s=client_rate,
            mean_accepted_len=figures.mean_accepted_len,
            prompt_tokens=(run.usage or {}).get("prompt_tokens"),
        )

    # -- figures --------------------------------------------------------------------------

    def _scrape(self, cancel: threading.Event | None = None) -> SpecCounters | None:
        """The server's speculation counters now; None where it has none, or Esc came first."""
        try:
            text, _ = self.client.get("/metrics", PROBE_TIMEOUT_S, cancel)
        except EngineError:
            return None
        return parse_spec_counters(text)

    def _counters_before(self, cancel: threading.Event) -> SpecCounters | None:
        """The counters before a reply, read only where the probe found them: a server without
        them (a ``/metrics`` that never answers) held every reply for the read's timeout."""
        return self._scrape(cancel) if self.metrics_known else None

    def _delta(self, before: SpecCounters | None, run: ReplyRun,
               cancel: threading.Event | None = None) -> SpecCounters | None:
        if before is None:  # none where the probe found no counters (_counters_before)
            return None
        after = self._scrape(cancel)
        if after is not None and after.minus(before).draft_tokens <= 0 and run.tokens > 1:
            time.sleep(METRICS_SETTLE_S)  # some servers count a step just after sending it
            after = self._scrape(cancel) or after
        return after.minus(before) if after is not None else None

    def _speedup(self, messages: list[ChatMessage], params: GenerationParams, run: ReplyRun, figures: Figures,
                 spec_on: bool, cancel: threading.Event) -> tuple[float | None, float | None, str]:
        """(plain tokens/s, speedup, how it was measured or why it is unknown)."""
        rate = run.rate()
        if not spec_on:
            if figures.proposed == 0 and rate:
                self.plain_tokens_per_s, self._plain_age = rate, 0
            return None, None, "this reply was plain decoding (speculation off)"
        if self.kind != LLAMA_CPP:
            return None, None, (f"speedup unknown: {self.kind} has no per-request switch to turn speculation off, "
                                "so there is no plain reply on the same server to compare with")
        if rate is None:
            return None, None, "speedup unknown: the reply was too short to time"
        if figures.proposed == 0:
            return None, None, "speedup unknown: the server drafted nothing in this reply, so there is nothing to compare"
        if self._calibration_due(run, figures, spec_on):
            self._calibrate(messages, params, run.tokens, cancel)
        if self.switch_honoured is False:
            return None, None, ("speedup unknown: this llama-server ignores per-request speculative options "
                                "(speculative.n_max = 0 still drafted), so it cannot give a plain reply")
        if self.plain_tokens_per_s is None:
            return None, None, f"speedup unknown: {self._calibration_note}"
        self._plain_age += 1
        plain = self.plain_tokens_per_s
        if not math.isfinite(rate / plain):
            return None, None, "speedup unknown: the server's rates cannot be compared"
        return plain, rate / plain, (f"against a plain reply from the same server ({plain:.1f} tok/s, "
                                     "speculative.n_max = 0)")

    def _calibration_due(self, run: ReplyRun, figures: Figures, spec_on: bool) -> bool:
        """Whether this reply is followed by a plain calibration reply."""
        return (spec_on and self.kind == LLAMA_CPP and run.rate() is not None and figures.proposed > 0
                and self.switch_honoured is not False
                and (self.plain_tokens_per_s is None or self._plain_age >= CALIBRATE_EVERY))

    def _calibrate(self, messages: list[ChatMessage], params: GenerationParams, tokens: int,
                   cancel: threading.Event) -> None:
        """One short plain reply to the same conversation (after a reply that drafted): the server's
        plain decode rate, or the finding that it ignores ``speculative.n_max = 0``."""
        short = dataclasses.replace(params, max_new_tokens=max(8, min(tokens, CALIBRATION_TOKENS)))
        run = ReplyRun()
        try:
            for _ in self.stream_text(self.request_body(messages, short, spec_on=False), cancel, run):
                pass
        except EngineError as exc:
            self._calibration_note = f"the plain calibration reply failed ({exc})"
            return
        if cancel.is_set():
            self._calibration_note = "the plain calibration reply was stopped"
            return
        if int((run.timings or {}).get("draft_n") or 0) > 0:
            self.switch_honoured = False
            return
        rate = run.rate()
        if rate is None:
            self._calibration_note = "the plain calibration reply was too short to time"
            return
        self.switch_honoured = True
        self.plain_tokens_per_s, self._plain_age = rate, 0


def _finish(reason: str | None, params: GenerationParams) -> FinishReason:
    """The server's ``finish_reason`` in specchat's terms."""
    if reason == "length":
        return "length"
    if reason in (None, "stop", "eos"):
        return "stop" if params.stop_strings and reason == "stop" else "eos"
    return "stop"
