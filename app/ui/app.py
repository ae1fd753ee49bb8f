"""specchat's terminal UI: chat with a speculative-decoding engine and watch it work.

Layout: the transcript and prompt box on the left, the HUD on the right, a
Footer with the main keys. Loading and generation run in thread workers; they
talk to the UI only through :mod:`app.ui.messages`. Reply bookkeeping (streaming,
saving) lives in :class:`app.ui.replies.ReplyMixin`; chat management (new, open,
rename, export) in :class:`app.ui.chats.ChatMixin`.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.driver import Driver
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header

from app.ui.chats import ChatMixin
from app.ui.commands import ProfileCommands, unique_commands
from app.store.history import History
from app.ui.early_stop import early_stop_driver
from app.ui.key_hold import KeyHold
from app.ui.loading import LoadingMixin, default_loader
from app.ui.replies import SAVE_FLUSH_AT_EXIT_S, WRITE_EVERY_S, ReplyMixin
from app.store.saver import HistoryLag, HistorySaver
from app.ui.screens.dialog import Dialog
from app.ui.screens.help import HelpScreen
from app.ui.screens.profiles import ProfilePicker
from app.store.state import last_profile
from app.ui.turns import TurnsMixin
from app.ui.widgets.chat_view import AssistantMessage, ChatLog
from app.ui.widgets.hud import Hud
from app.ui.widgets.prompt import PromptArea
from engine.api import ChatBackend, ProgressFn
from engine.errors import SpecChatError

if TYPE_CHECKING:
    from engine.profiles import ModelProfile, Profiles

Loader = Callable[["ModelProfile", "int | None", ProgressFn], ChatBackend]
HUD_REFRESH_S = 0.25


class SpecChatApp(LoadingMixin, ReplyMixin, ChatMixin, TurnsMixin, App[None]):
    """The chat app. ``loader`` and ``profiles_loader`` are injectable for tests."""

    CSS_PATH = "specchat.tcss"
    TITLE = "specchat"
    COMMANDS = App.COMMANDS | {ProfileCommands}
    BINDINGS = [
        Binding("escape", "stop", "Stop", tooltip="stop the reply, keeping what was written"),
        # All but Esc are priority keys: the app runs them as it reads them, before the
        # keys typed after them, which then reach the dialog they open (F2 Enter picks a
        # profile instead of sending the prompt; see app.ui.screens.dialog). F6 and F7 are
        # the prompt box's select-line/select-all too: priority makes them the app's.
        Binding("f1", "help", "Help", priority=True),
        Binding("f2", "pick_profile", "Profile", priority=True),
        Binding("f3", "chats", "Chats", priority=True),
        Binding("f4,ctrl+t", "toggle_sources", "Colours", priority=True,
                tooltip="colour each token: draft accepted vs target produced"),
        Binding("f5", "toggle_speculation", "Spec on/off", key_display="f5", priority=True),
        Binding("f6", "toggle_hud", "HUD", priority=True, tooltip="the side panel, or one status line"),
        Binding("f7", "copy", "Copy", priority=True, tooltip="the last reply, a message or a code block"),
        Binding("ctrl+n", "new_chat", "New chat", priority=True),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("ctrl+r", "regenerate", "Regenerate", show=False, priority=True,
                tooltip="answer the last prompt again (the earlier reply stays)"),
        Binding("ctrl+g", "edit_last_prompt", "Edit last prompt", show=False, priority=True,
                tooltip="change the last prompt and ask again (the earlier exchange stays)"),
        Binding("f8", "edit_system_prompt", "System prompt", show=False, priority=True),
        Binding("f9", "export_chat", "Export", show=False, priority=True,
                tooltip="the chat as Markdown with its statistics"),
    ]
    _MAIN_SCREEN_ACTIONS = frozenset(b.action for b in BINDINGS) - {"quit", "stop"}
    EXTRA_COMMANDS = [
        ("Copy last reply", "the last reply to the clipboard", "copy_last_reply"),
        ("Copy last code block", "the last code block of the replies to the clipboard", "copy_last_code"),
    ]

    generating: reactive[bool] = reactive(False, bindings=True)
    show_sources: reactive[bool] = reactive(False)

    def __init__(
        self,
        profile: str | None = None,
        *,
        models_file: Path | None = None,
        memory_budget: int | None = None,
        target: str | None = None,
        draft: str | None = None,
        server_profile: "ModelProfile | None" = None,
        loader: Loader | None = None,
        profiles_loader: "Callable[[], Profiles] | None" = None,
    ) -> None:
        super().__init__()
        self._profile_name = profile
        self._models_file = models_file
        self._memory_budget = memory_budget
        self._target = target
        self._draft = draft
        self._server_profile = server_profile  # from --server URL
        self._loader: Loader = loader or default_loader
        self._profiles_loader = profiles_loader or self._load_profiles_file
        self.profiles: "Profiles | None" = None
        self.profile: "ModelProfile | None" = None
        self.backend: ChatBackend | None = None
        self.loading = False
        self.speculation_on = True
        self.history: History = None  # type: ignore[assignment]  # opened on mount
        self._backend_lock = threading.Lock()
        self._cuda: bool | None = None
        self.init_chat_state()
        self.init_reply_state()
        self.key_hold = KeyHold(super().on_event, self.call_later, self.set_timer)

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded and self.key_hold.take(event):
            return  # a dialog is answering: the key waits its turn (app.ui.key_hold)
        await super().on_event(event)

    def _load_profiles_file(self) -> "Profiles":
        from engine.profiles import load_profiles

        return load_profiles(self._models_file)

    # -- layout -----------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(icon="≫")
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield ChatLog(id="chat-log")
                yield PromptArea(id="prompt", placeholder="Ask something · Enter sends · ctrl+j newline · F1 help")
            yield Hud(id="hud")
        yield Footer(compact=True)  # compact: the main keys, Quit included, fit in 80 columns

    # The main screen's widgets, found there even while a dialog is on top
    # (App.query_one searches the active screen).
    @property
    def main_screen(self) -> Screen:
        """The chat screen; NoMatches once the app has closed its screens (a timer
        or a message may still run in that moment)."""
        if not self.screen_stack:
            raise NoMatches("the app is closing: it has no screens left")
        return self.screen_stack[0]

    @property
    def hud(self) -> Hud:
        return self.main_screen.query_one(Hud)

    @property
    def chat_log(self) -> ChatLog:
        return self.main_screen.query_one(ChatLog)

    @property
    def prompt(self) -> PromptArea:
        return self.main_screen.query_one(PromptArea)

    def on_mount(self) -> None:
        self.history = History.open()
        if self.history.notice:
            self.notice(self.history.notice, severity="error", title="History")
        self.saver = HistorySaver(self.history, lambda text: self.post_message(HistoryLag(text)),
                                  min_interval_s=WRITE_EVERY_S)
        self.show_welcome()
        prompt = self.prompt
        prompt.scroll_target = lambda: self.chat_log
        prompt.set_history(self.db(self.history.recent_prompts) or [])
        prompt.focus()
        self.set_interval(HUD_REFRESH_S, self._flush_hud)
        self.fit_hud()
        profile = self._initial_profile()
        if profile is not None:
            self._start_load(profile)
        else:
            self.hud.set_error("no profile loaded — F2 to pick one")

    def _initial_profile(self) -> "ModelProfile | None":
        """The profile to load first: --server, --target/--draft, the named one, the one
        used last (remembered in the user state dir), or the default."""
        try:
            self.profiles = self._profiles_loader()
        except SpecChatError as exc:
            self.notice(str(exc), severity="error", title="Profiles")
        except Exception as exc:  # never a traceback in the UI
            self.notice(f"Could not read profiles: {type(exc).__name__}: {exc}", severity="error")
        try:
            if self._server_profile is not None:
                return self._server_profile
            if self._target is not None:
                from engine.profiles import profile_from_sources

                return profile_from_sources(self._target, self._draft)
            if self.profiles is not None:
                name = self._profile_name
                if name is None and last_profile() in self.profiles.names():
                    name = last_profile()
                return self.profiles.get(name)
        except SpecChatError as exc:
            self.notice(str(exc), severity="error", title="Profile")
        return None

    def _flush_hud(self) -> None:
        try:
            self.hud.flush()
        except NoMatches:  # the app is closing: its widgets are going away
            pass

    def notice(self, message: str, *, severity: str = "information", title: str = "", timeout: float | None = None) -> None:
        """A toast whose text is shown literally (engine messages may contain brackets)."""
        self.notify(message, severity=severity, title=title, markup=False,  # type: ignore[arg-type]
                    timeout=timeout if timeout is not None else (10 if severity == "error" else 5))

    # -- actions ------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.can_stop()
        if action in self._MAIN_SCREEN_ACTIONS and self.dialog_open():
            # A dialog is open: its keys are its own (F1 closes the help it opened).
            return action == "help" and isinstance(self.screen, HelpScreen)
        return True

    def can_stop(self) -> bool:
        """Esc stops the reply: one streams and no dialog is open (safe from any thread)."""
        return self.generating and len(self.screen_stack) == 1

    def get_driver_class(self) -> type[Driver]:
        return early_stop_driver(super().get_driver_class(), self._stop_early, esc_prefix=self.dialog_open)

    def dialog_open(self) -> bool:
        """A dialog is over the chat (safe from any thread): Alt+letter is read as Esc, letter."""
        return len(self.screen_stack) > 1

    def _stop_early(self) -> None:
        """Esc, seen on the terminal's input thread (app.ui.early_stop)."""
        if self.can_stop():
            self.stop_reply()

    def get_system_commands(self, screen: Screen[Any]) -> Any:
        yield from unique_commands(self, super().get_system_commands(screen))

    def push_screen(self, screen: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(screen, Dialog):  # keys typed after F9 (say) are the dialog's: app.ui.screens.dialog
            screen.hold_keys_until_ready(self.key_hold.hold())
        return super().push_screen(screen, *args, **kwargs)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):  # F1 is a priority key: it closes the help it opened
            self.screen.dismiss(None)
            return
        self.push_screen(HelpScreen([("App", list(self.BINDINGS)), ("Prompt box", [*PromptArea.BINDINGS, *PromptArea.HELP_ONLY])]))

    def action_pick_profile(self) -> None:
        if self.profiles is None:
            self.notice("No profiles file could be read; start with --target to chat.", severity="warning")
            return

        def picked(name: str | None) -> None:
            if name:
                self.switch_profile(name)

        self.push_screen(ProfilePicker(self.profiles, self.profile.name if self.profile else None,
                                       self.unavailable_profiles()), picked)

    def action_stop(self) -> None:
        self.stop_reply()

    def watch_show_sources(self, show: bool) -> None:
        for message in self.query(AssistantMessage):
            message.set_show_sources(show)
        self.hud.set_class(show, "-legend")

    def action_toggle_sources(self) -> None:
        self.show_sources = not self.show_sources

    def action_toggle_speculation(self) -> None:
        if self.backend is None:
            self.notice("No model is loaded yet.", severity="warning")
            return
        # F5 does what the HUD shows: it reads the engine's mode, so after an
        # automatic switch-off (the HUD says plain) the first press turns it on.
        was_on = self.backend.info.mode != "plain"
        try:
            self.backend.set_speculation(not was_on)
        except SpecChatError as exc:
            self.notice(str(exc), severity="error")
            return
        info = self.backend.info
        self.speculation_on = info.mode != "plain"
        self.hud.set_speculation(not (was_on and not self.speculation_on))  # "switched off by you"
        self.hud.set_engine(info, self.profile)
        self.hud.flush()
        if self.speculation_on:
            self.notice("Speculation on.")
        elif was_on:
            self.notice("Speculation off: plain decoding.")
        else:
            self.notice(f"Speculation cannot be switched on: {info.fallback_reason or 'no drafter is loaded'}.",
                        severity="warning")

    def on_unmount(self) -> None:
        self.stop_reply()
        with self._backend_lock:
            if self.backend is not None:
                try:
                    self.backend.close()
                except Exception:  # exiting anyway
                    pass
                self.backend = None
        if self.saver is not None:
            self.saver.close(SAVE_FLUSH_AT_EXIT_S)
        if self.history is not None:
            self.history.close()
