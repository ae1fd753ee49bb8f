"""The app against a loopback server playing recorded answers: HUD figures, failures kept in history."""
from __future__ import annotations

import socket
import time

import pytest

from app.ui.app import SpecChatApp
from app.store.history import History
from app.ui.widgets.chat_view import AssistantMessage
from app.ui.widgets.hud import Hud
from app.ui.widgets.hud_line import status_line
from engine.config.profiles import profile_from_server
from tests.app.fakes import make_profiles
from tests.app.helpers import send, wait_for
from tests.fake_server import (FakeServer, chunk, llama_routes, reply_stream, send_json, start_sse, timings,
                               write_events)

pytestmark = pytest.mark.anyio
PIECES = ["Hel", "lo", " there", "!"]


def llama(spec_timings: dict, plain_timings: dict) -> FakeServer:  # type: ignore[type-arg]
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        plain = body.get("speculative.n_max") == 0
        write_events(req, reply_stream(PIECES, plain_timings if plain else spec_timings))
    return FakeServer(llama_routes(chat))


async def ready(pilot) -> SpecChatApp:  # type: ignore[no-untyped-def]
    """Connected (a loaded two-core machine can take seconds to start the app)."""
    app = pilot.app
    await wait_for(pilot, lambda: app.engine.backend is not None and not app.engine.loading, timeout=30.0)
    return app


async def replied(pilot, app: SpecChatApp) -> None:  # type: ignore[no-untyped-def]
    await wait_for(pilot, lambda: not app.conversation.generating and app.query(AssistantMessage), timeout=30.0)


def server_app(url: str) -> SpecChatApp:
    return SpecChatApp(server_profile=profile_from_server(url), profiles_loader=make_profiles)


def saved_reply() -> tuple[str, str | None, dict | None]:  # type: ignore[type-arg]
    history = History.open()
    try:
        chat = history.list_chats()[0]
        reply = history.messages(chat.id)[-1]
        return reply.content, reply.finish_reason, reply.stats
    finally:
        history.close()


def hud_text(app: SpecChatApp) -> str:
    hud = app.query_one(Hud)
    hud.flush(force=True)
    return "\n".join(str(hud.query_one(f"#hud-{part}").render()) for part in ("engine", "stats", "memory"))


async def test_reply_from_server_shows_its_figures_and_speedup() -> None:
    with llama(timings(4, 50.0, draft_n=4, accepted=2), timings(4, 25.0)) as fake:
        app = server_app(fake.url)
        async with app.run_test(size=(130, 45)) as pilot:
            await ready(pilot)
            await send(pilot, "Say hi")
            await replied(pilot, app)
            assert app.query_one(AssistantMessage).text == "Hello there!"
            text = hud_text(app)
            assert fake.url in text and "llama.cpp server" in text and "chosen by the server" in text
            assert "0.50  (2/4 drafted)" in text and "2.00" in text
            assert "2.00× vs plain 25.0 tok/s" in text
            footer = str(app.query_one(AssistantMessage).query_one(".reply-footer").render())
            assert "llama.cpp server · α 0.50 · τ 2.00 · 50.0 tok/s · 2.00× vs plain · 4 tokens" in footer
            line = str(status_line(app.query_one(Hud)))
            assert "accepted 50%" in line and "τ 2.00" in line and "2.00×" in line
        content, finish, stats = saved_reply()
        assert (content, finish) == ("Hello there!", "eos")
        assert stats is not None and stats["alpha"] == 0.5 and stats["speedup"] == 2.0
        assert stats["server"] == "llama.cpp" and stats["figures_from"] == "timings"


async def test_unknown_speedup_and_missing_figures_are_said() -> None:
    with llama(timings(4, 50.0), timings(4, 50.0)) as fake:
        app = server_app(fake.url)
        async with app.run_test(size=(130, 45)) as pilot:
            await ready(pilot)
            await send(pilot, "Say hi")
            await replied(pilot, app)
            text = hud_text(app)
            assert "drafted no tokens" in text and "unknown" in text
            assert "0.00" not in text
            footer = str(app.query_one(AssistantMessage).query_one(".reply-footer").render())
            assert "no speculative figures" in footer and "speedup unknown" in footer
            assert "speedup unknown" in str(status_line(app.query_one(Hud)))


async def test_stream_cut_mid_reply_keeps_the_partial_reply() -> None:
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("Hel"), chunk("lo")])  # then the connection closes: no [DONE]

    with FakeServer(llama_routes(chat)) as fake:
        app = server_app(fake.url)
        async with app.run_test(size=(130, 45)) as pilot:
            await ready(pilot)
            await send(pilot, "Say hi")
            await replied(pilot, app)
            reply = app.query_one(AssistantMessage)
            assert reply.text == "Hello" and reply.finish_reason == "error"
            assert any("closed the stream before the reply ended" in n.message for n in app._notifications)
            # the reason stays with the reply, not only in a toast that fades (a review's)
            footer = str(reply.query_one(".reply-footer").render())
            assert footer.startswith("✗ failed: ") and "closed the stream before the reply ended" in footer
        content, finish, stats = saved_reply()
        assert (content, finish) == ("Hello", "error")
        assert stats is not None and "closed the stream before the reply ended" in stats["error"]
        assert stats["server"] == "llama.cpp"  # the figures so far are kept beside it
        reopened = server_app(fake.url)  # the chat reopened: the reason is read back with it
        async with reopened.run_test(size=(130, 45)) as pilot:
            await ready(pilot)
            await wait_for(pilot, lambda: bool(reopened.query(AssistantMessage)))
            footer = str(reopened.query_one(AssistantMessage).query_one(".reply-footer").render())
            assert footer.startswith("✗ failed: ") and "closed the stream" in footer


async def test_escape_stops_a_silent_server() -> None:
    def chat(req, body):  # type: ignore[no-untyped-def]
        start_sse(req)
        write_events(req, [chunk("Hel"), chunk("lo"), 30.0])

    with FakeServer(llama_routes(chat)) as fake:
        app = server_app(fake.url)
        async with app.run_test(size=(130, 45)) as pilot:
            await ready(pilot)
            await send(pilot, "Say hi")
            await wait_for(pilot, lambda: app.query(AssistantMessage) and app.query_one(AssistantMessage).text == "Hello",
                           timeout=30.0)
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.conversation.generating, timeout=5.0)
            assert app.query_one(AssistantMessage).finish_reason == "cancelled"
        content, finish, _ = saved_reply()
        assert (content, finish) == ("Hello", "cancelled")


async def test_server_down_at_start_is_a_notice() -> None:
    fake = FakeServer()
    url = fake.url
    fake.httpd.server_close()  # nothing listens there now
    app = server_app(url)
    async with app.run_test(size=(130, 45)) as pilot:
        await wait_for(pilot, lambda: not app.engine.loading and app._notifications, timeout=30.0)
        assert app.engine.backend is None
        assert any("connection refused" in n.message for n in app._notifications)


async def test_esc_stops_connecting_to_a_server_that_never_answers() -> None:
    """The connect waits up to its probes' timeouts (10 s each) on a server that takes the
    connection and says nothing; the prompt box says Esc stops loading, and it does, at once."""
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)  # the kernel completes the handshake; nobody ever reads or answers
        app = server_app(f"http://127.0.0.1:{mute.getsockname()[1]}")
        async with app.run_test(size=(130, 45)) as pilot:
            await wait_for(pilot, lambda: app.engine.loading, timeout=30.0)
            await pilot.pause(0.3)  # the connect is under way
            assert app.engine.loading
            t0 = time.monotonic()
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.engine.loading, timeout=5.0)
            assert time.monotonic() - t0 < 2.0
            await pilot.pause()
            assert app.engine.backend is None
            notes = {n.title: n.message for n in app._notifications}
            assert notes["Loading stopped"].startswith("Stopped loading")


async def test_a_server_down_at_the_start_is_connected_again_from_f2() -> None:
    """--server with the server still loading (its /v1/models answering 500 or 503): the toast
    said "F2 picks another profile", and F2 listed only models.toml's, so the server could not be
    tried again without quitting."""
    from textual.widgets import OptionList

    from app.ui.screens.profiles import ProfilePicker

    with llama(timings(4, 50.0, draft_n=4, accepted=2), timings(4, 25.0)) as fake:
        models = fake.routes["/v1/models"]
        fake.routes["/v1/models"] = lambda req, body: send_json(req, 503, {"error": {"message": "Loading model"}})
        app = server_app(fake.url)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: any("503" in n.message for n in app._notifications), timeout=30.0)
            assert app.engine.backend is None
            fake.routes["/v1/models"] = models  # the server is up now
            await pilot.press("f2")
            await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker))
            options = app.screen.query_one(OptionList)
            assert not options.get_option("server").disabled
            options.highlighted = options.get_option_index("server")
            await pilot.press("enter")
            await ready(pilot)
            assert app.engine.profile is not None and app.engine.profile.server is not None
            await send(pilot, "Say hi")
            await replied(pilot, app)
            assert app.query_one(AssistantMessage).text == "Hello there!"


async def test_a_server_given_on_the_command_line_is_not_remembered_as_the_next_starts_profile() -> None:
    """Listed in F2 since the command line's profile joined the files' ones, "server" was
    remembered: the next plain start loaded the default instead of the profile used last."""
    from app.store.state import last_profile, remember_profile

    remember_profile("lookup")
    with llama(timings(4, 50.0, draft_n=4, accepted=2), timings(4, 25.0)) as fake:
        app = server_app(fake.url)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            assert app.engine.profile is not None and app.engine.profile.name == "server"
    assert last_profile() == "lookup"
