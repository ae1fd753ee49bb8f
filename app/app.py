"""specchat's terminal UI: chat with a speculative-decoding engine and watch it work.

Layout: the transcript and prompt box on the left, the HUD on the right, a
Footer with the main keys. Loading and generation run in thread workers; they
talk to the UI only through :mod:`app.messages`. Reply bookkeeping (streaming,
saving) lives in :class:`app.replies.ReplyMixin`; chat management (new, open,
rename, export) in :class:`app.chats.ChatMixin`.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header

from app.chats import ChatMixin
from app.commands import ProfileCommands, unique_commands
from app.conversation import profile_pair
from app.formatting import plan_lines
from app.history import History
from app.messages import EngineFailed, EngineReady, LoadProgress
from app.replies import SAVE_FLUSH_AT_EXIT_S, WRITE_EVERY_S, ReplyMixin
from app.saver import HistoryLag, HistorySaver
from app.screens.help import HelpScreen
from app.screens.profiles import ProfilePicker
from app.state import last_profile, remember_profile
from app.turns import TurnsMixin
from app.widgets.chat_view import AssistantMessage, ChatLog
from app.widgets.hud import Hud
from app.widgets.prompt import PromptArea
from engine.api import ChatBackend, ProgressFn
from engine.errors import SpecChatError

if TYPE_CHECKING:
    from engine.profiles import ModelProfile, Profiles

Loader = Callable[["ModelProfile", "int | None", ProgressFn], ChatBackend]
HUD_REFRESH_S = 0.25
ENGINE_LOG = "engine.log"


def default_loader(profile: "ModelProfile", memory_budget: int | None, progress: ProgressFn) -> ChatBackend:
    """Load the engine for real (seconds to minutes; runs in a worker thread).

    Local models load in a child process (:mod:`engine.child`): the decode loop
    then never waits for the UI's Python. Its output goes to ``engine.log`` in
    the user state dir. A server profile only talks HTTP and stays here."""
    from engine.hublog import hub_messages_as_progress
    from engine.loading import load_engine

    if profile.backend != "server":
        from engine.child import ProcessBackend
        from engine.paths import state_dir

        return ProcessBackend.start(profile, memory_budget, progress, log=state_dir() / ENGINE_LOG,
                                    threads=engine_threads())
    with hub_messages_as_progress(progress):  # hub retries as progress, not raw text over the screen
        return load_engine(profile, memory_budget=memory_budget, progress=progress)


def engine_threads() -> int | None:
    """Torch threads for the app's engine: ``SPECCHAT_THREADS``, else every core but one.

    The UI needs CPU while a reply streams (layout, Markdown, the terminal). On a
    small machine a decode step spread over every core waits for whichever core
    the UI holds: measured on 2 cores, the engine ran at 0.5-0.9x of its speed,
    varying run to run, where one thread ran a steady 0.8x of two threads alone.
    None (torch's default) on a single core."""
    import os

    if os.environ.get("SPECCHAT_THREADS"):
        return max(1, int(os.environ["SPECCHAT_THREADS"]))
    cores = os.cpu_count() or 1
    return cores - 1 if cores > 1 else None


def needs_room(exc: BaseException) -> bool:
    """True when a load failed for lack of memory (planned, or a real out-of-memory error)."""
    from engine.device import Device
    from engine.errors import MemoryPlanError

    return isinstance(exc, MemoryPlanError) or Device.is_out_of_memory(exc)


def error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, SpecChatError) else f"{type(exc).__name__}: {exc}"


class SpecChatApp(ReplyMixin, ChatMixin, TurnsMixin, App[None]):
    """The chat app. ``loader`` and ``profiles_loader`` are injectable for tests."""

    CSS_PATH = "specchat.tcss"
    TITLE = "specchat"
    COMMANDS = App.COMMANDS | {ProfileCommands}
    BINDINGS = [
        Binding("escape", "stop", "Stop", tooltip="stop the reply, keeping what was written"),
        Binding("f1", "help", "Help"),
        Binding("f2", "pick_profile", "Profile"),
        Binding("f3", "chats", "Chats"),
        Binding("f4,ctrl+t", "toggle_sources", "Colours",
                tooltip="colour each token: draft accepted vs target produced"),
        Binding("f5", "toggle_speculation", "Spec on/off", key_display="f5"),
        # F6 and F7 are the prompt box's select-line/select-all too: priority makes them the app's.
        Binding("f6", "toggle_hud", "HUD", priority=True, tooltip="the side panel, or one status line"),
        Binding("f7", "copy", "Copy", priority=True, tooltip="the last reply, a message or a code block"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("ctrl+r", "regenerate", "Regenerate", show=False,
                tooltip="answer the last prompt again (the earlier reply stays)"),
        Binding("ctrl+g", "edit_last_prompt", "Edit last prompt", show=False,
                tooltip="change the last prompt and ask again (the earlier exchange stays)"),
        Binding("f8", "edit_system_prompt", "System prompt", show=False),
        Binding("f9", "export_chat", "Export", show=False, tooltip="the chat as Markdown with its statistics"),
    ]
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
    def hud(self) -> Hud:
        return self.screen_stack[0].query_one(Hud)

    @property
    def chat_log(self) -> ChatLog:
        return self.screen_stack[0].query_one(ChatLog)

    @property
    def prompt(self) -> PromptArea:
        return self.screen_stack[0].query_one(PromptArea)

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

    # -- loading ----------------------------------------------------------------

    def switch_profile(self, name: str) -> None:
        """Load profile ``name`` in place of the current pair; the conversation continues.

        A profile that cannot run here (see :mod:`engine.availability`) is refused
        with its reason, and the loaded models stay.
        """
        if self.profiles is None:
            self.notice("No profiles are available.", severity="warning")
            return
        if self.loading:
            self.notice("A profile is still loading; try again when it is ready.", severity="warning")
            return
        try:
            profile = self.profiles.get(name)
        except SpecChatError as exc:
            self.notice(str(exc), severity="error", title="Profile")
            return
        why_not = self.unavailable_profiles().get(profile.name)
        if why_not:
            self.notice(f"{profile.name} cannot run here: {why_not}.", severity="warning", title="Profile unavailable")
            return
        if self.profile is not None and profile.name == self.profile.name and self.backend is not None:
            self.notice(f"{name} is already loaded.")
            return
        self.stop_reply()
        self._start_load(profile)

    def unavailable_profiles(self) -> dict[str, str]:
        """Profile name -> why it cannot run on this machine (CUDA checked once)."""
        if self.profiles is None:
            return {}
        from engine.availability import cuda_present, unavailable_reason

        if self._cuda is None:
            self._cuda = cuda_present()
        reasons = {name: unavailable_reason(self.profiles.get(name), cuda=self._cuda) for name in self.profiles.names()}
        return {name: why for name, why in reasons.items() if why}

    def _start_load(self, profile: "ModelProfile") -> None:
        old, self.backend = self.backend, None
        old_profile = self.profile if old is not None else None
        self.profile = profile
        self.loading = True
        self.sub_title = f"{profile.name} · {profile_pair(profile)}"
        self.hud.set_engine(None, profile)
        self.hud.set_loading(profile.name, f"loading; {old_profile.name} stays until it is ready"
                             if old_profile else "starting", None)
        self.hud.flush()
        self._load_worker(profile, old, old_profile)

    @work(thread=True, group="load", exit_on_error=False)
    def _load_worker(self, profile: "ModelProfile", old: ChatBackend | None,
                     old_profile: "ModelProfile | None" = None) -> None:
        """Load ``profile`` next to the old backend, closing the old one once the new is ready.

        When the new one does not fit next to the old (the memory plan says so,
        or loading runs out of memory), the old one is closed first and the new
        one tried again; if that fails too the old profile is loaded again. Any
        other failure leaves the old backend as it was. Never ends with no model
        unless even reloading the old profile fails (then the notice says so).
        """

        def progress(stage: str, fraction: float | None) -> None:
            self.post_message(LoadProgress(stage, fraction))

        def close(backend: ChatBackend) -> None:
            try:
                backend.close()
            except Exception as exc:  # closing must not block loading the next one
                progress(f"previous models closed with an error: {exc}", None)

        with self._backend_lock:  # taken once any reply on the old backend has stopped
            try:
                backend = self._loader(profile, self._memory_budget, progress)
            except Exception as exc:  # noqa: BLE001 - every failure is reported, none is a traceback
                error = error_text(exc)
                if old is None or old_profile is None:
                    self.post_message(EngineFailed(error, profile.name))
                    return
                if not needs_room(exc):
                    self.post_message(EngineFailed(error, profile.name, (old, old_profile)))
                    return
                progress(f"{profile.name} does not fit next to {old_profile.name}: unloading it first", None)
                close(old)
                try:
                    backend = self._loader(profile, self._memory_budget, progress)
                except Exception as again:  # noqa: BLE001
                    error = error_text(again)
                    progress(f"loading {old_profile.name} again", None)
                    try:
                        restored = self._loader(old_profile, self._memory_budget, progress)
                    except Exception as lost:  # noqa: BLE001
                        self.post_message(EngineFailed(
                            f"{error}. Reloading {old_profile.name} failed too: {error_text(lost)}", profile.name))
                        return
                    self.post_message(EngineFailed(error, profile.name, (restored, old_profile)))
                    return
            else:
                if old is not None:
                    close(old)
        self.post_message(EngineReady(backend, profile))

    def on_load_progress(self, message: LoadProgress) -> None:
        if self.loading:
            self.hud.set_loading(None, message.stage, message.fraction)

    def on_engine_ready(self, message: EngineReady) -> None:
        self.loading = False
        self.backend = message.backend
        self.profile = message.profile
        self.speculation_on = True
        info = message.backend.info
        self.hud.set_speculation(True)
        self.hud.set_notice(None)
        self.hud.set_engine(info, message.profile)
        self.hud.flush()
        self.chat_profile_changed(message.profile.name)
        if self.profiles is not None and message.profile.name in self.profiles.names():
            remember_profile(message.profile.name)  # not a --target/--server pair made on the fly
        summary = plan_lines(info.plan)
        self.notice(f"{message.profile.name} ready" + (f": {summary[0]}" if summary else "."), title="Loaded")
        if info.fallback_reason:
            self.notice(f"Running without the draft model: {info.fallback_reason}", severity="warning",
                        title="Draft refused")
        self.send_queued()

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.loading = False
        title = f"Could not load {message.profile_name or 'profile'}"
        if message.restored is not None:
            backend, profile = message.restored
            self.backend, self.profile = backend, profile
            self.sub_title = f"{profile.name} · {profile_pair(profile)}"
            self.hud.set_engine(backend.info, profile)
            self.hud.flush()
            self.notice(f"{message.error}\nStill using {profile.name}; F2 picks another profile.",
                        severity="error", title=title)
        else:
            self.hud.set_error(message.error)
            self.hud.flush()
            self.notice(f"{message.error}\nNo model is loaded: F2 picks another profile.", severity="error",
                        title=title)
        waiting = self.drop_queued()
        if waiting:
            self.prompt.restore("\n".join(waiting))

    # -- actions ------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.generating and len(self.screen_stack) == 1
        return True

    def get_system_commands(self, screen: Screen[Any]) -> Any:
        yield from unique_commands(self, super().get_system_commands(screen))

    def action_help(self) -> None:
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
