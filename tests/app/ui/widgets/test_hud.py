"""The HUD: what is loaded and why a mode, the live figures, memory; the sparkline on a fixed scale; cheap redraws."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

from app.ui.app import SpecChatApp
from app.ui.widgets.chat_view import SOURCE_STYLES, AssistantMessage
from app.ui.labels import spec_label
from app.ui.widgets.hud import Hud
from app.ui.widgets.hud_rows import plain_text, sparkline, speedup_text
from engine.events import OriginFigures, ReplyStats
from tests.app.fakes import FakeBackend, FakeLoader, make_profiles
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio


def test_sparkline_uses_absolute_scale() -> None:
    assert str(sparkline([0.0, 1.0, 0.5], 10)) == "▁█▅"
    assert str(sparkline([1.0] * 20, 5)) == "█████"


def test_speedup_says_measuring_until_the_plain_estimate_is_sound() -> None:
    from engine.events import ReplyStats

    base = ReplyStats(mode="ngram", tokens=10, speedup=None)  # type: ignore[call-arg]
    assert speedup_text(base) == "measuring…"
    assert speedup_text(replace(base, speedup=1.5)) == "1.50×"
    assert speedup_text(None) == "—" and plain_text(None) == "—"


def test_hud_says_measuring_until_the_estimate_is_sound_and_shows_its_cross_check() -> None:
    from app.ui.widgets.hud_rows import plain_text, speedup_text
    from engine.events import ReplyStats

    assert speedup_text(None) == "—" and speedup_text(ReplyStats()) == "—"  # no tokens yet
    assert speedup_text(ReplyStats(mode="ngram", tokens=3)) == "measuring…"
    assert speedup_text(ReplyStats(mode="ngram", tokens=3), live=False) == "too short to measure"
    assert speedup_text(ReplyStats(mode="plain", tokens=40, speedup=0.98), live=False) == "—"  # decoded plainly
    assert speedup_text(ReplyStats(mode="ngram", tokens=30, proposed=20, speedup=1.8, speedup_se=0.1)) == "1.80× ± 0.10"
    assert plain_text(ReplyStats(tokens=3)) == "—"
    assert plain_text(ReplyStats(plain_tokens_per_s=95.04)) == "—"  # no speedup shown: no estimate either
    assert plain_text(ReplyStats(plain_tokens_per_s=95.04, speedup=1.2)) == "95.0 est"
    sound = ReplyStats(plain_tokens_per_s=95.04, plain_rounds=3, plain_measured_tokens_per_s=97.0, speedup=1.2)
    assert plain_text(sound) == "95.0 est · 97.0 in 3 K=0"

#----


async def test_sparkline_is_cleared_for_a_plain_reply(make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await wait_for(pilot, lambda: not app.conversation.generating
                       and app.query(AssistantMessage).last().finish_reason)
        hud = app.query_one(Hud)
        assert len(hud.round_accepted) == 5
        hud.start_reply()  # the next reply (a plain one proposes nothing): no stale α columns
        hud.flush()
        assert len(hud.round_accepted) == 0
        assert "no rounds yet" in str(hud.query_one("#hud-spark").render())

#----


async def test_the_hud_redraws_only_the_parts_that_changed(make_app: Callable[..., SpecChatApp],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        hud = app.query_one(Hud)
        hud.flush(force=True)
        updated: list[str | None] = []
        original = Static.update

        def spy(self: Static, *args: object, **kwargs: object) -> None:
            updated.append(self.id)
            original(self, *args, **kwargs)

        monkeypatch.setattr(Static, "update", spy)
        hud.flush(force=True)  # nothing changed
        assert updated == []
        hud.set_notice("draft dropped")
        hud.flush()
        assert set(updated) <= {"hud-line", "hud-engine"} and updated


async def test_a_figure_that_keeps_its_part_the_same_height_repaints_the_part_without_a_layout(
        make_app: Callable[..., SpecChatApp], monkeypatch: pytest.MonkeyPatch) -> None:
    """A layout re-renders every widget on screen (the streaming reply's too); while a reply
    streams the HUD's figures change every paint, its parts' heights almost never."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        hud = app.query_one(Hud)
        hud.set_stats(ReplyStats(mode="ngram", tokens=30, proposed=20, accepted=12, rounds=10,
                                 tokens_per_s=41.0), live=True)
        hud.flush()
        await pilot.pause()
        layouts: dict[str | None, bool] = {}
        original = Static.update

        def spy(self: Static, content: object = "", *, layout: bool = True) -> None:
            layouts[self.id] = layout
            original(self, content, layout=layout)

        monkeypatch.setattr(Static, "update", spy)
        hud.set_stats(ReplyStats(mode="ngram", tokens=31, proposed=22, accepted=13, rounds=11,
                                 tokens_per_s=42.5), live=True)
        hud.flush()
        assert layouts.get("hud-stats") is False  # the same rows, other figures
        assert layouts.get("hud-line", False) is False  # hidden at this width: laid out when shown
        layouts.clear()
        hud.set_notice("the draft was dropped: not enough memory for both models; plain decoding goes on")
        hud.flush()
        assert layouts.get("hud-engine") is True  # a longer text wraps onto more lines

#----


class HudApp(App[None]):
    def compose(self) -> ComposeResult:
        yield Hud(id="hud")


def shown(hud: Hud, part: str) -> str:
    hud.flush()
    return str(hud.query_one(f"#hud-{part}", Static).render())


FAST = make_profiles().get("fast")
LOOKUP = make_profiles().get("lookup")


async def test_nothing_loaded_yet_shows_dashes_never_none() -> None:
    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = pilot.app.query_one(Hud)
        assert shown(hud, "engine") == "profile  —\nmode     not loaded"
        assert shown(hud, "stats") == ("─ no new reply yet ────────────────────\nK        —\naccepted —\nα/token  —\n"
                                       "τ        —\ntok/s    —\nITL      —\nspeedup  —\nplain    —\ntokens   —")
        assert shown(hud, "memory") == "" and shown(hud, "positions") == "acceptance by draft position: —"


async def test_loading_then_loaded() -> None:
    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = pilot.app.query_one(Hud)
        hud.show_loading(FAST, None)
        assert shown(hud, "loading") == "Loading fast: starting" and hud.has_class("-loading")
        assert shown(hud, "engine") == (
            "profile  fast\ntarget   Target-1.7B (nf4)\ndraft    Draft-135M\nmode     loading…")
        hud.show_loading(FAST, "lookup")
        assert shown(hud, "loading") == "Loading fast: lookup stays until it is ready"
        hud.set_loading(None, "loading target weights", 0.5)  # no name: the loading profile's stays
        assert shown(hud, "loading") == "Loading fast: loading target weights"
        hud.show_engine(FakeBackend(FAST).info, FAST, fresh=True)
        assert not hud.has_class("-loading") and shown(hud, "loading") == ""
        assert shown(hud, "engine") == ("profile  fast\ntarget   Target-1.7B (nf4)\ndraft    Draft-135M\n"
                                        "mode     speculative · model draft\ndrafter  model\ndevice   fake:0")
        assert shown(hud, "memory") == ("─ memory ──────────────────\ntarget   1.2 GiB\ndraft    270.0 MiB\n"
                                        "free     5.0 GiB\nplan\n target nf4 + draft fp16 fit with 5.2 GiB to spare\n"
                                        " budget 8.0 GiB")


async def test_the_sparkline_gets_each_rounds_own_acceptance() -> None:
    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = pilot.app.query_one(Hud)
        backend = FakeBackend(FAST)
        hud.show_engine(backend.info, FAST)
        hud.start_reply()
        hud.set_stats(backend._stats(1, 3, 2), live=True)  # 2 of 4 proposed
        hud.set_stats(backend._stats(2, 6, 3), live=True)  # then 1 of the next 4
        hud.set_stats(backend._stats(2, 6, 3), live=True)  # nothing new proposed: no column
        assert list(hud.round_accepted) == [0.5, 0.25] and shown(hud, "spark") == "▅▃"
        # what it plots is the "accepted" row's figure per round (of proposed), not α: its caption says so
        assert "accepted per round (0–1)" in [str(c.render()) for c in hud.query(".hud-caption")]
        assert shown(hud, "stats") == ("─ live ────────────────────\nK        4 adaptive\naccepted 38% of proposed\n"
                                       "α/token  —\nτ        3.00\ntok/s    42.0\nITL      23.0 ms\nspeedup  2.10× ± 0.05\n"
                                       "plain    20.0 est\ntokens   6")
        assert shown(hud, "positions") == ("acceptance by draft position\n 1 ██████████████▍  0.90\n"
                                           " 2 ███████████▎     0.70\n 3 ████████         0.50")


def after_a_fast_reply(hud: Hud) -> Hud:
    """``hud`` showing the fast profile's reply of two rounds (6 tokens, 42.0 tok/s) that has ended."""
    backend = FakeBackend(FAST)
    hud.show_engine(backend.info, FAST)
    hud.start_reply()
    hud.set_stats(backend._stats(1, 3, 2), live=True)
    hud.set_stats(backend._stats(2, 6, 3), live=False)
    return hud


async def test_a_newly_loaded_profile_shows_no_figures_of_the_one_before() -> None:
    """After F2 the folded HUD read "pocket-suffix · ... 167.9 tok/s · 0.91x": pocket's last reply."""
    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = after_a_fast_reply(pilot.app.query_one(Hud))
        assert "tok/s    42.0" in shown(hud, "stats")
        hud.show_engine(FakeBackend(LOOKUP).info, LOOKUP)  # the same profile again (a refresh): kept
        assert "tok/s    42.0" in shown(hud, "stats")
        hud.show_engine(FakeBackend(LOOKUP).info, LOOKUP, fresh=True)
        assert shown(hud, "stats").startswith("─ no new reply yet") and "42.0" not in shown(hud, "stats")
        assert shown(hud, "spark") == "no rounds yet" and not hud.round_accepted


async def test_while_another_profile_loads_the_last_replys_figures_are_not_shown_under_its_name() -> None:
    """During a switch the HUD read "profile pocket-suffix / mode loading…" above pocket's last reply."""
    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = after_a_fast_reply(pilot.app.query_one(Hud))
        hud.show_loading(FAST, "fast")  # the same profile again (a reload): its figures stay
        assert "tok/s    42.0" in shown(hud, "stats")
        hud.show_loading(LOOKUP, "fast")
        assert shown(hud, "stats").startswith("─ no new reply yet") and "42.0" not in shown(hud, "stats")


async def test_why_speculation_is_off_fallback_first_then_the_user_then_a_notice() -> None:
    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = pilot.app.query_one(Hud)
        info = FakeBackend(FAST).info
        hud.show_engine(info, FAST)
        hud.set_notice("draft dropped after OOM")
        assert "\nwhy      draft dropped after OOM\n" in shown(hud, "engine")
        hud.set_speculation(False)
        assert "\nwhy      switched off by you\n" in shown(hud, "engine")
        hud.show_engine(replace(info, mode="plain", fallback_reason="tokenizers differ"), FAST)
        assert "\nmode     plain decoding\nwhy      tokenizers differ\n" in shown(hud, "engine")
        hud.show_engine(info, FAST, fresh=True)  # a fresh load: speculation on, the old notice gone
        assert "why" not in shown(hud, "engine")



async def test_a_replys_notice_goes_when_the_next_reply_starts() -> None:
    """"why: the server went on past the 512-token limit" stayed through every later reply."""
    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = pilot.app.query_one(Hud)
        hud.show_engine(FakeBackend(FAST).info, FAST)
        hud.set_notice("the server went on past the 512-token limit it was sent (max_tokens)")
        assert "past the 512-token limit" in shown(hud, "engine")
        hud.start_reply()
        assert "why" not in shown(hud, "engine")


async def test_a_failed_load_shows_its_error_until_the_next_load() -> None:
    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = pilot.app.query_one(Hud)
        hud.show_loading(LOOKUP, None)
        hud.show_failed("model not found")
        assert shown(hud, "engine") == ("profile  lookup\ntarget   Target-360M\ndraft    n-gram lookup\n"
                                        "error    model not found\nmode     not loaded")
        assert not hud.has_class("-loading")
        hud.show_loading(LOOKUP, None)
        assert "error" not in shown(hud, "engine")


async def test_the_legend_and_the_figures_name_the_drafters_the_profile_has() -> None:
    """The legend lists the sources the loaded drafter can produce; with more than one drafter
    (the suffix drafter: this chat and earlier chats) α and τ are split by who drafted."""
    suffix = replace(LOOKUP, name="suffix", drafter="suffix")
    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = pilot.app.query_one(Hud)
        assert shown(hud, "legend") == " draft accepted    target produced "  # nothing loaded
        hud.show_engine(FakeBackend(FAST).info, FAST)
        assert shown(hud, "legend") == " draft accepted    target produced "
        hud.show_engine(FakeBackend(LOOKUP).info, LOOKUP)
        assert shown(hud, "legend") == " copied from chat    target produced "
        hud.start_reply()
        stats = FakeBackend(LOOKUP)._stats(3, 9, 5)
        hud.set_stats(replace(stats, by_origin=(OriginFigures("chat", 3, 12, 5, 9),)), live=True)
        assert "round" not in shown(hud, "stats")  # one drafter: the figures above are its own
        hud.show_engine(FakeBackend(suffix).info, suffix)
        assert shown(hud, "legend") == " copied from chat \n from earlier chats \n target produced "
        split = (OriginFigures("history", 2, 10, 8, 10), OriginFigures("chat", 1, 4, 1, 2))
        hud.set_stats(replace(stats, by_origin=split), live=True)
        rows = shown(hud, "stats").splitlines()
        i = rows.index("τ        3.00")
        # indented under τ, the figures in τ's column (they stood one further right)
        assert rows[i + 1:i + 3] == [" earlier 80% τ 5.00 (2 rounds) ", " chat    25% τ 2.00 (1 round) "]
        styles = {str(span.style) for span in hud.query_one("#hud-stats", Static).render().spans}
        assert SOURCE_STYLES["history"] in styles and SOURCE_STYLES["chat"] in styles
        worst = (OriginFigures("history", 999, 15_984, 15_984, 16_983),)  # 100%, τ 17.00, 999 rounds
        hud.set_stats(replace(stats, by_origin=worst), live=True)
        assert max(len(r) for r in shown(hud, "stats").splitlines()) <= 37  # the panel's text width


async def test_the_legend_follows_the_drafter_that_loaded_and_the_colours_on_screen() -> None:
    """A model profile whose draft was dropped copies with the n-gram drafter: its legend says
    so. A reopened chat's colours from another drafter get their legend entry too."""
    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = pilot.app.query_one(Hud)
        backend = FakeBackend(FAST)
        hud.show_engine(backend.info, FAST)
        assert shown(hud, "legend") == " draft accepted    target produced "
        assert "draft    " + spec_label(FAST.draft) in shown(hud, "engine")
        dropped = replace(backend.info, mode="ngram", drafter="n-gram lookup", draft_bytes=None,
                          fallback_reason="draft model dropped: not enough memory")
        hud.show_engine(dropped, FAST)
        assert shown(hud, "legend") == " copied from chat    target produced "
        assert "draft    n-gram lookup (draft model dropped)" in shown(hud, "engine")  # it named the 0.5B
        hud.set_seen_sources({"history", "target"})  # a suffix-drafted chat reopened
        hud.flush()
        assert shown(hud, "legend") == " copied from chat \n from earlier chats \n target produced "
        hud.set_seen_sources(())
        hud.flush()
        assert shown(hud, "legend") == " copied from chat    target produced "
        # dropped while decoding (out of memory): no drafter at all, plain decoding; the rows named
        # the n-gram lookup and the freed draft model (a hostile tester's)
        for profile in (FAST, LOOKUP):
            gone = replace(FakeBackend(profile).info, mode="plain", drafter="none", draft_bytes=0,
                           fallback_reason="out of memory while drafting")
            hud.show_engine(gone, profile)
            engine_rows = shown(hud, "engine")
            assert "draft    none (dropped: plain decoding)" in engine_rows and "drafter  none" in engine_rows
            assert shown(hud, "legend") == " target produced "


async def test_the_one_line_hud_keeps_a_suffix_profiles_legend_on_its_line() -> None:
    """F4 on the one-line HUD (80 columns, or F6) with three legend entries: the line held only
    its first entry, the profile, mode and figures gone (a reviewer's)."""
    suffix = replace(LOOKUP, name="suffix", drafter="suffix")
    async with HudApp().run_test(size=(160, 10)) as pilot:
        hud = pilot.app.query_one(Hud)
        hud.show_engine(FakeBackend(suffix).info, suffix)
        hud.set_class(True, "-line")
        hud.set_class(True, "-legend")
        hud.flush(force=True)
        line = shown(hud, "line")
        assert "\n" not in line
        assert " copied from chat    from earlier chats    target produced " in line and "suffix" in line


async def test_a_server_replys_acceptance_is_no_round_of_the_sparkline() -> None:
    """The server reports its counts once, at the reply's end: they plotted as one "round"."""
    from engine.remote.figures import ServerStats

    async with HudApp().run_test(size=(60, 60)) as pilot:
        hud = pilot.app.query_one(Hud)
        hud.start_reply()
        hud.set_stats(ServerStats(mode="spec", server="llama.cpp", tokens=9, proposed=6, accepted=3), live=False)
        assert not hud.round_accepted


def test_the_drafter_run_in_place_of_a_dropped_one_is_read_once_for_the_hud_and_the_header() -> None:
    """The header named a draft model the memory plan had dropped while the HUD said n-gram lookup."""
    from app.ui.labels import dropped_drafter, profile_pair
    from engine.api import EngineInfo
    from tests.app.fakes import make_profiles

    pair = make_profiles().get("fast")  # drafter = "model"
    loaded = EngineInfo("fast", "t", "model", "spec", "cpu", draft_bytes=1)
    assert dropped_drafter(pair, loaded) is None
    lookup = EngineInfo("fast", "t", "ngram", "ngram", "cpu")
    assert dropped_drafter(pair, lookup) == "ngram"
    assert profile_pair(pair, "ngram").endswith("← n-gram lookup (draft model dropped)")
    assert dropped_drafter(pair, EngineInfo("fast", "t", "none", "plain", "cpu")) == "none"
    assert dropped_drafter(make_profiles().get("lookup"), lookup) is None  # lookup is its own drafter
