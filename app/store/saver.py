"""Writes replies to the history from a background thread, never dropping a round.

The reply worker only records the state it wants saved (:meth:`HistorySaver.update`);
one saver thread per app brings the database to that state, oldest reply first,
so rows keep their order. When a write fails because another program holds a
lock (or the disk is full, or the file read-only), the unsaved state stays in memory,
the saver tries again with exponential backoff (:data:`BACKOFF_S`) and calls
``on_lag`` with a one-line notice; once a write succeeds it calls ``on_lag(None)``.

A write to a chat that was deleted (another window deleted it, :class:`ChatDeleted`)
is never tried again: ids are never reused, so it could only fail. The chat's unsaved
exchanges move to a new chat, "<title> (recovered)", and ``on_rescue`` is told its title
once it is written. The ChatRef is shared with the conversation, so what the user
sends next goes there too. What is unsaved of a chat deleted through this History
(:attr:`History.deleted_here`) is simply dropped: the user meant it.

Only the latest state of each reply is written (rounds coalesce), and the final
state (with its finish reason) is written as soon as the lock clears, even after
the reply ended.

A chat's settings (:data:`SETTINGS`: its profile, system prompt and sampling, as its
:class:`ChatRef` holds them) are written the same way (:meth:`HistorySaver.save_setting`), before
the replies: set while another program held the lock, F10's sampling was lost, and the UI waited
out the lock's timeout. A chat not in the database yet takes them when the saver creates it.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from textual.message import Message

from app.store.history import ChatDeleted, History, HistoryError
from app.store.pieces import Pieces
from app.store.pending import RECOVERED, SETTINGS, ChatRef, ReplyRecord, Setting, Stats, stats_dict

BACKOFF_S = (0.25, 4.0)
"""First and largest wait between retries of a failed write (doubling in between)."""
CLOSE_JOIN_S = 1.0
"""How long :meth:`HistorySaver.close` waits for its thread once the flush is over."""


class HistoryLag(Message):
    """Posted by the saver thread: ``notice`` while writes wait for a lock, None once saved."""

    def __init__(self, notice: str | None) -> None:
        super().__init__()
        self.notice = notice


class ChatCreated(Message):
    """Posted by the saver thread: ``chat`` has just been written as a new row (it has its id).
    The window that shows it takes its open-chat lock at once (app.store.open_chats): taken only
    when the first reply finished, a second window started meanwhile took the new chat over."""

    def __init__(self, chat: "ChatRef") -> None:
        super().__init__()
        self.chat = chat


class HistoryRescued(Message):
    """Posted by the saver thread: the open chat was deleted elsewhere and its unsaved
    exchanges were saved to a new chat (``notice`` says which)."""

    def __init__(self, notice: str, chat_id: int, title: str) -> None:
        super().__init__()
        self.notice = notice
        self.chat_id = chat_id
        self.title = title


class HistorySaver:
    """The app's one writer of prompts and replies (thread-safe)."""

    def __init__(self, history: History, on_lag: Callable[[str | None], None] | None = None,
                 min_interval_s: float = 0.0, on_rescue: Callable[[HistoryRescued], None] | None = None,
                 on_created: Callable[[ChatCreated], None] | None = None) -> None:
        self.history = history
        self.on_lag = on_lag or (lambda _notice: None)
        self.on_rescue = on_rescue or (lambda _rescued: None)
        self.on_created = on_created or (lambda _created: None)
        self.min_interval_s = min_interval_s
        self._queue: deque[ReplyRecord] = deque()
        self._settings: dict[tuple[int, Setting], tuple[ChatRef, int]] = {}
        """Settings to write: ``(id(chat), name) -> (chat, version)``, oldest first."""
        self._setting_version = 0
        self._cond = threading.Condition()
        self._closed = False
        self._lagging = False
        self._last_error: str | None = None
        self._thread: threading.Thread | None = None
        self._urgent = False  # a write that should not wait out min_interval_s (see _pause)

    # -- called by the app's threads ----------------------------------------------

    def start_reply(self, chat: ChatRef, prompt: str, profile: str | None,
                    user_id: int | None = None, supersedes: "ReplyRecord | int | None" = None) -> ReplyRecord:
        """Queue a prompt and its (empty, streaming) reply for saving.

        ``user_id``: the prompt is already saved as that row (a regenerated reply
        answers it again; the earlier reply stays in the history). ``supersedes``:
        the exchange an edited prompt replaces, marked so before the new rows.
        """
        record = ReplyRecord(chat, prompt, profile, user_id=user_id, supersedes=supersedes)
        with self._cond:
            self._queue.append(record)
            self._urgent = True
            self._start_thread()
            self._cond.notify_all()
        return record

    def save_setting(self, chat: ChatRef, name: Setting) -> None:
        """Write ``chat``'s setting ``name`` (the value its ChatRef holds when written: the latest
        wins) soon, retried while the database is locked, before any reply."""
        if name not in SETTINGS:
            raise ValueError(f"unknown chat setting {name!r}; one of {', '.join(SETTINGS)}")
        with self._cond:
            self._setting_version += 1
            self._settings.pop((id(chat), name), None)  # re-queued at the end: written after what came before
            self._settings[(id(chat), name)] = (chat, self._setting_version)
            self._urgent = True
            self._start_thread()
            self._cond.notify_all()

    def update(self, record: ReplyRecord, text: str, pieces: Pieces, stats: Stats,
               finish: str | None = None) -> None:
        """The reply's state now (``finish`` set on the last call); saved soon, in order.
        ``stats`` may be an immutable object with ``to_dict``, converted only when written."""
        with self._cond:
            record.text, record.pieces, record.stats = text, list(pieces), stats
            record.finish = finish or record.finish
            record.version += 1
            self._urgent = self._urgent or finish is not None
            self._cond.notify_all()

    @property
    def lagging(self) -> bool:
        """True while writes fail (a lock held elsewhere) and state waits in memory."""
        return self._lagging

    def unsaved(self) -> int:
        """Replies whose latest state is not in the database yet."""
        with self._cond:
            return sum(1 for r in self._queue if r.written != r.version or r.finish is None)

    def unsaved_settings(self) -> int:
        """Chat settings set but not in the database yet."""
        with self._cond:
            return len(self._settings)

    def pending_settings(self) -> list[tuple[ChatRef, Setting]]:
        """``(chat, setting)`` of each chat setting set but not in the database yet (its value is the
        ChatRef's)."""
        with self._cond:
            return [(chat, name) for (_, name), (chat, _version) in self._settings.items()]

    def pending(self) -> list[tuple[ChatRef, str, str]]:
        """``(chat, prompt, reply text)`` of each reply whose latest state is not in the database."""
        with self._cond:
            return [(r.chat, r.prompt, r.text) for r in self._queue if r.written != r.version or r.finish is None]

    def writing(self) -> set[int]:
        """Row ids of the replies still streaming in this app (saved so far, their end not yet)."""
        with self._cond:
            return {r.assistant_id for r in self._queue if r.finish is None and r.assistant_id is not None}

    @property
    def last_error(self) -> str | None:
        """Why writes fail, while they do (:attr:`lagging`)."""
        return self._last_error if self._lagging else None

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every finished reply to be written; True if all were."""
        return self._wait_while(lambda: bool(self._settings) or any(r.written != r.version for r in self._queue),
                                timeout)

    def wait_chat(self, chat_id: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s until every reply of chat ``chat_id`` has ended and is written
        (a reply left streaming there: its end comes from its worker, then this thread); whether
        they are. :meth:`flush` waits only for what was handed over so far."""
        return self._wait_while(lambda: any(r.chat.id == chat_id and not r.saved for r in self._queue), timeout)

    def _wait_while(self, unsaved: Callable[[], bool], timeout: float) -> bool:
        """Hurry the saver thread and wait up to ``timeout`` s while ``unsaved()`` (read under the
        lock) holds; whether it stopped holding."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._urgent = True
            while unsaved():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.notify_all()
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 10.0) -> bool:
        """Write what is pending (waiting up to ``timeout`` s for a lock), then stop; True if
        everything was written. A thread still waiting on a lock is left to the process's end
        (:data:`CLOSE_JOIN_S`): waiting for it too, a quit under a lock outlived its last resort."""
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=CLOSE_JOIN_S)
        return done

    # -- the saver thread ------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="history-saver", daemon=True)
            self._thread.start()

    def _next_due(self) -> ReplyRecord | None:
        while self._queue and self._queue[0].saved:
            self._queue.popleft()
        for record in self._queue:
            if record.written != record.version or record.user_id is None:
                return record
            if record.finish is None:
                return None  # later replies wait for this one's rows to be in place
        return None

    def _run(self) -> None:
        delay = BACKOFF_S[0]
        while True:
            with self._cond:
                setting, record = self._next_work()
                while setting is None and record is None and not self._closed:
                    self._cond.wait()
                    setting, record = self._next_work()
                if setting is None and record is None:
                    return
                if record is not None:
                    snapshot = (record.version, record.text, list(record.pieces), record.stats, record.finish)
            try:
                if setting is not None:
                    self._write_setting(*setting)
                else:
                    assert record is not None
                    self._write(record, *snapshot)
            except ChatDeleted:
                assert record is not None  # a setting's UPDATE of a deleted chat changes nothing, raises nothing
                self._chat_deleted(record.chat)
                continue
            except HistoryError as exc:
                self._last_error = str(exc)
                if not self._lagging:
                    self._lagging = True
                    self.on_lag(f"{exc}. Unsaved changes are kept in memory and saved when the lock is released."
                                if exc.locked else
                                f"{exc}. Unsaved changes are kept in memory and saved as soon as writing works again; "
                                "quitting first asks what to do with it.")
                with self._cond:
                    if self._closed:
                        return
                    self._cond.wait(delay)
                delay = min(delay * 2, BACKOFF_S[1])
                continue
            delay = BACKOFF_S[0]
            if self._lagging:
                self._lagging = False
                self.on_lag(None)
            if setting is not None:
                with self._cond:
                    chat, name, version = setting
                    if self._settings.get((id(chat), name), (None, -1))[1] == version:  # not set again meanwhile
                        del self._settings[(id(chat), name)]
                    self._cond.notify_all()
                continue
            assert record is not None
            with self._cond:
                record.written = max(record.written, snapshot[0])
                self._cond.notify_all()
            chat = record.chat
            if chat.deleted_id is not None and chat.id is not None:
                self.on_rescue(HistoryRescued(
                    f"This chat was deleted in another window; your unsaved messages were saved to a new chat "
                    f"'{chat.title}'.", chat.id, chat.title))
                chat.deleted_id = None
            self._pause()

    def _next_work(self) -> tuple[tuple[ChatRef, Setting, int] | None, ReplyRecord | None]:
        """What to write next: a chat's setting first (:meth:`_next_setting`), else a reply's state."""
        setting = self._next_setting()
        return setting, self._next_due() if setting is None else None

    def _next_setting(self) -> tuple[ChatRef, Setting, int] | None:
        """The oldest setting to write of a chat in the database. A chat not written yet takes its
        settings when it is created (from its ChatRef), so its entries are dropped."""
        for key, (chat, version) in list(self._settings.items()):
            if chat.id is not None:
                return chat, key[1], version
            del self._settings[key]
        return None

    def _write_setting(self, chat: ChatRef, name: Setting, version: int) -> None:
        """Write ``chat``'s setting ``name`` as its ChatRef holds it now (may raise HistoryError)."""
        assert chat.id is not None
        h = self.history
        if name == "profile":
            h.set_profile(chat.id, chat.profile)
        elif name == "system_prompt":
            h.set_system_prompt(chat.id, chat.system_prompt)
        else:
            h.set_sampling(chat.id, chat.sampling)

    def _pause(self) -> None:
        """Up to :attr:`min_interval_s` before the next write, over at once when a reply ends, a new
        one starts, the app flushes (quits) or the saver closes: streaming rounds coalesce, and
        what the user would miss is not held back."""
        deadline = time.monotonic() + self.min_interval_s
        with self._cond:
            while not (self._closed or self._urgent) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            self._urgent = False

    def _chat_deleted(self, chat: ChatRef) -> None:
        """A write to ``chat`` was refused (:class:`ChatDeleted`): never retried. Its unsaved
        exchanges are dropped if it was deleted here, else re-aimed at a new chat
        (created by the next write; rows of the deleted chat they referred to are gone)."""
        with self._cond:
            mine = [r for r in self._queue if r.chat is chat and not r.saved]
            if chat.id is not None and chat.id in self.history.deleted_here:
                for record in mine:
                    self._queue.remove(record)
                self._cond.notify_all()
                return
            chat.deleted_id, chat.id = chat.id, None
            if not chat.title.endswith(RECOVERED):
                chat.title += RECOVERED
            for record in mine:
                record.user_id = record.assistant_id = None
                record.supersedes = None
                record.written = -1
            self._cond.notify_all()

    def _write(self, record: ReplyRecord, version: int, text: str, pieces: Pieces,
               stats: Stats, finish: str | None) -> None:
        """Create whatever rows are missing, then write the reply's state (may raise)."""
        h = self.history
        chat = record.chat
        if chat.id is None:
            chat.id = h.create_chat(chat.title, chat.profile, chat.system_prompt, chat.sampling)
            self.on_created(ChatCreated(chat))
        if record.user_id is not None and record.assistant_id is None and not h.has_message(chat.id, record.user_id):
            record.user_id = None  # the prompt it answers again went with a deleted chat: written again here
        if record.user_id is None:
            first = record.supersedes.user_id if isinstance(record.supersedes, ReplyRecord) else record.supersedes
            if first is not None:
                h.mark_superseded(chat.id, first)
            record.user_id = h.add_message(chat.id, "user", record.prompt, profile=record.profile)
        if record.assistant_id is None:
            record.assistant_id = h.add_message(chat.id, "assistant", "", profile=record.profile)
        h.update_message(chat.id, record.assistant_id, text, stats=stats_dict(stats), pieces=pieces,
                         finish_reason=finish)
