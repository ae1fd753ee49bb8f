"""specchat's terminal UI: chat with a speculative-decoding engine and watch it work.

The App is thin: the layout (a Header, the :class:`Conversation`, a Footer), the
keys and their order, and the screen stack. It owns two plain objects, the
:class:`EngineHost` (profiles and the loaded backend) and the :class:`Archive`
(history and saver), and hands them to the Conversation, which owns the chat.
Only the App opens dialogs; each takes its data in and answers with ``dismiss``.
What it does with the engine host (load, switch, stop a load) is mixed in from
:mod:`app.ui.engine_control`.
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

from app.store.saver import ChatCreated, HistoryLag, HistoryRescued
from app.store.state import last_theme, remember_theme, take_draft_for
from app.ui.archive import Archive
from app.ui.chat_dialogs import ask_edited_prompt, ask_sampling, ask_system_prompt
from app.ui.commands import ProfileCommands, unique_commands
from app.ui.early_stop import early_stop_driver
from app.ui.engine_control import EngineControl
from app.ui.export import ask_export, ask_export_screen
from app.ui.engine_host import EngineHost, ProfileChoice, Refusal
from app.ui.key_hold import KeyHold
from app.ui.labels import shown_title
from app.ui.keys import BINDINGS, EXTRA_COMMANDS, MAIN_SCREEN_ACTIONS, KeysFooter
from app.ui.loading import Loader
from app.ui.notices import notice
from app.ui.quitting import ExitOnSignals, ask_before_quit, close_down
from app.ui.resume import remember_open_chat, reopen_last
from app.ui.screens.chats import ChatsResult, ChatsScreen
from app.ui.screens.copy import CopyChoice, CopyScreen, copy_choices, last_code_block, last_reply
from app.ui.screens.dialog import AskDialog, Dialog
from app.ui.screens.help import HelpScreen
from app.ui.screens.profiles import ProfilePicker
from app.ui.terminal_safety import SafeTerminal
from app.ui.widgets.conversation import Conversation
from app.ui.widgets.prompt import PromptArea
from engine.text_safety import inert

if TYPE_CHECKING:
    from rich.console import RenderableType

    from engine.config.profiles import ModelProfile, Profiles


class SpecChatApp(SafeTerminal, EngineControl, App[None]):  # SafeTerminal: titles and pastes shown, never obeyed;
    # EngineControl: loading, switching and stopping profiles (app.ui.engine_control)
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
        self.conversation.before_send = self.drafter_current
        self.drafter_chats: set[int] = set()
        self.drafter_gone: set[int] = set()
        self.key_hold = KeyHold(super().on_event, self.call_later, self.set_timer)
        self.signals = ExitOnSignals(self, self.conversation, self.archive)
        """SIGTERM/SIGHUP exit as ctrl+q does, saving and restoring the terminal (app.ui.quitting)."""
        self.said_once: set[str] = set()
        """Warnings said once a session (an engine that writes no log: app.ui.engine_control)."""
        self.exit_note: str | None = None
        """A line for the terminal once the app is gone: where replies the history could not take went."""

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
        theme = last_theme()  # the theme chosen last (ctrl+p), as oterm's users expect after a restart
        if theme in self.available_themes:
            self.theme = theme
        self.theme_changed_signal.subscribe(self, lambda chosen: remember_theme(chosen.name))
        lag = self.archive.open(lambda text: self.post_message(HistoryLag(text)), self.post_message, self.post_message)
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
        draft = take_draft_for(self.conversation.chat_id)
        if draft is not None:
            self.conversation.prompt.restore(draft.text)
            elsewhere = draft.chat_id is not None and draft.chat_id != self.conversation.chat_id
            notice(self, f"The text you had not sent in “{shown_title(draft.title or '')}” (another chat) is back in "
                         "the prompt box." if elsewhere and draft.title else
                         "The text you had not sent when the app closed is back in the prompt box.")

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

    def on_chat_created(self, message: ChatCreated) -> None:
        """A new chat's first row is written: the window showing it holds it from now (a second
        window started during its first reply took it over)."""
        conversation = self.conversation
        if message.chat is conversation.chat_ref and not conversation.private and message.chat.id is not None:
            self.archive.open_chats.show(message.chat.id)
            self.drafter_chats.add(message.chat.id)  # its replies are remembered by a suffix drafter

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

        answering = engine.profile.name if engine.profile is not None and engine.backend_alive else None
        asked = engine.profile.name if engine.profile is not None else None  # loading, or its load stopped
        self.push_screen(ProfilePicker(engine.profiles, answering,  # "● current": loaded, not loading
                                       engine.unavailable_profiles(), engine.downloads(), highlight=asked), picked)

    def action_stop(self) -> None:
        """Esc: stop the reply; with none streaming, stop a profile's load (its downloads too)."""
        if self.conversation.generating:
            self.conversation.stop_reply()
            if self.conversation.stream.widget is not None:
                self.conversation.stream.widget.set_stopping()
        elif self.engine.stop_loading():
            notice(self, f"Stopping the load of {self.engine.profile.name if self.engine.profile else 'the profile'}…")

    def action_interrupt(self) -> None:
        """ctrl+c with nothing selected to copy: what Esc stops, stopped; with nothing to stop,
        Textual's word on how to quit (ctrl+c no longer quits a Textual app)."""
        if self.check_action("stop", ()):
            self.action_stop()
        else:
            self.action_help_quit()

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
        history = self.archive.history
        still = self.archive.db(history.recent_prompts) if history is not None else None
        self.conversation.forget_prompts(message.prompts, still or ())
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
        if self.conversation.when_free(self.action_edit_last_prompt, "ctrl+g opens the last prompt", load_too=False):
            return
        last = self.conversation.last_exchange()
        if last is not None:
            self.push_screen(*ask_edited_prompt(self.conversation, *last))

    def action_edit_system_prompt(self) -> None:
        self.push_screen(*ask_system_prompt(self.conversation))

    def action_sampling(self) -> None:
        """F10: the chat's temperature, top-p, top-k and seed (app.ui.sampling)."""
        self.push_screen(*ask_sampling(self.conversation))

    def action_export_chat(self) -> None:
        """F9: the chat to a Markdown file, from the history; from the screen where the history
        does not hold it all (a private chat, or replies it has not taken yet)."""
        conversation, history, saver = self.conversation, self.archive.history, self.archive.saver
        chat_id = conversation.chat_id
        on_screen = conversation.messages()
        tell = lambda text, severity: notice(self, text, severity=severity, title="Export")  # noqa: E731
        behind = saver is not None and saver.lagging and saver.unsaved() > 0
        if on_screen and (conversation.private or chat_id is None or history is None or behind):
            note = ("A private chat, never saved, exported from the screen" if conversation.private else
                    "Exported from the screen: the history had not taken all of it")
            title = conversation.title or ("private chat" if conversation.private else "chat")
            self.push_screen(*ask_export_screen(title, on_screen, note, tell))
            return
        if chat_id is None or history is None:
            notice(self, "Nothing to export yet.", severity="warning")
            return
        chat = self.archive.db(history.get_chat, chat_id)
        self.push_screen(*ask_export(history, chat_id, chat.title if chat else "chat", tell,
                                     saver.writing if saver is not None else tuple))

    # -- quitting (app.ui.quitting) --------------------------------------------------------

    async def action_quit(self) -> None:
        """ctrl+q: quit, unless the chat would be lost (history writes failing): then ask."""
        ask_before_quit(self, self.conversation, self.archive)

    def panic(self, *renderables: RenderableType) -> None:
        """An unexpected error outside a handler (Textual's input thread's) ends the app with status 1,
        as one inside a handler does: it exited 0, as if the user had quit."""
        self._return_code = 1
        super().panic(*renderables)

    def on_unmount(self) -> None:
        self.signals.closing()  # a signal while the close waits on a lock only arms the last resort
        self.exit_note = close_down(self.conversation, self.archive, self.engine)  # printed once the screen is back
        self.signals.remove()
