"""specchat's terminal UI: chat with a speculative-decoding engine and watch it work.

The App is thin: the layout (a Header, the :class:`Conversation`, a Footer), the
keys and their order, and the screen stack. It owns two plain objects, the
:class:`EngineHost` (profiles and the loaded backend) and the :class:`Archive`
(history and saver), and hands them to the Conversation, which owns the chat.
Only the App opens dialogs; each takes its data in and answers with ``dismiss``.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import events
from textual.app import App, ComposeResult
from textual.driver import Driver
from textual.screen import Screen
from textual.widgets import Header

from app.store.saver import HistoryLag, HistoryRescued
from app.store.state import remember_draft, take_draft
from app.ui.archive import Archive
from app.ui.chat_dialogs import ask_edited_prompt, ask_sampling, ask_system_prompt
from app.ui.commands import ProfileCommands, unique_commands
from app.ui.early_stop import early_stop_driver
from app.ui.export import ask_export
from app.ui.engine_host import DRAFTING_CHARS, EngineHost, ProfileChoice, Refusal
from app.ui.formatting import plan_lines
from app.ui.key_hold import KeyHold
from app.ui.keys import BINDINGS, EXTRA_COMMANDS, MAIN_SCREEN_ACTIONS, KeysFooter
from app.ui.labels import header_title
from app.ui.loading import Loader
from app.ui.messages import EngineFailed, EngineReady, LoadProgress, ReplyFinished
from app.ui.notices import notice
from app.ui.quitting import ExitOnSignals, ask_before_quit
from app.ui.resume import remember_open_chat, reopen_last
from app.ui.screens.chats import ChatsResult, ChatsScreen
from app.ui.screens.copy import CopyChoice, CopyScreen, copy_choices, last_code_block, last_reply
from app.ui.screens.dialog import AskDialog, Dialog
from app.ui.screens.edit import ConfirmScreen
from app.ui.screens.help import HelpScreen
from app.ui.screens.profiles import ProfilePicker
from app.ui.terminal_safety import SafeTerminal
from app.ui.widgets.conversation import Conversation
from app.ui.widgets.prompt import PromptArea
from engine.errors import SpecChatError
from engine.text_safety import inert

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile, Profiles


class SpecChatApp(SafeTerminal, App[None]):  # SafeTerminal: titles and pastes shown, never obeyed
    """The chat app. ``loader`` and ``profiles_loader`` are injectable for tests."""

    CSS_PATH = "specchat.tcss"
    TITLE = "specchat"
    COMMANDS = App.COMMANDS | {ProfileCommands}
    BINDINGS = BINDINGS
    _MAIN_SCREEN_ACTIONS = MAIN_SCREEN_ACTIONS
    EXTRA_COMMANDS = EXTRA_COMMANDS

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
        self.engine = EngineHost(ProfileChoice(profile, models_file, target, draft, server_profile),
                                 memory_budget=memory_budget, loader=loader, profiles_loader=profiles_loader)
        self.archive = Archive(lambda text: notice(self, text, severity="error", title="History"))
        self.conversation = Conversation(self.engine, self.archive, id="main")
        self.key_hold = KeyHold(super().on_event, self.call_later, self.set_timer)
        self.signals = ExitOnSignals(self, self.conversation, self.archive)
        """SIGTERM/SIGHUP exit as ctrl+q does, saving and restoring the terminal (app.ui.quitting)."""

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded and self.key_hold.take(event):
            return  # a dialog is answering: the key waits its turn (app.ui.key_hold)
        await super().on_event(event)

    def compose(self) -> ComposeResult:
        yield Header(icon="≫")
        yield self.conversation
        # compact, and no palette hint (F1's first line names ctrl+p): every key fits in 80 columns
        yield KeysFooter(compact=True, show_command_palette=False)

    async def on_mount(self) -> None:
        lag = self.archive.open(lambda text: self.post_message(HistoryLag(text)), self.post_message)
        if lag:
            notice(self, lag, severity="error", title="History")
        history = self.archive.history
        self.conversation.start((self.archive.db(history.recent_prompts) if history else None) or [])
        self.conversation.fit_hud(self.size.width)
        self.signals.install()
        first = None
        for step in (self.engine.read_profiles(), self.engine.initial_profile()):
            if isinstance(step, Refusal):
                notice(self, step.text, severity=step.severity, title=step.title)
            else:
                first = step or first
        start = await reopen_last(self.conversation, first)  # the chat used last, with its profile
        if start.profile is None:
            self.conversation.hud.set_error("no profile loaded — F2 to pick one")
        else:
            self._start_load(start.profile)
        self.sub_title = start.title or self.sub_title
        if start.notice:
            notice(self, start.notice)
        draft = take_draft()
        if draft:
            self.conversation.prompt.restore(draft)
            notice(self, "The text you had not sent when the app closed is back in the prompt box.")

    # -- keys and screens ---------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.can_stop() or (self.engine.loading and not self.dialog_open())
        if action in self._MAIN_SCREEN_ACTIONS and self.dialog_open():
            # A dialog is open: its keys are its own (F1 closes the help it opened).
            return action == "help" and isinstance(self.screen, HelpScreen)
        return True

    def can_stop(self) -> bool:
        """Esc stops the reply: one streams and no dialog is open (safe from any thread)."""
        return self.conversation.generating and len(self.screen_stack) == 1

    def get_driver_class(self) -> type[Driver]:
        return early_stop_driver(super().get_driver_class(), self._stop_early, esc_prefix=self.dialog_open,
                                 on_input=lambda: self.engine.yield_to_ui())

    def dialog_open(self) -> bool:
        """A dialog is over the chat (safe from any thread): Alt+letter is read as Esc, letter."""
        return len(self.screen_stack) > 1

    def _stop_early(self) -> None:
        """Esc, seen on the terminal's input thread (app.ui.early_stop)."""
        if self.can_stop():
            self.conversation.stop_reply()
            self.engine.interrupt()  # the engine stops now, not when the UI's reply worker next runs

    def get_system_commands(self, screen: Screen[Any]) -> Any:
        yield from unique_commands(self, super().get_system_commands(screen))

    def push_screen(self, screen: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(screen, Dialog):  # keys typed after F9 (say) are the dialog's: app.ui.screens.dialog
            screen.hold_keys_until_ready(self.key_hold.hold())
        return super().push_screen(screen, *args, **kwargs)

    def on_ask_dialog(self, message: AskDialog) -> None:
        """A dialog asks for another over it (rename from the chats list): only the App opens screens."""
        self.push_screen(message.dialog, message.answered)

    def on_resize(self, event: events.Resize) -> None:
        self.conversation.fit_hud(event.size.width)

    def on_history_lag(self, message: HistoryLag) -> None:
        """The saver is behind (a lock elsewhere) or has caught up: say so."""
        if message.notice is not None:
            notice(self, message.notice, severity="warning", title="History not saved yet", timeout=30)
        else:
            notice(self, "The history database is free again: everything is saved.", title="History saved")

    def on_history_rescued(self, message: HistoryRescued) -> None:
        """The open chat was deleted in another window: what was unsaved went to a new chat."""
        if self.conversation.chat_id == message.chat_id:
            self.sub_title = message.title
        notice(self, message.notice, severity="warning", title="Chat deleted elsewhere", timeout=30)

    # -- actions --------------------------------------------------------------------------

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):  # F1 is a priority key: it closes the help it opened
            self.screen.dismiss(None)
            return
        self.push_screen(HelpScreen([("App", list(self.BINDINGS)),
                                     ("Prompt box", [*PromptArea.BINDINGS, *PromptArea.HELP_ONLY])]))

    def action_pick_profile(self) -> None:
        engine = self.engine
        if engine.profiles is None:
            notice(self, "No profiles file could be read; start with --target to chat.", severity="warning")
            return

        def picked(name: str | None) -> None:
            if name:
                self.switch_profile(name)

        self.push_screen(ProfilePicker(engine.profiles, engine.profile.name if engine.profile else None,
                                       engine.unavailable_profiles(), engine.downloads()), picked)

    def action_stop(self) -> None:
        """Esc: stop the reply; with none streaming, stop a profile's load (its downloads too)."""
        if self.conversation.generating:
            self.conversation.stop_reply()
        elif self.engine.stop_loading():
            notice(self, f"Stopping the load of {self.engine.profile.name if self.engine.profile else 'the profile'}…")

    def action_toggle_sources(self) -> None:
        self.conversation.show_sources = not self.conversation.show_sources

    def action_toggle_hud(self) -> None:
        self.conversation.toggle_hud(self.size.width)

    async def action_new_chat(self, private: bool = False) -> None:
        await self.conversation.new_chat(private=private)
        self.sub_title = self._header(self.engine.profile)

    def action_regenerate(self) -> None:
        self.conversation.regenerate()

    def action_chats(self) -> None:
        async def done(result: ChatsResult | None) -> None:
            if result is not None and result[0] == "open" and result[1] is not None:
                await self.open_chat(result[1])
            elif result is not None and result[0] == "new":
                await self.action_new_chat()

        self.push_screen(ChatsScreen(self.archive, self.conversation.chat_id), done)

    def on_chats_screen_renamed(self, message: ChatsScreen.Renamed) -> None:
        if self.conversation.retitle(message.chat_id, message.title):
            self.sub_title = message.title

    async def on_chats_screen_deleted(self, message: ChatsScreen.Deleted) -> None:
        if await self.conversation.chat_deleted(message.chat_id):
            self.sub_title = self._header(self.engine.profile)
        self._teach_drafter()  # what was deleted can no longer be proposed

    async def open_chat(self, chat_id: int) -> None:
        """Show a saved chat and continue it with its own profile when that can be had."""
        chat = await self.conversation.open_chat(chat_id)
        if chat is None:
            return
        remember_open_chat(self.conversation)
        self.sub_title = chat.title
        current = self.engine.profile
        if chat.profile and current is not None and chat.profile != current.name:
            if self.engine.profiles is not None and chat.profile in self.engine.profiles.names():
                notice(self, f"This chat continues with its own profile, {chat.profile}.")
                self.switch_profile(chat.profile)
            else:
                notice(self, f"This chat was with {chat.profile}, which is not available; it continues with "
                             f"{current.name} (F2 switches).")

    def action_copy(self) -> None:
        """Pick a message or code block to copy."""
        choices = copy_choices(self.conversation.messages())
        if not choices:
            notice(self, "Nothing to copy yet.", severity="warning")
            return

        def picked(choice: CopyChoice | None) -> None:
            if choice is not None:
                self.copy_text(choice.text, choice.label.split(" · ")[0].lower())

        self.push_screen(CopyScreen(choices), picked)

    def copy_text(self, text: str, what: str) -> None:
        """Send ``text`` as it is shown (:func:`~engine.text_safety.inert`: control characters as
        their stand-ins, so a reply cannot carry an escape sequence into the shell it is pasted
        in) to the terminal's clipboard (OSC 52) and to the desktop's where a tool is at hand
        (:mod:`app.ui.clipboard`); say "Copied" only where one took it."""
        from app.ui.clipboard import desktop_copy, sent_notice

        shown = inert(text)
        if shown != text:
            notice(self, "It held control characters (an escape sequence can run commands where it is pasted): "
                         "they are copied as the stand-ins shown on screen.", severity="warning", title="Copied as shown")
        text = shown
        self.copy_to_clipboard(text)
        lines = len(text.splitlines())  # a final newline ends the last line; it starts none
        size = f"{len(text):,} characters, {lines} line{'s' if lines != 1 else ''}"
        tool = desktop_copy(text)
        if tool is not None:
            notice(self, f"Copied {what}: {size} ({tool}).", title="Copied")
        else:
            notice(self, sent_notice(what, size), title="Sent to the terminal", timeout=8)

    def action_copy_last_reply(self) -> None:
        text = last_reply(self.conversation.messages())
        if text is None:
            notice(self, "No reply to copy yet.", severity="warning")
        else:
            self.copy_text(text, "the last reply")

    def action_copy_last_code(self) -> None:
        code = last_code_block(self.conversation.messages())
        if code is None:
            notice(self, "No code block in the replies yet.", severity="warning")
        else:
            self.copy_text(code, "the last code block")

    def action_edit_last_prompt(self) -> None:
        """Edit the last prompt and ask it again; the earlier exchange stays (dimmed)."""
        last = self.conversation.last_exchange()
        if last is not None:
            self.push_screen(*ask_edited_prompt(self.conversation, *last))

    def action_edit_system_prompt(self) -> None:
        self.push_screen(*ask_system_prompt(self.conversation))

    def action_sampling(self) -> None:
        """F10: the chat's temperature, top-p, top-k and seed (app.ui.sampling)."""
        self.push_screen(*ask_sampling(self.conversation))

    def action_export_chat(self) -> None:
        chat_id = self.conversation.chat_id
        if chat_id is None:
            notice(self, "Nothing to export yet.", severity="warning")
            return
        history = self.archive.history
        chat = self.archive.db(history.get_chat, chat_id) if history is not None else None
        if history is not None:
            self.push_screen(*ask_export(history, chat_id, chat.title if chat else "chat",
                                         lambda text, severity: notice(self, text, severity=severity, title="Export")))

    # -- quitting (app.ui.quitting) --------------------------------------------------------

    async def action_quit(self) -> None:
        """ctrl+q: quit, unless the chat would be lost (history writes failing): then ask."""
        ask_before_quit(self, self.conversation, self.archive)

    # -- the engine -----------------------------------------------------------------------

    def action_toggle_speculation(self) -> None:
        if self.engine.backend is None:
            notice(self, "No model is loaded yet.", severity="warning")
            return
        try:
            was_on, info = self.engine.toggle_speculation()
        except SpecChatError as exc:
            notice(self, str(exc), severity="error")
            return
        on = self.engine.speculation_on
        self.conversation.hud.set_speculation(not (was_on and not on))  # "switched off by you"
        if self.engine.profile is not None:
            self.conversation.hud.show_engine(info, self.engine.profile)
        text, severity = self.engine.toggle_words(info)
        notice(self, text, severity=severity)

    def switch_profile(self, name: str, *, download_asked: bool = False) -> None:
        """Load profile ``name`` in place of the current pair; the conversation continues.

        A profile that cannot run here (see :mod:`engine.load.availability`) is refused
        with its reason, and the loaded models stay. One whose models are not in the cache
        asks first, saying how much it downloads (Esc stops the download later too). A
        reply streaming is stopped, and said to be.
        """
        target = self.engine.switch_target(name)
        if isinstance(target, Refusal):
            notice(self, target.text, severity=target.severity, title=target.title)
            return
        download = None if download_asked else self.engine.downloads().get(target.name)
        if download is not None:
            def answered(yes: bool | None) -> None:
                if yes:
                    self.switch_profile(name, download_asked=True)

            self.push_screen(ConfirmScreen(f"{target.name}'s first use downloads {download}. Download it now?",
                                           enter_confirms=True,
                                           hint="y or Enter downloads (Esc stops it later too) · n or Esc cancels"),
                             answered)
            return
        if self.conversation.generating:
            notice(self, f"Stopped the reply to load {target.name}; ctrl+r asks again once it is ready.")
        self.conversation.stop_reply()
        self._start_load(target)

    def on_reply_finished(self, message: ReplyFinished) -> None:
        """The engine's process ended under a reply (killed, crashed): load its profile again at
        once; the chat stays, and a prompt sent meanwhile waits for the model as at start-up."""
        profile = self.engine.profile
        if not message.engine_died or profile is None or self.engine.loading or self.engine.backend_alive:
            return
        notice(self, f"Loading {profile.name} again; ctrl+r asks the last prompt again once it is ready.",
               title="Engine stopped")
        self._start_load(profile)

    def _header(self, profile: "ModelProfile | None") -> str:
        """The header's second part: the open chat's title, else the profile and its models (the
        HUD names the profile either way)."""
        if self.conversation.title and not self.conversation.private:
            return self.conversation.title
        return header_title(profile, self.conversation.private)

    def _start_load(self, profile: "ModelProfile") -> None:
        old, old_profile = self.engine.begin_load(profile)
        self.sub_title = self._header(profile)
        self.conversation.hud.show_loading(profile, old_profile.name if old_profile else None)
        self.conversation.model_state(profile.name)

        def progress(stage: str, fraction: float | None) -> None:
            self.post_message(LoadProgress(stage, fraction))

        def load() -> None:
            self.post_message(self.engine.load(profile, old, old_profile, progress))

        self.run_worker(load, thread=True, group="load", exit_on_error=False)

    def on_load_progress(self, message: LoadProgress) -> None:
        if self.engine.loading and self.screen_stack:
            self.conversation.hud.set_loading(None, message.stage, message.fraction)

    def on_engine_ready(self, message: EngineReady) -> None:
        from engine.child.backend import ProcessBackend
        from engine.child.launcher import lower_priority_except_launcher
        from app.ui.loading import key_threads, ui_nice

        if not self.screen_stack:  # loaded while the app was closing: nobody will use it
            message.backend.close()
            return
        if isinstance(message.backend, ProcessBackend) and ui_nice() > 0:
            lower_priority_except_launcher(ui_nice(), keep=key_threads())  # the engine first (see UI_NICE)
        self.engine.ready(message.backend, message.profile)
        info = message.backend.info
        self.conversation.hud.show_engine(info, message.profile, fresh=True)
        self.conversation.model_state(None)
        self.conversation.profile_changed(message.profile.name)
        self._teach_drafter()
        summary = plan_lines(info.plan)
        notice(self, f"{message.profile.name} ready" + (f": {summary[0]}" if summary else "."), title="Loaded")
        if info.fallback_reason:
            notice(self, f"Running without the draft model: {info.fallback_reason}", severity="warning",
                   title="Draft refused")
        self.conversation.send_queued()

    def _teach_drafter(self) -> None:
        """A suffix-drafting profile drafts from earlier chats: hand it the history as it is now
        (read here, where the database lives; tokenized and indexed in a worker)."""
        history = self.archive.history
        if self.engine.drafts_from_history and history is not None:
            texts = self.archive.db(history.drafting_texts, DRAFTING_CHARS) or []

            def learn() -> None:
                failed = self.engine.learn(texts)
                if failed:
                    self.call_from_thread(notice, self, failed, severity="warning", title="Suffix drafter")

            self.run_worker(learn, thread=True, group="learn", exit_on_error=False)

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.engine.failed(message.restored)
        if not self.screen_stack:
            return
        title = "Loading stopped" if message.stopped else f"Could not load {message.profile_name or 'profile'}"
        severity = "information" if message.stopped else "error"
        self.conversation.model_state(None, loaded=message.restored is not None)
        if message.restored is not None:
            backend, profile = message.restored
            self.sub_title = self._header(profile)
            self.conversation.hud.show_engine(backend.info, profile)
            notice(self, f"{message.error}\nStill using {profile.name}; F2 picks another profile.",
                   severity=severity, title=title)
        else:
            self.conversation.hud.show_failed(message.error)
            notice(self, f"{message.error}\nNo model is loaded: F2 picks another profile.", severity=severity,
                   title=title)
        waiting = self.conversation.drop_queued()
        if waiting:
            notice(self, f"{'Your prompt' if waiting == 1 else f'Your {waiting} prompts'} waiting for "
                         f"{message.profile_name or 'the model'} {'is' if waiting == 1 else 'are'} back in the box, "
                         "not sent.", severity="warning")

    def on_unmount(self) -> None:
        self.signals.remove()
        self.conversation.stop_reply()
        self.engine.close()
        self.archive.close()  # the saver has written the open chat's rows: it has its id now
        remember_open_chat(self.conversation)
        if not self.conversation.private:  # unsent text comes back at the next start; a private chat's never
            remember_draft(self.conversation.prompt.text)
