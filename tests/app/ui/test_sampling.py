"""Per-chat sampling: set in F10's dialog, checked there, sent with each request, saved and restored."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.widgets import Input, Label

from app.ui.app import SpecChatApp
from app.ui.sampling import BadValue, ChatSampling, parse_sampling
from app.ui.screens.help import help_markdown
from app.ui.screens.sampling import SamplingScreen
from app.ui.widgets.chat_view import AssistantMessage
from app.ui.widgets.prompt import PromptArea
from engine.events import SamplingParams
from tests.app.fakes import FakeLoader, make_profiles
from tests.app.helpers import ready, send, wait_for

pytestmark = pytest.mark.anyio


def test_fields_are_read_and_a_blank_one_follows_the_profile() -> None:
    assert parse_sampling("0.7", "0.9", "", "42") == ChatSampling(0.7, 0.9, None, 42)
    assert parse_sampling(" ", "", "40", "") == ChatSampling(top_k=40)
    assert parse_sampling("0", "1", "0", "0") == ChatSampling(0.0, 1.0, 0, 0)


@pytest.mark.parametrize("fields, field, words", [
    (("-0.1",), "temperature", "Temperature must be 0 (greedy) or a number of at least 0.001"),
    (("1e-300",), "temperature", "not “1e-300”"),  # every reply then failed: the logits overflowed
    (("warm",), "temperature", "not “warm”"),
    (("inf",), "temperature", "Temperature"),
    (("1", "0"), "top_p", "Top-p must be a number above 0 and at most 1"),
    (("1", "1.01"), "top_p", "not “1.01”"),
    (("1", "1", "2.5"), "top_k", "Top-k must be a whole number"),
    (("1", "1", "1", "-1"), "seed", "The seed must be a whole number"),
    (("1", "1", "1", str(2**63)), "seed", "The seed"),
])
def test_a_bad_value_names_its_field(fields: tuple[str, ...], field: str, words: str) -> None:
    bad = parse_sampling(*fields)
    assert isinstance(bad, BadValue) and bad.field == field and words in bad.message


def test_the_label_says_what_the_next_reply_uses() -> None:
    fast = make_profiles().get("fast")  # greedy: temperature 0
    assert ChatSampling().label(fast) == ""  # nothing to say
    assert ChatSampling(seed=3).label(fast) == "greedy"
    assert ChatSampling(0.7, 0.9, None, 42).label(fast) == "T 0.7 · top-p 0.9 · seed 42"
    assert ChatSampling(1.0, top_k=40).label(fast) == "T 1 · top-k 40 · no seed"


def test_values_are_shown_exactly_and_a_long_wrong_one_is_quoted_short() -> None:
    """``:g`` showed top-p 0.9999999 as "top-p 1" (1 means off) and T 0.7000001 as 0.7, and saving
    the dialog again stored what it showed; a 5,000-digit seed's error filled the dialog."""
    fast = make_profiles().get("fast")
    assert ChatSampling(0.7000001, 0.9999999, None, 5).label(fast) == "T 0.7000001 · top-p 0.9999999 · seed 5"
    assert ChatSampling(1e300).label(fast) == "T 1e+300 · no seed"
    assert ChatSampling(0.7000001, seed=5).own_label() == "T 0.7000001 · seed 5"
    assert ChatSampling(top_k=40).own_label() == "top-k 40" and ChatSampling().own_label() == ""
    bad = parse_sampling(seed="9" * 5000)
    assert isinstance(bad, BadValue) and len(bad.message) < 200 and bad.message.endswith("9…”.")


def test_saved_values_are_read_back_and_bad_ones_follow_the_profile() -> None:
    sampling = ChatSampling(0.7, 0.9, 5, 42)
    assert ChatSampling.from_dict(sampling.to_dict()) == sampling
    assert ChatSampling().to_dict() is None and ChatSampling.from_dict(None) == ChatSampling()
    assert ChatSampling.from_dict({"temperature": -1, "top_p": 2, "top_k": "5", "seed": True}) == ChatSampling()
    assert ChatSampling.from_dict([0.7]) == ChatSampling()


async def set_in_dialog(pilot: object, app: SpecChatApp, **values: str) -> SamplingScreen:
    """F10, then type ``values`` into their fields (replacing what is there); the dialog stays open."""
    await pilot.press("f10")  # type: ignore[attr-defined]
    await wait_for(pilot, lambda: isinstance(app.screen, SamplingScreen))  # type: ignore[arg-type]
    screen = app.screen
    assert isinstance(screen, SamplingScreen)
    await pilot.pause()  # type: ignore[attr-defined]
    for name, value in values.items():
        box = screen.query_one(f"#sampling-{name}", Input)
        box.value = ""
        box.focus()
        await pilot.press(*value)  # type: ignore[attr-defined]
    return screen


def sent(loader: FakeLoader) -> SamplingParams:
    return loader.backends[-1].params[-1].sampling


async def test_the_dialog_sets_the_chats_sampling_and_each_request_carries_it(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "greedy first")
        await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage))
        assert sent(loader) == SamplingParams(0.0, 1.0, 0, None)  # the profile's
        assert app.query_one(PromptArea).border_subtitle == ""
        await set_in_dialog(pilot, app, temperature="0.7", top_p="0.9", seed="42")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, SamplingScreen))
        assert app.query_one(PromptArea).border_subtitle == "T 0.7 · top-p 0.9 · seed 42"
        assert any("T 0.7 · top-p 0.9 · seed 42" in n.message for n in app._notifications)
        await send(pilot, "now sampled")
        await wait_for(pilot, lambda: not app.conversation.generating and len(app.query(AssistantMessage)) == 2)
        assert sent(loader) == SamplingParams(0.7, 0.9, 0, 42)
        await pilot.press("ctrl+r")  # a seeded regeneration asks for the same draw again
        await wait_for(pilot, lambda: not app.conversation.generating and len(loader.backends[-1].params) == 3)
        assert sent(loader) == SamplingParams(0.7, 0.9, 0, 42)
        chat_id = app.conversation.chat_id
        assert chat_id is not None and app.archive.history is not None and app.archive.saver is not None
        assert app.archive.saver.flush(5)
        saved = app.archive.history.get_chat(chat_id)
        assert saved is not None and saved.sampling == {"temperature": 0.7, "top_p": 0.9, "seed": 42}
        await app.action_new_chat()  # a new chat starts from the profile's sampling
        await send(pilot, "fresh chat")
        await wait_for(pilot, lambda: not app.conversation.generating and len(loader.backends[-1].params) == 4)
        assert sent(loader) == SamplingParams(0.0, 1.0, 0, None)
        assert app.query_one(PromptArea).border_subtitle == ""
        await app.open_chat(chat_id)  # reopened from F3: its own sampling again
        await pilot.pause()
        assert app.query_one(PromptArea).border_subtitle == "T 0.7 · top-p 0.9 · seed 42"


async def test_sampling_set_before_the_first_prompt_is_saved_and_restored_after_a_restart(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await set_in_dialog(pilot, app, temperature="1.1", top_k="40")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, SamplingScreen))
        await send(pilot, "warm")
        await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage))
        assert sent(loader) == SamplingParams(1.1, 1.0, 40, None)  # no seed: each reply draws afresh
    again = make_app(loader=(second := FakeLoader()))
    async with again.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert again.conversation.sampling == ChatSampling(1.1, None, 40, None)
        assert again.query_one(PromptArea).border_subtitle == "T 1.1 · top-k 40 · no seed"
        await send(pilot, "again")
        await wait_for(pilot, lambda: not again.conversation.generating and second.backends[0].params)
        assert second.backends[0].params[0].sampling == SamplingParams(1.1, 1.0, 40, None)


async def test_a_bad_value_is_named_in_the_dialog_and_nothing_typed_is_lost(
        make_app: Callable[..., SpecChatApp], loader: FakeLoader) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        screen = await set_in_dialog(pilot, app, temperature="-1", top_p="0.8", seed="7")
        await pilot.press("enter")
        await wait_for(pilot, lambda: "Temperature must be" in str(screen.query_one("#sampling-error", Label).render()))
        assert app.screen is screen and app.focused is screen.query_one("#sampling-temperature", Input)
        assert [screen.query_one(f"#sampling-{n}", Input).value for n in ("temperature", "top_p", "seed")] == [
            "-1", "0.8", "7"]
        assert app.conversation.sampling == ChatSampling()  # nothing applied yet
        screen.query_one("#sampling-top_p", Input).value = "1.5"
        screen.query_one("#sampling-temperature", Input).value = "0.5"
        await pilot.press("enter")
        await wait_for(pilot, lambda: "Top-p must be" in str(screen.query_one("#sampling-error", Label).render()))
        assert app.focused is screen.query_one("#sampling-top_p", Input)
        screen.query_one("#sampling-top_p", Input).value = "0.8"
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, SamplingScreen))
        assert app.conversation.sampling == ChatSampling(0.5, 0.8, None, 7)


async def test_escape_keeps_the_sampling_and_the_dialog_starts_from_it(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        app.conversation.set_sampling(ChatSampling(0.7000001, 0.9999999, seed=42))
        screen = await set_in_dialog(pilot, app)
        values = {n: screen.query_one(f"#sampling-{n}", Input) for n in ("temperature", "top_p", "top_k", "seed")}
        assert [v.value for v in values.values()] == ["0.7000001", "0.9999999", "", "42"]  # as set, not rounded
        values["top_p"].value = ""
        assert values["top_p"].placeholder == "profile: 1" and values["seed"].placeholder == "none"
        values["temperature"].value = "2"
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, SamplingScreen))
        assert app.conversation.sampling == ChatSampling(0.7000001, 0.9999999, seed=42)


async def test_the_palette_and_f1_offer_sampling(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Sampling…" in titles
        text = help_markdown([("App", list(app.BINDINGS))])
        assert any("f10" in line.lower() and "Sampling…" in line for line in text.splitlines())


def shown_whole(widget: object) -> bool:
    """``widget`` lies inside the part of its dialog on screen (the dialog may scroll)."""
    dialog = widget.screen.query_one(".dialog")  # type: ignore[attr-defined]
    return dialog.scrollable_content_region.contains_region(widget.region)  # type: ignore[attr-defined]


@pytest.mark.parametrize("size", [(100, 16), (60, 12)])
async def test_on_a_short_terminal_the_error_is_seen_and_the_buttons_are_reached(
        make_app: Callable[..., SpecChatApp], size: tuple[int, int]) -> None:
    """At 100x16 Enter on "nan" seemed to do nothing: the error line and the buttons were below the
    dialog's cut (a hostile tester). The error now stands under the hint, and the dialog scrolls."""
    from textual.widgets import Button

    app = make_app()
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        screen = await set_in_dialog(pilot, app, temperature="nan")
        await pilot.press("enter")
        error = screen.query_one("#sampling-error", Label)
        await wait_for(pilot, lambda: "Temperature must be" in str(error.render()))
        await pilot.pause()
        assert shown_whole(error) and shown_whole(screen.query_one("#sampling-temperature", Input))
        save = screen.query_one("#save", Button)
        save.focus()
        await wait_for(pilot, lambda: shown_whole(save))  # the dialog scrolls to it
