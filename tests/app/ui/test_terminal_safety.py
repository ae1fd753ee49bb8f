"""Nothing from a model, a server, a saved chat, a profile or a paste reaches the terminal raw.

Each test puts the hostile sequences (OSC 0/8/52, CSI 2J, DCS, C1 CSI/OSC) through one path
of the app and checks what a full repaint writes to the terminal (tests.app.terminal)."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from app.store.history import History
from app.ui.app import SpecChatApp
from app.ui.export import chat_markdown
from app.ui.screens.chats import ChatsScreen
from app.ui.screens.copy import CopyScreen
from app.ui.screens.profiles import ProfilePicker
from app.ui.widgets.chat_view import AssistantMessage, UserMessage
from app.ui.widgets.hud import Hud
from app.ui.widgets.prompt import PromptArea
from engine.config.profiles import ModelProfile, ModelSpec, Profiles, profile_from_server
from engine.text_safety import inert
from tests.app.fakes import FakeLoader, make_profiles
from tests.app.helpers import ready, send, wait_for
from tests.app.terminal import foreign_controls, screen_output
from tests.fake_server import FakeServer, llama_routes, props_route, reply_stream, send_json, start_sse, write_events
from tests.hostile import ALL, HOSTILE, raw_in

pytestmark = pytest.mark.anyio
SIZE = (120, 60)


def clean(app: SpecChatApp) -> None:
    """The screen as the terminal would get it holds no control character but Textual's own."""
    out = screen_output(app)
    assert foreign_controls(out) == []
    assert "␛" in out  # the sequences are there to read, as visible characters


def hostile_script() -> tuple[tuple[tuple[str, str], ...], ...]:
    return tuple(((f"<{name}>", "draft"), (seq, "target"), (" ok\n\n", "draft")) for name, seq in HOSTILE.items())


async def test_a_models_reply_is_shown_inert_while_it_streams_and_after(make_app: Callable[..., SpecChatApp]) -> None:
    loader = FakeLoader(script=hostile_script(), hold_after=3)
    app = make_app(loader=loader)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        await wait_for(pilot, lambda: loader.backends and loader.backends[-1].held.is_set(), timeout=10)
        await pilot.pause()
        clean(app)  # mid-reply
        loader.backends[-1].release.set()
        await wait_for(pilot, lambda: not app.conversation.generating, timeout=10)
        reply = app.query_one(AssistantMessage)
        assert reply.text == "".join(t for rnd in hostile_script() for t, _ in rnd)  # kept exact
        clean(app)
        app.conversation.show_sources = True  # the colour view shows the same text
        await pilot.pause()
        clean(app)


async def test_a_saved_chat_title_and_messages_are_shown_inert(make_app: Callable[..., SpecChatApp]) -> None:
    history = History.open()
    chat = history.create_chat("title" + ALL, "fast")
    history.add_message(chat, "user", "asked" + ALL)
    history.add_message(chat, "assistant", "said" + ALL, profile="fast" + HOSTILE["osc0-title"],
                        finish_reason="eos", stats={"mode": "spec", "server": "srv" + ALL, "tokens": 3})
    history.close()
    app = make_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen))
        clean(app)  # the chats list
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.query(UserMessage) and app.query(AssistantMessage))
        await pilot.pause()
        assert raw_in(app.sub_title) == [] and "title<osc0-title>␛]0;pwned␇" in app.sub_title
        clean(app)  # the transcript, and the title bar
        prompt = app.query_one(PromptArea)
        prompt.focus()
        await pilot.press("up")  # the box recalls the saved prompt
        await pilot.pause()
        assert prompt.text.startswith("asked<osc0-title>␛]0;pwned␇")
        clean(app)
        await pilot.press("f7")  # the copy dialog previews the messages
        await wait_for(pilot, lambda: isinstance(app.screen, CopyScreen))
        await pilot.pause()
        clean(app)
        await pilot.press("enter")  # the last reply: copied as shown (pasted in a shell, raw ones would act)
        await wait_for(pilot, lambda: not isinstance(app.screen, CopyScreen))
        assert app.clipboard == inert("said" + ALL) and raw_in(app.clipboard) == []
        assert any("copied as the stand-ins shown" in n.message for n in app._notifications)


def test_an_export_writes_the_escapes_as_visible_characters() -> None:
    history = History.open()
    chat = history.create_chat("title" + ALL, "fast", system_prompt="sys" + ALL)
    history.add_message(chat, "user", "asked" + ALL)
    history.add_message(chat, "assistant", "said\tand\n" + ALL, profile="p" + ALL, finish_reason="eos")
    text = chat_markdown(history, chat)
    history.close()
    assert raw_in(text) == [] and "said\tand\n<osc0-title>␛]0;pwned␇" in text


def hostile_profiles() -> Profiles:
    base = make_profiles()
    evil = ModelProfile(name="evil" + HOSTILE["osc52-clipboard"], target=ModelSpec("org/T" + HOSTILE["c1-csi"]),
                        drafter="ngram", description="about" + ALL)
    return Profiles({**base.profiles, evil.name: evil}, default="fast", files=())


async def test_profile_names_and_descriptions_are_shown_inert(make_app: Callable[..., SpecChatApp]) -> None:
    app = make_app(profiles_loader=hostile_profiles)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker))
        await pilot.pause()
        clean(app)
        await pilot.press("escape")
        await pilot.press("ctrl+p")  # the command palette offers a switch to each profile
        await pilot.pause(0.3)
        await pilot.press(*"evil")
        await pilot.pause(0.5)
        assert foreign_controls(screen_output(app)) == []
        await pilot.press("escape")
        app.switch_profile("evil" + HOSTILE["osc52-clipboard"])  # loaded: the title bar, the HUD
        await wait_for(pilot, lambda: app.engine.profile is not None and app.engine.profile.name.startswith("evil")
                       and app.engine.backend is not None and not app.engine.loading, timeout=10)
        assert "evil␛]52;c;cm0gLXJmIH4=␇" in app.sub_title  # the header names the profile until a prompt names the chat
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage), timeout=10)
        app.query_one(Hud).flush(force=True)
        await pilot.pause()
        clean(app)


async def test_a_profile_name_is_shown_inert_while_it_loads(make_app: Callable[..., SpecChatApp],
                                                              loader: FakeLoader) -> None:
    """The prompt box says which profile loads: that text is a profile's name from models.toml too."""
    app = make_app(profiles_loader=hostile_profiles)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        loader.gate = threading.Event()
        app.switch_profile("evil" + HOSTILE["osc52-clipboard"])
        await wait_for(pilot, lambda: app.engine.loading)
        await pilot.pause()
        assert "Loading evil␛]52;c;cm0gLXJmIH4=␇" in app.conversation.prompt.placeholder.plain
        clean(app)
        loader.gate.set()


async def test_a_paste_keeps_its_order_and_comes_in_inert(make_app: Callable[..., SpecChatApp]) -> None:
    from textual import events

    app = make_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        prompt = app.query_one(PromptArea)
        prompt.focus()
        app.post_message(events.Paste("first\r\nsecond" + ALL + "last"))
        await pilot.pause()
        assert prompt.text.startswith("first\nsecond<osc0-title>␛]0;pwned␇") and prompt.text.endswith("last")
        assert raw_in(prompt.text) == []
        clean(app)


def hostile_server() -> FakeServer:
    def chat(req, body):  # type: ignore[no-untyped-def]
        if body["messages"][-1]["content"] == "fail":
            send_json(req, 500, {"error": {"message": "boom" + ALL}})
            return
        start_sse(req)
        write_events(req, reply_stream(["Hi ", *HOSTILE.values()]))
    routes = llama_routes(chat)
    routes["/props"] = props_route(build="b1" + ALL)
    return FakeServer(routes)


async def test_a_servers_reply_errors_and_build_are_shown_inert() -> None:
    with hostile_server() as fake:
        url = fake.url.replace("http://", "http://alice:hunter2@")
        app = SpecChatApp(server_profile=profile_from_server(url), profiles_loader=make_profiles)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await wait_for(pilot, lambda: app.engine.backend is not None and not app.engine.loading, timeout=30)
            assert "hunter2" not in app.sub_title and "alice:***@" in app.sub_title  # before a prompt names the chat
            await send(pilot, "hi")
            await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage),
                           timeout=30)
            hud = app.query_one(Hud)
            hud.flush(force=True)
            await pilot.pause()
            out = screen_output(app)
            assert foreign_controls(out) == [] and "hunter2" not in out
            await send(pilot, "fail")
            await wait_for(pilot, lambda: not app.conversation.generating and len(app.query(AssistantMessage)) == 2,
                           timeout=30)
            await pilot.pause()
            out = screen_output(app)
            assert "boom" in out and foreign_controls(out) == []  # the error's toast


class HungUpTerminal:
    """A terminal that has gone: every write fails with EIO, as on a hung-up tty."""

    def write(self, text: str) -> int:
        raise OSError(5, "Input/output error")

    def flush(self) -> None:
        raise OSError(5, "Input/output error")

    def fileno(self) -> int:
        return 2


def test_textual_output_thread_outlives_a_hung_up_terminal() -> None:
    """Textual's output thread died on the first failed write; its queue (30 writes) then filled
    and the app's exit waited on it for ever: the app outlived its closed terminal."""
    import threading

    from textual.drivers._writer_thread import WriterThread

    from app.ui.terminal_safety import HungUpSafe

    out = HungUpSafe(HungUpTerminal())
    writer = WriterThread(out)  # type: ignore[arg-type]
    writer.start()
    done = threading.Event()

    def frames_then_exit() -> None:
        for i in range(100):
            writer.write(f"frame {i}")
        writer.stop()  # what the driver's close does at exit
        done.set()

    threading.Thread(target=frames_then_exit, daemon=True).start()
    assert done.wait(10), "the output thread's queue never drained"
    assert out.gone and out.fileno() == 2


def test_columns_and_lines_in_the_environment_do_not_size_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell's exported COLUMNS and LINES (a snapshot of its size at start) were the App's
    first size, read by Rich's console as the App is made: the app was laid out at it, then
    resized to the terminal's (tests/app/ui/test_smoke_tty.py drives the real terminal)."""
    monkeypatch.setenv("COLUMNS", "61")
    monkeypatch.setenv("LINES", "19")
    app = SpecChatApp(loader=FakeLoader(), profiles_loader=make_profiles)
    assert "COLUMNS" not in os.environ and "LINES" not in os.environ
    assert tuple(app.console.size) != (61, 19)
