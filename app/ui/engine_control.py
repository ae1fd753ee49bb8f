"""The App's side of the engine: loading a profile, switching, stopping a load, and the answers.

Mixed into :class:`app.ui.app.SpecChatApp` (Textual finds message handlers through the
class's bases): the App stays the layout, the keys and the screens, and this is what it
does with the :class:`~app.ui.engine_host.EngineHost` it owns. A load runs in a worker
thread (:meth:`EngineHost.load`) and answers with :class:`EngineReady` or
:class:`EngineFailed`; Esc stops one (:meth:`EngineHost.stop_loading`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.store.history import DRAFTING_CHARS
from app.ui.engine_host import EngineHost, Refusal
from app.ui.formatting import plan_lines
from app.ui.labels import dropped_drafter, header_title
from app.ui.messages import EngineEnded, EngineFailed, EngineReady, LoadProgress, ReplyFinished
from app.ui.notices import notice
from app.ui.screens.edit import ConfirmScreen
from app.store.history import HistoryError
from engine.errors import SpecChatError

if TYPE_CHECKING:
    from app.ui.archive import Archive
    from app.ui.widgets.conversation import Conversation
    from engine.config.profiles import ModelProfile


class EngineControl:
    """Mixed into the App: what it does with its engine host (see the module's docstring)."""

    engine: EngineHost
    conversation: "Conversation"
    archive: "Archive"
    drafter_chats: set[int]
    """The chats whose messages the suffix drafter holds (taught, or its replies remembered)."""
    drafter_gone: set[int]
    """Chats found deleted elsewhere once (an open chat keeps its id until its rescue is written)."""
    sub_title: str
    said_once: set[str]
    screen_stack: list[Any]

    def action_toggle_speculation(self) -> None:
        if self.engine.backend is None:
            loading = self.engine.profile.name if self.engine.loading and self.engine.profile else None
            notice(self, f"{loading} is loading: F5 switches speculation once it is ready." if loading
                   else "No model is loaded yet.", severity="warning")
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
        download = None if download_asked else self.engine.download_of(target)
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

    def on_engine_ended(self, message: EngineEnded) -> None:
        """The engine's process ended with no reply streaming (killed, crashed while idle): load
        its profile again at once, as after a death under a reply, so the next prompt waits for
        the model instead of failing. Ignored for a backend the app let go of itself."""
        profile = self.engine.profile
        if (message.backend is not self.engine.backend or profile is None or self.engine.loading
                or self.conversation.generating or not self.screen_stack):
            return  # closed on purpose, or a reply's end reports it (on_reply_finished)
        notice(self, f"The engine stopped; loading {profile.name} again.", title="Engine stopped")
        self._start_load(profile)

    def _header(self, profile: "ModelProfile | None") -> str:
        """The header's second part: the open chat's title, else the profile and its models as
        loaded (the HUD names the profile either way): a draft dropped for memory was still named."""
        if self.conversation.title and not self.conversation.private:
            return self.conversation.title
        backend = self.engine.backend
        loaded = backend.info if backend is not None and profile is self.engine.profile else None
        return header_title(profile, self.conversation.private, dropped_for=dropped_drafter(profile, loaded))

    def _start_load(self, profile: "ModelProfile") -> None:
        old, old_profile = self.engine.begin_load(profile)
        self.sub_title = self._header(profile)
        self.conversation.hud.show_loading(profile, old_profile.name if old_profile else None)
        self.conversation.model_state(profile.name)
        self.refresh_bindings()  # Esc stops the load now: the footer says so (and stops saying it after)

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
        if isinstance(message.backend, ProcessBackend):
            if ui_nice() > 0:
                lower_priority_except_launcher(ui_nice(), keep=key_threads())  # the engine first (see UI_NICE)
            backend = message.backend
            backend.when_it_ends(lambda: self.post_message(EngineEnded(backend)))
        self.engine.ready(message.backend, message.profile)
        self.sub_title = self._header(message.profile)  # as loaded: a draft dropped is not named
        self.refresh_bindings()
        info = message.backend.info
        self.conversation.hud.show_engine(info, message.profile, fresh=True)
        if self.engine.off_by_user:
            self.conversation.hud.set_speculation(False)  # "switched off by you", kept through the load
            self.conversation.hud.flush()
        self.conversation.model_state(None)
        self.conversation.profile_changed(message.profile.name)
        self._teach_drafter()
        summary = plan_lines(info.plan)
        notice(self, f"{message.profile.name} ready" + (f": {summary[0]}" if summary else "."), title="Loaded")
        log_note = getattr(message.backend, "log_note", None)  # a child that can write no log (engine.child.backend)
        if log_note and log_note not in self.said_once:  # once a session, not at every load and reload
            self.said_once.add(log_note)
            notice(self, log_note, severity="warning", title="Engine log")
        if info.fallback_reason:  # a drop (a switch is info.off_reason)
            notice(self, f"Running without the draft model: {info.fallback_reason}", severity="warning",
                   title="Draft refused")
        if self.engine.off_by_user:
            notice(self, "Speculation stays off, as you set it with F5: plain decoding until you press F5 again.")
        self.conversation.run_after_reply()  # ctrl+r pressed while it loaded, before prompts queued after it
        self.conversation.send_queued()

    def _teach_drafter(self) -> None:
        """A suffix-drafting profile drafts from earlier chats: hand it the history as it is now,
        read, tokenized and indexed in a worker (read on the UI's thread, a history another program
        held locked froze the app for the lock's 5 s at every load). A history that cannot be read
        teaches it nothing, and says so."""
        history = self.archive.history
        if not self.engine.drafts_from_history or history is None:
            return

        def learn() -> None:
            try:
                texts, chats = history.drafting_texts(DRAFTING_CHARS), history.chat_ids()
            except HistoryError as exc:
                texts, chats = [], set()
                self.call_from_thread(notice, self, f"Drafting from nothing: the earlier chats could not be read "
                                                    f"({exc}).", severity="warning", title="Suffix drafter")
            self.call_from_thread(setattr, self, "drafter_chats", chats)
            failed = self.engine.learn(texts)
            if failed:
                self.call_from_thread(notice, self, failed, severity="warning", title="Suffix drafter")

        self.run_worker(learn, thread=True, group="learn", exit_on_error=False)

    def drafter_current(self) -> None:
        """As a prompt goes out: a chat the drafter learned from, deleted in another window since,
        has it taught the history again (it was proposed, marked "from earlier chats", until the next
        load). The chats' ids are read in a worker (a read on the UI's thread waited out a lock's
        5 s with every Enter: a review's); a chat found gone is not counted again."""
        history = self.archive.history
        if not self.engine.drafts_from_history or history is None:
            return
        chat_id = self.conversation.chat_id
        if chat_id is not None and not self.conversation.private and chat_id not in self.drafter_gone:
            self.drafter_chats.add(chat_id)  # its replies so far were remembered
        known = set(self.drafter_chats)
        if not known:
            return

        def check() -> None:
            try:
                gone = known - history.chat_ids()
            except HistoryError:
                return  # looked at again with the next prompt
            if gone:
                self.call_from_thread(self._relearn_without, gone)

        self.run_worker(check, thread=True, group="drafter-check", exclusive=True, exit_on_error=False)

    def _relearn_without(self, gone: set[int]) -> None:
        """Chats the drafter held were deleted elsewhere: teach it the history as it is now."""
        self.drafter_gone |= gone
        self._teach_drafter()

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.engine.failed(message.restored)
        if self.conversation.after_reply:  # ctrl+r kept for the model that did not load: said, not dropped silently
            self.conversation.after_reply = []
            notice(self, "ctrl+r was not run: the model it waited for did not load.", severity="warning")
        if not self.screen_stack:
            return
        self.refresh_bindings()
        title = "Loading stopped" if message.stopped else f"Could not load {message.profile_name or 'profile'}"
        severity = "information" if message.stopped else "error"
        self.conversation.model_state(None, loaded=message.restored is not None)
        if message.restored is not None and not self.engine.backend_alive:
            # the pair kept through the load had died meanwhile (its death was not this app's to
            # hear while a load replaced it): load it again, as after a death while idle
            profile = message.restored[1]
            notice(self, f"{message.error}\nThe engine of {profile.name} had stopped meanwhile; loading it again.",
                   severity=severity, title=title)
            self._queued_back(message.profile_name)
            self._start_load(profile)
            return
        if message.restored is not None:
            backend, profile = message.restored
            self.sub_title = self._header(profile)
            self.conversation.hud.show_engine(backend.info, profile)
            notice(self, f"{message.error}\nStill using {profile.name}; F2 picks another profile.",
                   severity=severity, title=title)
        else:
            self.conversation.hud.show_failed(message.error)
            again = f"F2 loads {message.profile_name} again or picks" if message.profile_name else "F2 picks"
            notice(self, f"{message.error}\nNo model is loaded: {again} another profile.", severity=severity,
                   title=title)
        self._queued_back(message.profile_name)

    def _queued_back(self, profile_name: str | None) -> None:
        """Prompts queued for a load that failed go back to the prompt box, not sent, and are said to."""
        waiting = self.conversation.drop_queued()
        if waiting:
            notice(self, f"{'Your prompt' if waiting == 1 else f'Your {waiting} prompts'} waiting for "
                         f"{profile_name or 'the model'} {'is' if waiting == 1 else 'are'} back in the box, "
                         "not sent.", severity="warning")
