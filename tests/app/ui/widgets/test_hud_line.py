"""The HUD folded to one line: loading and errors take its place; the live figures when a reply streams."""
from __future__ import annotations

from dataclasses import dataclass

from app.ui.widgets.hud_line import status_line
from engine.api import EngineInfo
from engine.events import ReplyStats


@dataclass
class State:
    """A HUD's state, as status_line reads it."""

    profile_name: str | None = "pocket"
    error: str | None = None
    loading_stage: str | None = None
    loading_fraction: float | None = None
    info: EngineInfo | None = None
    stats: ReplyStats | None = None
    live: bool = False


INFO = EngineInfo("pocket", "SmolLM2", "n-gram lookup", "ngram", "cpu")


def test_an_error_and_loading_take_the_line() -> None:
    assert str(status_line(State(error="model not found"))) == "pocket · ✗ model not found  F6: full HUD"
    assert str(status_line(State(loading_stage="converting", loading_fraction=0.25))) == \
        "pocket · loading: 25% · converting  F6: full HUD"
    assert str(status_line(State(profile_name=None))) == "— · not loaded  F6: full HUD"


def test_a_streaming_reply_shows_its_live_figures() -> None:
    stats = ReplyStats(mode="ngram", tokens=40, proposed=30, accepted=15, alpha=0.5, tau=2.0, tokens_per_s=120.0, speedup=1.4,  # type: ignore[call-arg]
                  target_passes=20)
    line = str(status_line(State(info=INFO, stats=stats, live=True), toggle_key="F9"))
    assert line.startswith("pocket · lookup · accepted 50% · τ 2.00 · 120.0 tok/s")
    assert "1.40×" in line and line.endswith("  live  F9: full HUD")


def test_plain_decoding_shows_no_acceptance_and_a_fresh_reply_measures() -> None:
    plain = ReplyStats(mode="plain", tokens=5, tokens_per_s=90.0)  # type: ignore[call-arg]
    assert "accepted" not in str(status_line(State(info=INFO, stats=plain, live=True)))
    early = ReplyStats(mode="ngram", tokens=5, tokens_per_s=90.0, speedup=None)  # type: ignore[call-arg]
    assert "· speedup measuring…" in str(status_line(State(info=INFO, stats=early, live=True)))
    short = ReplyStats(mode="ngram", tokens=5, proposed=3, tokens_per_s=90.0, speedup_note="too short to measure")  # type: ignore[call-arg]
    assert str(status_line(State(info=INFO, stats=short))).endswith("90.0 tok/s · speedup too short to measure  F6: full HUD")


def test_an_error_outranks_loading_and_an_unknown_fraction_shows_no_percent() -> None:
    assert str(status_line(State(error="out of memory", loading_stage="x"))) == "pocket · ✗ out of memory  F6: full HUD"
    assert str(status_line(State(loading_stage="starting"))) == "pocket · loading: starting  F6: full HUD"


def test_before_any_reply_the_engines_mode_alone() -> None:
    assert str(status_line(State(info=INFO))) == "pocket · lookup  F6: full HUD"
    spec = EngineInfo("fast", "T", "model", "spec", "cpu")
    assert str(status_line(State(info=spec))) == "pocket · spec  F6: full HUD"


def test_a_finished_reply_keeps_its_figures_and_the_engines_mode() -> None:
    stats = ReplyStats(mode="plain", proposed=8, accepted=4, alpha=0.5, tau=2.0, tokens=12,  # type: ignore[call-arg]
                  tokens_per_s=41.3, speedup=2.06)
    assert str(status_line(State(info=INFO, stats=stats))) == \
        "pocket · lookup · accepted 50% · τ 2.00 · 41.3 tok/s · 2.06×  F6: full HUD"
    assert str(status_line(State(info=INFO, stats=stats, live=True))).startswith("pocket · plain · accepted 50%")


def test_a_finished_server_reply_without_a_speedup_says_unknown() -> None:
    from engine.remote.figures import ServerStats

    stats = ServerStats(mode="spec", server="llama.cpp", tokens=4, tokens_per_s=50.0)
    spec = EngineInfo("remote", "smol", "server", "spec", "llama.cpp server")
    assert str(status_line(State(info=spec, stats=stats))) == \
        "pocket · spec · 50.0 tok/s · speedup unknown  F6: full HUD"
    assert str(status_line(State(info=spec, stats=stats, live=True))) == \
        "pocket · spec · 50.0 tok/s · speedup measuring…  live  F6: full HUD"


def test_a_narrow_line_cuts_the_models_name_not_the_figures() -> None:
    """At 80 columns the line's end is cut: the percentage, sizes, speed and time come first."""
    stage = "downloading SmolLM2-135M-Instruct.Q4_1: 12.3 of 93.0 MB, 9.8 MB/s, 8 s left"
    line = str(status_line(State(loading_stage=stage, loading_fraction=0.13)))
    assert line[:78].startswith("pocket · loading: 13% · 12.3 of 93.0 MB, 9.8 MB/s, 8 s left · downloading")
    converting = "converting SmolLM2-135M-Instruct.Q4_1 once, reading the tensors kept in full precision: 0:42"
    assert str(status_line(State(loading_stage=converting))).startswith("pocket · loading: 0:42 · converting")

