"""Quitting without losing what was said.

ctrl+q asks first when the chat would be lost (:meth:`app.ui.archive.Archive.at_risk`:
history writes failing with replies unsaved, or a history kept in memory only):
export it to a Markdown file (in the first folder that takes it, see
:func:`app.ui.export.export_unsaved`), discard it, or stay. A prompt typed but
not sent goes into that export, but alone does not stop ctrl+q: the prompt box
is not a document, and a question at every quit teaches people to click through.
It is kept instead, and is back in the box at the next start
(:func:`app.store.state.remember_draft`; never a private chat's).

SIGTERM and SIGHUP end the app the way ctrl+q does, without asking (nobody is
there to answer; what would be lost is exported as "export" would): the App's
unmount lets the saver write what it can, and
Textual's normal exit leaves the alternate screen, turns mouse reporting off and
shows the cursor again. Python's default for both signals kills the process on
the spot, leaving the terminal in the app's modes.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import SpecChatError

from app.store.state import remember_draft
from app.ui.archive import Archive
from app.ui.export import export_unsaved, transcript_markdown
from app.ui.notices import notice
from app.ui.screens.edit import ConfirmScreen, EditScreen
from app.ui.screens.quit import QuitAnswer, QuitScreen
from app.ui.resume import remember_open_chat
from app.ui.sampling import ChatSampling

if TYPE_CHECKING:
    from textual.app import App

    from app.store.pending import ChatRef
    from app.store.saver import HistorySaver
    from app.ui.engine_host import EngineHost
    from app.ui.widgets.conversation import Conversation

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
EXIT_ANYWAY_S = 5.0
"""After SIGTERM/SIGHUP, how long the normal exit may take beyond the saver's own wait before
the process ends anyway (the saver flushed once more first); closing takes up to 2 s of it when a
write is stuck on a lock (``CLOSE_JOIN_S``, ``HISTORY_CLOSE_WAIT_S``). A terminal closed under the app
(tmux killed, an SSH link dropped) hangs up with SIGHUP and then SIGCONT; Textual's output
thread could then wait forever on its queue, and the app stayed behind, holding its memory
and its engine, after the window was gone."""
QUIT_ANSWERED_WAIT_S = 1.0
"""The saver's last chance once the user answered (exported or discarded): not the full
wait for a lock, which would only keep them waiting for writes that keep failing."""


def ask_before_quit(app: "App[Any]", conversation: "Conversation", archive: Archive) -> None:
    """Quit now, or (when the chat would be lost) open the question and act on its answer. A
    dialog whose text was edited and not saved (F8's system prompt, a rename) asks first; ctrl+g's
    edit of the last prompt is kept as unsent text instead, as the prompt box's is."""
    if isinstance(app.screen, QuitScreen) or (isinstance(app.screen, ConfirmScreen) and app.screen.asks_to_quit):
        return  # already asking: its keys answer
    edit = app.screen
    if isinstance(edit, EditScreen) and edit.changed and not edit.unsent:
        def answered(quit_anyway: bool | None) -> None:
            if quit_anyway:
                quit_unless_chat_at_risk(app, conversation, archive)

        app.push_screen(ConfirmScreen(f"Your changes in “{edit.title_text}” are not saved. Quit anyway?",
                                      hint="y quits without them · Esc or n goes back to them", asks_to_quit=True),
                        answered)
        return
    quit_unless_chat_at_risk(app, conversation, archive)


def quit_unless_chat_at_risk(app: "App[Any]", conversation: "Conversation", archive: Archive) -> None:
    """Quit now, or (when the chat would be lost) open the question and act on its answer."""
    on_screen = bool(conversation.messages()) and not conversation.private
    why = archive.at_risk(on_screen)
    if why is None:
        app.exit()
        return

    def answered(answer: QuitAnswer | None) -> None:
        if answer == "discard":
            archive.exit_wait_s, archive.unsaved_settled = QUIT_ANSWERED_WAIT_S, True
            app.exit()
        elif answer == "export":
            path = write_unsaved(app, conversation, archive)
            if path is not None:  # else the reason is shown and the app goes on
                archive.exit_wait_s, archive.unsaved_settled = QUIT_ANSWERED_WAIT_S, True
                app.exit(message=f"specchat: the unsaved chat was exported to {path}")

    app.push_screen(QuitScreen(f"{why} Quitting now loses what is not saved."), answered)


def write_unsaved(app: "App[Any]", conversation: "Conversation", archive: Archive) -> Path | None:
    """Write the chat on screen, the saver's unsaved replies of other chats and the unsent
    prompt to a new Markdown file; None (the reason shown) if no folder took it."""
    messages = [] if conversation.private else conversation.messages()
    if archive.saver is not None:  # other chats' unsaved replies, not on screen (ids may not be set yet)
        messages += pending_messages(archive.saver, but=conversation.chat_ref)
    settings = [] if conversation.private else conversation.settings_lines()
    text = transcript_markdown(app.sub_title or "specchat chat", messages, conversation.prompt.text,
                               settings=settings)
    try:
        return export_unsaved(text, f"unsaved-chat-{time.strftime('%Y%m%d-%H%M%S')}.md")
    except SpecChatError as exc:
        notice(app, str(exc), severity="error", title="Export")
        return None


def export_left_unsaved(archive: Archive) -> str | None:
    """At the app's end, once the saver had its wait: the replies it still could not write (a lock
    taken by another program just before the quit, so that nobody was asked) go to a new Markdown
    file, unless the user already exported or discarded them. Answers the line saying where (or
    why nothing could be written); None when nothing was left. They were lost without a word."""
    saver = archive.saver
    settled = saver is None or archive.unsaved_settled
    messages = [] if settled else pending_messages(saver)
    settings = [] if settled else [f"{chat.title}: {setting_line(chat, name)}" for chat, name in saver.pending_settings()]
    if not messages and not settings:
        return None
    text = transcript_markdown("specchat: what the history could not take", messages, settings=settings)
    try:
        path = export_unsaved(text, f"unsaved-chat-{time.strftime('%Y%m%d-%H%M%S')}.md")
    except SpecChatError as exc:
        return f"specchat: the last replies or settings could not be saved: {exc}"
    return f"specchat: the history could not take the last replies or settings; they were exported to {path}"


def pending_messages(saver: "HistorySaver", but: "ChatRef | None" = None) -> list[tuple[str, str]]:
    """The saver's unsaved exchanges (but ``but``'s, the chat on screen) as ``(role, text)``, each
    prompt named by its chat's title."""
    messages: list[tuple[str, str]] = []
    for chat, prompt, reply in saver.pending():
        if chat is not but:
            messages += [("user", f"({chat.title}) {prompt}"), ("assistant", reply)]
    return messages


def setting_line(chat: "ChatRef", name: str) -> str:
    """A chat setting the history could not take, as its ChatRef holds it, on one line."""
    if name == "system_prompt":
        return "System prompt: " + " ".join((chat.system_prompt or "(the profile's)").split())
    if name == "sampling":
        return "Sampling: " + (ChatSampling.from_dict(chat.sampling).own_label() or "(the profile's)")
    return f"Profile: {chat.profile or '—'}"


def close_down(conversation: "Conversation", archive: Archive, engine: "EngineHost") -> str | None:
    """The app's end, in the order that loses least; answers the line for the terminal (where
    what could not be kept went), or None. The unsent text is kept first (the history's close may
    wait on a lock), exported where the state folder cannot keep it (a private chat's never); the
    saver has its wait, and what the history could not take is exported."""
    conversation.stop_reply()
    unsent = None if conversation.private else conversation.unsent_text()
    unkept = remember_draft(unsent, conversation.chat_id, conversation.title)
    engine.close()
    notes = [export_unsent(unsent, unkept)] if unkept is not None and unsent else []
    if not archive.close():  # else the saver has written the open chat's rows: it has its id now
        notes.append(export_left_unsaved(archive))
    remember_open_chat(conversation)
    return "\n".join(n for n in notes if n) or None


def export_unsent(text: str, why: str) -> str:
    """The prompt box's unsent text, which the state folder could not keep for the next start
    (``why``), to a new Markdown file; answers the line saying where. It was lost without a word."""
    try:
        path = export_unsaved(transcript_markdown("specchat: unsent text", [], text),
                              f"unsent-text-{time.strftime('%Y%m%d-%H%M%S')}.md")
    except SpecChatError as exc:
        return f"specchat: the unsent text could not be kept ({why}) nor exported: {exc}"
    return f"specchat: {why}, so the unsent text was exported to {path}"


class ExitOnSignals:
    """SIGTERM/SIGHUP: the exit runs on the app's event loop (so on the app's thread), and the
    last resort (:meth:`_exit_anyway`) is armed as the signal arrives, loop or not.

    Nobody can be asked: when the chat would be lost (:meth:`Archive.at_risk`) it is
    exported first, as ctrl+q's "export" would, and the saver still gets its wait. The handler
    is Python's own (it runs between two bytecodes of the main thread): asyncio's ran only once
    the loop got round to it, and a loop kept busy for minutes (a 100,000-character title being
    wrapped) left the app running at 60% of a core after its terminal had closed."""

    def __init__(self, app: "App[Any]", conversation: "Conversation", archive: Archive) -> None:
        self._app = app
        self._conversation = conversation
        self._archive = archive
        self._installed: list[tuple[int, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._armed = False
        self._message: str | None = None
        """Where the export went: said by the last resort too, if it has to end the process."""
        self._closing = False

    def install(self) -> None:
        """Call from the app's loop; where signals cannot be caught (a loop not in the main
        thread, Windows) Python's defaults stay."""
        try:
            self._loop = asyncio.get_running_loop()
            for sig in SIGNALS:
                self._installed.append((sig, signal.signal(sig, self._caught)))
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            pass

    def remove(self) -> None:
        for sig, previous in self._installed:
            try:
                signal.signal(sig, previous)
            except (RuntimeError, ValueError):
                pass
        self._installed = []

    def _caught(self, sig: int, _frame: object) -> None:
        """The signal, in the main thread: arm the last resort now, and ask the loop for the exit."""
        self._arm(sig)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.on_signal, sig)

    def _arm(self, sig: int) -> None:
        if not self._armed and not self._app.is_headless:  # a real terminal; under run_test the process is the test's
            self._armed = True
            threading.Thread(target=self._exit_anyway, args=(sig,), name="exit-anyway", daemon=True).start()

    def closing(self) -> None:
        """The app is closing (its unmount saves and exports): a signal now only arms the last resort,
        which ends the process if the close hangs. Unhooked first, a SIGHUP while the close waited on
        a lock was Python's default: the process died at once, nothing exported (a review's)."""
        self._closing = True

    def on_signal(self, sig: int) -> None:
        """Exit with 128 + ``sig`` (as a shell reports a signal), exporting first what would be lost."""
        if self._closing:
            self._arm(sig)
            return
        conversation = self._conversation
        message = None
        if self._archive.at_risk(bool(conversation.messages()) and not conversation.private) is not None:
            path = write_unsaved(self._app, conversation, self._archive)
            if path is not None:
                message = f"specchat: the unsaved chat was exported to {path}"
                # as after ctrl+q's "export": waiting out the lock's full wait, the exit was ended by
                # the last resort before it said where the export went or kept the unsent text
                self._archive.exit_wait_s, self._archive.unsaved_settled = QUIT_ANSWERED_WAIT_S, True
        self._message = message
        self._app.exit(return_code=128 + sig, message=message)
        self._arm(sig)

    def _exit_anyway(self, sig: int) -> None:
        """The last resort (a daemon thread: a normal exit ends it): once the normal exit has had
        the saver's wait and :data:`EXIT_ANYWAY_S` more, flush the saver once more and end, saying
        where the export went (Textual's exit, which would have said it, never came)."""
        time.sleep(self._archive.exit_wait_s + EXIT_ANYWAY_S)
        saver = self._archive.saver
        if saver is not None:
            try:
                saver.flush(QUIT_ANSWERED_WAIT_S)
            except Exception:  # noqa: BLE001 - ending anyway
                pass
        said = self._message or getattr(self._app, "exit_note", None)
        if said is not None:
            try:
                os.write(2, f"\r\n{said}\r\n".encode("utf-8", "replace"))
            except OSError:
                pass
        os._exit(128 + sig)
