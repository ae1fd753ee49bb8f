"""The archive: the chat history and its saver, opened and closed together.

One object the App owns and hands to whoever saves or reads chats (the
conversation, the chats dialog). A history call that fails is reported through
``report`` and answers None, so the chat goes on unsaved instead of breaking.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from app.store.history import History, HistoryError
from app.store.open_chats import OpenChats
from app.store.saver import ChatCreated, HistoryRescued, HistorySaver
from app.store.pending import ChatRef, Setting

T = TypeVar("T")

WRITE_EVERY_S = 1.0
"""Minimum time between two history writes of a streaming reply. A SQLite write
per round (and the JSON of every piece so far) competed with the engine for the
same cores, and each write woke the saver's thread twice; a round still reaches the
disk within this time, and the reply's end (or a quit) is written at once."""

SAVE_FLUSH_AT_EXIT_S = 10.0
"""How long quitting waits for a locked history to take the last reply."""
HISTORY_CLOSE_WAIT_S = 1.0
"""After that, how long closing the history waits for a write still stuck on the lock."""

Report = Callable[[str], None]
"""Shows a history error to the user (one line)."""


class Archive:
    """The history database and the one saver that writes replies to it.

    ``history`` and ``saver`` are None until :meth:`open`; after :meth:`close` they stay,
    closed, for whoever reads what was saved.
    """

    def __init__(self, report: Report) -> None:
        self._report = report
        self.history: History | None = None
        self.saver: HistorySaver | None = None
        self.open_chats = OpenChats(None)
        """The lock of the chat this window shows (app.store.open_chats): set by :meth:`open`."""
        self.exit_wait_s = SAVE_FLUSH_AT_EXIT_S
        """How long :meth:`close` waits for the saver (shorter once the user chose to quit
        without what is unsaved, app.ui.quitting)."""
        self.unsaved_settled = False
        """What is unsaved at quit was exported or discarded already (ctrl+q's answer, a signal's
        export): the app's exit does not export it again (app.ui.quitting.export_left_unsaved)."""

    def open(self, on_lag: Callable[[str | None], None],
             on_rescue: Callable[[HistoryRescued], None] | None = None,
             on_created: Callable[[ChatCreated], None] | None = None) -> str | None:
        """Open the history and start the saver; returns the history's notice (a database
        set aside, a lock) for the user, or None. ``on_lag``, ``on_rescue`` (the open chat was
        deleted elsewhere) and ``on_created`` (a new chat's row written; app.store.saver) hear
        from the saver thread."""
        self.history = History.open()
        self.open_chats = OpenChats(self.history.path)
        self.saver = HistorySaver(self.history, on_lag, min_interval_s=WRITE_EVERY_S, on_rescue=on_rescue,
                                  on_created=on_created)
        return self.history.notice

    def db(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T | None:
        """Run a history call once; on failure report the error and answer None (the saver's
        writes are the ones retried: :meth:`save_setting`)."""
        try:
            return fn(*args, **kwargs)
        except HistoryError as exc:
            self._report(f"{exc}; nothing was changed: try again once it is free" if exc.locked else str(exc))
            return None

    def done(self, fn: Callable[..., object], *args: object) -> bool:
        """Run a history write once (as :meth:`db`); whether it succeeded (a failure is reported)."""
        return self.db(lambda: fn(*args) or True) is True

    def save_setting(self, chat: ChatRef, name: Setting) -> None:
        """Save ``chat``'s setting ``name`` as its ChatRef holds it, through the saver: off the
        UI's thread, and retried while another program holds the database."""
        if self.saver is not None:
            self.saver.save_setting(chat, name)

    def at_risk(self, on_screen: bool) -> str | None:
        """Why quitting now would lose what was said (None: nothing would be lost). Asked at
        quit: writes are failing with replies unsaved, or the history lives in memory only
        and ``on_screen`` (the open chat has messages)."""
        saver, history = self.saver, self.history
        if saver is not None and saver.lagging and (saver.unsaved() or saver.unsaved_settings()):
            replies, settings = saver.unsaved(), saver.unsaved_settings()
            what = " and ".join(part for part in (
                f"{replies} repl{'ies' if replies > 1 else 'y'}" if replies else "",
                f"{settings} chat setting{'s' if settings > 1 else ''}" if settings else "") if part)
            return (f"{what} {'are' if replies + settings > 1 else 'is'} not saved: "
                    f"{saver.last_error or 'history writes are failing'}.")
        if history is not None and history.path is None and on_screen:
            return "This session's chats are not saved: the history database could not be used."
        return None

    def close(self) -> bool:
        """Let the saver write what it holds (waiting up to :attr:`exit_wait_s`), then close;
        answers whether everything was written (what was not is in ``saver.pending()``)."""
        saved = self.saver.close(self.exit_wait_s) if self.saver is not None else True
        if self.history is not None:
            self.history.close(wait_s=HISTORY_CLOSE_WAIT_S)
        self.open_chats.release()
        return saved
