"""The HUD's server panels: the server's own figures, and why one is missing ("—", "unknown"), never 0."""
from __future__ import annotations

from dataclasses import replace

from app.ui.widgets.hud_server import engine_content, is_server, server_content, stats_content
from engine.api import EngineInfo
from engine.config.profiles import profile_from_server
from engine.events import ReplyStats
from engine.remote.figures import ServerStats

PROFILE = profile_from_server("http://127.0.0.1:8080/v1", "smol")
INFO = EngineInfo(profile="remote", target="/models/smol.gguf", drafter="server", mode="spec",
                  device="llama.cpp server",
                  plan={"summary": "llama.cpp b1234", "model": "smol", "slots": 4, "ctx": None, "props": {"a": 1}})
MEASURED = ServerStats(mode="spec", server="llama.cpp", alpha=0.5, accepted=2, proposed=4, tau=2.0,
                       mean_accepted_len=2.5, figures_from="timings", tokens_per_s=50.0, client_tokens_per_s=45.0,
                       speedup=2.0, plain_tokens_per_s=25.0, tokens=4)
UNMEASURED = ServerStats(mode="spec", server="vllm", figures_reason="the server drafted no tokens", tokens_per_s=50.0,
                         client_tokens_per_s=50.0, tokens=4,
                         speedup_reason="speedup unknown: the server ignores speculative.n_max = 0")


def engine(info: EngineInfo | None, **kw: object) -> str:
    args: dict[str, object] = dict(name="remote", error=None, loading=False, notice=None)
    return engine_content(PROFILE, info, **{**args, **kw}).plain  # type: ignore[arg-type]


def test_a_server_profile_or_server_figures_make_the_server_panels() -> None:
    assert is_server(PROFILE) and is_server(None, MEASURED)
    assert not is_server(None) and not is_server(None, ReplyStats())


def test_connecting_and_failed_connections() -> None:
    assert engine(None, loading=True) == "profile  remote\nserver   http://127.0.0.1:8080\nmode     connecting…"
    assert engine(None, name=None, error="connection refused") == (
        "profile  —\nserver   http://127.0.0.1:8080\nerror    connection refused\nmode     not connected")


def test_a_connected_server_names_its_model_kind_and_mode() -> None:
    assert engine(INFO, notice="the server ignored speculative.n_max") == (
        "profile  remote\nserver   http://127.0.0.1:8080\nmodel    smol.gguf\nkind     llama.cpp server\n"
        "mode     speculative · on the server\ndrafter  chosen by the server\n"
        "why      the server ignored speculative.n_max")
    assert "mode     plain (asked with speculative.n_max = 0)\n" in engine(replace(INFO, mode="plain"))


def test_no_figures_yet_are_dashes() -> None:
    assert stats_content(None, live=False).plain == (
        "─ no new reply yet ────────────────────\nα        —\nτ        —\ntok/s    —\nspeedup  —")
    assert stats_content(ReplyStats(tokens=3), live=False).plain.startswith("─ last reply ──")  # a local reply's figures


def test_the_servers_measured_figures() -> None:
    assert stats_content(MEASURED, live=False).plain == (
        "─ last reply ────────────────────\nα        0.50  (2/4 drafted)\nτ        2.00  (per draft 2.50)\n"
        "from     the server's timings\ntok/s    50.0 server · 45.0 here\nspeedup  2.00× vs plain 25.0 tok/s\n"
        "tokens   4")


def test_missing_figures_say_why() -> None:
    assert stats_content(UNMEASURED, live=False).plain == (
        "─ last reply ────────────────────\nα        —\nτ        —\nwhy      the server drafted no tokens\n"
        "tok/s    50.0\nspeedup  unknown\nwhy      the server ignores speculative.n_max = 0\ntokens   4")


def test_while_live_the_speedup_waits_for_the_reply() -> None:
    measuring = replace(UNMEASURED, speedup_reason="measuring: a plain reply follows")
    assert "\nspeedup  measuring…\nwhy      a plain reply follows\n" in stats_content(measuring, live=True).plain
    later = stats_content(replace(UNMEASURED, speedup_reason=None), live=True).plain
    assert later.startswith("─ live ──") and "\nspeedup  after the reply\ntokens   4" in later


def test_the_connection_panel_lists_plain_facts_only() -> None:
    assert server_content(INFO).plain == "─ server ──────────────────\n llama.cpp b1234\n slots   4"
    assert server_content(None).plain == ""
