"""Speculation figures from a server: Prometheus spec-decode counters, llama-server timings, α, τ and the reasons for none."""
from __future__ import annotations

import pytest

from engine.remote.figures import (
    Figures, SpecCounters, conditional_rates, no_figures_reason, parse_spec_counters, reply_figures, tau_of,
)

OFF = ("S drafted no tokens in this reply: speculation is off on the server (llama-server without "
       "-md/--spec-type, vLLM without --speculative-config), or no n-gram matched")
VLLM_DELTA = SpecCounters(drafts=5, draft_tokens=15, accepted=9, per_position={0: 4, 1: 3, 2: 2})


def test_prometheus_parsing_handles_llama_cpp_names_and_sums_engines() -> None:
    text = ("llamacpp:spec_decode_num_draft_tokens_total 12\nllamacpp:spec_decode_num_accepted_tokens_total 6\n"
            "llamacpp:spec_decode_num_drafts_total 4\n"
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3\n'
            'vllm:spec_decode_num_draft_tokens{engine="1"} 8\nnot a sample line\n')
    c = parse_spec_counters(text)
    assert c is not None and (c.drafts, c.draft_tokens, c.accepted, c.per_position) == (4, 20, 6, {0: 3})
    assert parse_spec_counters("vllm:num_requests_running 0\n") is None
    assert conditional_rates({0: 8.0, 1: 4.0, 2: 0.0, 3: 0.0}, 10.0) == pytest.approx((0.8, 0.5, 0.0))


def test_counters_with_and_without_total_and_per_position_sums() -> None:
    text = ("# HELP x\n"
            "spec_decode_num_drafts 3\n"
            'vllm:spec_decode_num_drafts_total{engine="1"} 2\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 2\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="1"} 5\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1"} 100\n'  # no position: skipped
            "vllm:spec_decode_num_accepted_tokens 1e2\n")
    assert parse_spec_counters(text) == SpecCounters(drafts=5, draft_tokens=0, accepted=100, per_position={1: 7})
    for bad in ("vllm:spec_decode_num_accepted_tokens NaN\n", 'vllm:spec_decode_num_drafts_total{engine="2"} +Inf\n',
                'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} -3\n'):
        assert parse_spec_counters(text + bad) is None  # not a count: this scrape tells nothing
    assert parse_spec_counters("") is None


def test_a_reply_is_the_difference_of_two_scrapes() -> None:
    after = SpecCounters(10, 30, 20, {0: 5, 1: 3})
    assert after.minus(SpecCounters(4, 10, 5, {0: 1})) == SpecCounters(6, 20, 15, {0: 4, 1: 3})


@pytest.mark.parametrize("tokens, accepted, tau", [(12, 8, 3.0), (5, 0, 1.0), (0, 0, None), (4, 4, None)])
def test_tau_is_tokens_per_target_pass(tokens: int, accepted: int, tau: float | None) -> None:
    assert tau_of(tokens, accepted) == tau


def test_conditional_rates_stop_where_no_draft_reached_and_stay_in_0_1() -> None:
    assert conditional_rates({}, 5.0) == ()
    assert conditional_rates({0: 1.0}, 0.0) == ()
    assert conditional_rates({0: 12.0}, 10.0) == (1.0,)  # clamped
    assert conditional_rates({1: 2.0, 0: 4.0}, 8.0) == (0.5, 0.5)  # in position order


def test_figures_from_timings_alone() -> None:
    figures = reply_figures({"draft_n": 10, "draft_n_accepted": 8}, None, 12, metrics_known=False, server="S")
    assert figures == Figures(proposed=10, accepted=8, alpha=0.8, tau=3.0, source="timings")


def test_figures_from_counters_alone() -> None:
    figures = reply_figures(None, VLLM_DELTA, 20, metrics_known=True, server="S")
    assert (figures.proposed, figures.accepted, figures.alpha, figures.source) == (15, 9, 0.6, "metrics")
    assert figures.tau == pytest.approx(20 / 11) and figures.mean_accepted_len == pytest.approx(2.8)
    assert figures.per_position == pytest.approx((0.8, 0.75, 2 / 3)) and figures.reason is None


def test_timings_give_the_counts_and_counters_the_positions_when_both_are_there() -> None:
    figures = reply_figures({"draft_n": 10, "draft_n_accepted": 8}, VLLM_DELTA, 12, metrics_known=True, server="S")
    assert (figures.proposed, figures.accepted, figures.tau, figures.source) == (10, 8, 3.0, "timings+metrics")
    assert figures.per_position == pytest.approx((0.8, 0.75, 2 / 3)) and figures.mean_accepted_len == pytest.approx(2.8)


@pytest.mark.parametrize("timings, delta, known, reason", [
    ({"draft_n": 0}, None, False, OFF),
    ({"predicted_n": 4}, None, False, OFF),
    (None, SpecCounters(), True, OFF),
    (None, None, True, "S: the reply ended before its spec-decode counters could be read"),
    (None, None, False, "S reports no speculative figures: no `timings.draft_n` in its replies and no "
                        "spec_decode counters at /metrics"),
])
def test_no_drafts_give_a_reason_never_zeros(timings: dict[str, int] | None, delta: SpecCounters | None,
                                             known: bool, reason: str) -> None:
    figures = reply_figures(timings, delta, 20, metrics_known=known, server="S")
    assert figures == Figures(reason=reason) and figures.alpha is None and figures.tau is None
    assert no_figures_reason(timings, delta, known, "S") == reason


@pytest.mark.parametrize("delta", [
    SpecCounters(drafts=1, draft_tokens=1, accepted=1000),  # a counter that rose 1000 accepted for 1 drafted
    SpecCounters(drafts=5, draft_tokens=15, accepted=-3),  # a counter that went back
    SpecCounters(drafts=5, draft_tokens=40, accepted=30),  # more accepted than the reply's 20 tokens
])
def test_counters_no_reply_could_give_are_no_figures(delta: SpecCounters) -> None:
    """/metrics deltas showed 'accepted 1000.00' (the timings' own check did not reach them)."""
    figures = reply_figures(None, delta, 20, metrics_known=True, server="S")
    assert figures.proposed == 0 and figures.alpha is None and figures.reason == OFF


def test_clean_usage_and_timings_keep_only_what_a_server_could_measure() -> None:
    from engine.remote.figures import clean_timings, clean_usage

    assert clean_usage({"completion_tokens": 10**400, "prompt_tokens": 20, "total_tokens": -1, "x": 3}) == {
        "prompt_tokens": 20}
    assert clean_timings({"predicted_per_second": 1e308, "prompt_per_second": 4000.0, "predicted_n": 10**18,
                          "predicted_ms": 1e300, "prompt_ms": 5.0}) == {"prompt_per_second": 4000.0, "prompt_ms": 5.0}
