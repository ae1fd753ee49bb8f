"""Conversations saved in SQLite as they happen.

One file, ``history.db`` in :func:`app.store.paths.data_dir` (mode 0600, its directory
0700 when specchat made it). A chat has a title, its last profile and a system prompt; a message its role,
text, profile, final statistics (JSON) and, for replies, the pieces with their token
source (draft/target), so the colour view survives a restart.

The assistant row is written when a reply starts and rewritten every round (by
:class:`app.store.saver.HistorySaver`, which keeps unsaved rounds in memory while the
file is locked), so killing the app loses at most the tokens not yet written.

Locks are not damage: every connection waits :data:`BUSY_TIMEOUT_S` for another
program's lock (another specchat, a DB browser, a backup) and :meth:`History.open`
tries again after that. Only SQLite's own corruption errors ("database disk
image is malformed", "file is not a database"), confirmed by ``PRAGMA
integrity_check``, make it set the file aside as ``history.db.corrupt-<timestamp>``
and start a fresh one, into which :mod:`app.store.salvage` reads every chat the damaged
file still holds whole; :attr:`History.notice` says so and the app shows it.

The schema and its versioned upgrades are in :mod:`app.store.schema`; the file's own handling
(opened private, checked, set aside) in :mod:`app.store.db_file`.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.store.db_file import (add_functions, confirm_corrupt, connect, first_line, open_read_only, prepare,
                               restrict_files, set_aside)
from app.store.paths import data_dir
from app.store.pieces import Pieces
from app.store.records import (CHAT_COLUMNS, ChatDeleted, ChatRecord, HistoryError, MessageRecord, chat_from_row,
                               decoded, describe, is_missing_parent, message_from_row, to_json)
from app.store.salvage import salvage
from app.store.schema import NewerSchema, is_corruption_error, is_lock_error, migrate
from engine.text_safety import without_lone_surrogates

__all__ = ["BUSY_TIMEOUT_S", "OPEN_ATTEMPTS", "ChatDeleted", "ChatRecord", "History", "HistoryError",
           "MessageRecord"]

BUSY_TIMEOUT_S = 5.0
"""How long one statement waits for another connection's lock before failing."""
OPEN_ATTEMPTS = 2
"""Tries (each waiting BUSY_TIMEOUT_S) before :meth:`History.open` gives up on a lock."""
SEARCH_MAX_BYTES = 50_000
"""The longest search (UTF-8 bytes): SQLite's longest LIKE pattern, kept when search became
:func:`~app.store.db_file.contains_folded`; longer, it is a pasted document, not a search."""
DRAFTING_CHARS = 3_000_000
"""Characters of earlier chats the suffix drafter drafts from (about 750k tokens, within
its index's bound, engine.decode.suffix.MAX_TOKENS)."""


def storable(params: Sequence[Any] | dict[str, Any]) -> Sequence[Any] | dict[str, Any]:
    """``params`` with their text :func:`~engine.text_safety.without_lone_surrogates`: SQLite takes
    UTF-8, which cannot write a lone surrogate, and the write raised UnicodeEncodeError, ending the
    saver's thread (a server's reply then stayed unsaved, and quitting waited for it in vain)."""
    def fix(p: Any) -> Any:
        return without_lone_surrogates(p) if isinstance(p, str) else p

    return {k: fix(v) for k, v in params.items()} if isinstance(params, dict) else tuple(map(fix, params))


class History:
    """A thread-safe store of chats; every method may raise :class:`HistoryError`."""

    def __init__(self, conn: sqlite3.Connection, path: Path | None, notice: str | None = None) -> None:
        conn.text_factory = decoded  # text that is not UTF-8 (another program wrote it) reads with stand-ins
        add_functions(conn)
        self._conn = conn
        self._lock = threading.RLock()
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        """Reads go through a connection of their own (:meth:`_query`), so that a write waiting for
        another program's lock (up to :data:`BUSY_TIMEOUT_S`, holding ``_lock``) holds up no read:
        the UI's thread reads. WAL lets it read what was committed meanwhile."""
        self.path = path
        self.notice = notice
        """Set when the database had to be set aside, is locked, or could not be opened."""
        self._ready = True
        self.deleted_here: set[int] = set()
        """Chats deleted through this object (this window): a refused write to one of them
        is dropped, while one deleted by another window is recovered (app.store.saver)."""

    # -- opening ---------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | None = None) -> "History":
        """Open (or create and upgrade) the database at ``path`` (default: data_dir()/history.db).

        Never raises. A lock held by another program is waited for
        (:data:`OPEN_ATTEMPTS` x :data:`BUSY_TIMEOUT_S`); if it is still held the
        file is used anyway (the schema is checked at the first write) and the
        notice says so. Only a confirmed corrupt file is renamed aside; a file
        written by a newer specchat, or one that cannot be opened at all, is left
        untouched and this run's history lives in memory.
        """
        path = Path(path) if path is not None else data_dir() / "history.db"
        error: BaseException | None = None
        for attempt in range(max(OPEN_ATTEMPTS, 1)):
            try:
                return cls(connect(path, BUSY_TIMEOUT_S), path)
            except (sqlite3.Error, OSError) as exc:
                error = exc
                if not is_lock_error(exc):
                    break
        assert error is not None
        if is_lock_error(error):
            return cls._locked(path, error)
        if isinstance(error, NewerSchema):
            return cls._in_memory(f"{error} It was left untouched; this session's chats are not saved. "
                                  "Upgrade specchat, or set SPECCHAT_DATA_DIR to use another history.")
        if not (is_corruption_error(error) and confirm_corrupt(path, BUSY_TIMEOUT_S)):
            return cls._read_only(path, error) or cls._in_memory(
                f"History database {path} cannot be used ({error}); it was left untouched "
                "and this session's chats are not saved.")
        try:
            moved = set_aside(path)
        except OSError as exc:
            return cls._in_memory(f"History database {path} is damaged ({error}) and could not be moved "
                                  f"aside ({exc}); this session's chats are not saved.")
        notice = (f"History database {path} is damaged ({first_line(error)}). "
                  f"It was moved to {moved.name} and a new one started.")
        try:
            conn = connect(path, BUSY_TIMEOUT_S)
            return cls(conn, path, f"{notice} {salvage(moved, conn).sentence()}")
        except (sqlite3.Error, OSError) as exc:
            return cls._in_memory(f"{notice} The new one failed too ({exc}); "
                                  "this session is not saved.")

    @classmethod
    def _locked(cls, path: Path, error: BaseException) -> "History":
        """The file is locked by another program: keep using it, never set it aside."""
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        history = cls(conn, path, f"History database {path} is locked by another program ({error}). "
                      "Nothing was moved or lost; chats are saved as soon as the lock is released.")
        history._ready = False
        return history

    @classmethod
    def _read_only(cls, path: Path, error: BaseException) -> "History | None":
        """A file that can be read but not written (read-only, or in a read-only folder), opened
        to read: the chats are shown and every write fails (saved as the saver says, quitting asks
        what to do with them). It was not read at all, as if the history were gone. None when it
        cannot be read either, or is not a current specchat history."""
        conn = open_read_only(path, BUSY_TIMEOUT_S)
        if conn is None:
            return None
        history = cls(conn, path, f"History database {path} can be read but not written ({first_line(error)}): "
                                  "your chats are shown, and nothing new is saved. Make the file and its folder "
                                  "writable, or set SPECCHAT_DATA_DIR to another folder.")
        history._reader = conn  # a reader of its own would open the file to write its WAL side files, and fail
        return history

    @classmethod
    def _in_memory(cls, notice: str) -> "History":
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        migrate(conn)
        return cls(conn, None, notice)

    def _ensure_ready(self) -> None:
        """After a start under a lock: check and upgrade the file before its first use."""
        if self._ready:
            return
        prepare(self._conn)
        self._ready = True
        if self.path is not None:
            restrict_files(self.path)

    def close(self, wait_s: float = -1) -> bool:
        """Close the connections (further calls raise :class:`HistoryError`); with ``wait_s`` of 0
        or more, give up after that long if a write still waits on another program's lock (the
        connections then end with the process) and answer False."""
        if not self._lock.acquire(timeout=wait_s):
            return False
        try:
            if not self._read_lock.acquire(timeout=wait_s):
                return False
            try:
                self._conn.close()
                if self._reader is not None:
                    self._reader.close()
                self._reader = self._conn  # closed: a later read raises, as before, instead of opening another
            finally:
                self._read_lock.release()
        finally:
            self._lock.release()
        return True

    # -- helpers -----------------------------------------------------------------

    def _run(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            try:
                self._ensure_ready()
                with self._conn:
                    return self._conn.execute(sql, storable(params))
            except sqlite3.Error as exc:
                raise HistoryError(describe("Saving chat history failed", exc, self.path), locked=is_lock_error(exc)) from exc

    def _write_chat(self, chat_id: int, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[sqlite3.Cursor]:
        """Run ``statements`` in one transaction; each must change a row of chat ``chat_id``.

        Raises :class:`ChatDeleted` (and writes nothing) when the chat is gone: a
        FOREIGN KEY failure on an insert, or an update that found no row."""
        with self._lock:
            try:
                self._ensure_ready()
                with self._conn:
                    done = []
                    for sql, params in statements:
                        cur = self._conn.execute(sql, storable(params))
                        if cur.rowcount == 0:
                            raise ChatDeleted(chat_id)
                        done.append(cur)
                    return done
            except sqlite3.Error as exc:
                if is_missing_parent(exc):
                    raise ChatDeleted(chat_id) from exc
                raise HistoryError(describe("Saving chat history failed", exc, self.path), locked=is_lock_error(exc)) from exc

    def _query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        if self.path is None or not self._ready:  # in memory, or not yet checked after a start under a lock
            with self._lock:
                return self._read(self._conn, sql, params, check_first=True)
        with self._read_lock:
            if self._reader is None:
                try:
                    self._reader = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
                    self._reader.text_factory = decoded
                    add_functions(self._reader)
                    self._reader.execute("PRAGMA query_only = ON")
                except sqlite3.Error as exc:
                    raise HistoryError(describe("Reading chat history failed", exc, self.path),
                                       locked=is_lock_error(exc)) from exc
            return self._read(self._reader, sql, params)

    def _read(self, conn: sqlite3.Connection, sql: str, params: Sequence[Any] | dict[str, Any],
              check_first: bool = False) -> list[tuple[Any, ...]]:
        try:
            if check_first:
                self._ensure_ready()
            return conn.execute(sql, storable(params)).fetchall()
        except sqlite3.Error as exc:
            raise HistoryError(describe("Reading chat history failed", exc, self.path), locked=is_lock_error(exc)) from exc

    # -- chats ---------------------------------------------------------------------

    def create_chat(self, title: str, profile: str | None, system_prompt: str | None = None,
                    sampling: dict[str, Any] | None = None) -> int:
        """Start a conversation and return its id."""
        now = time.time()
        cur = self._run(
            "INSERT INTO chats(title, profile, system_prompt, created, updated, sampling) VALUES (?,?,?,?,?,?)",
            (title, profile, system_prompt, now, now, to_json(sampling)),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def list_chats(self) -> list[ChatRecord]:
        """All chats, most recently updated first."""
        rows = self._query(f"SELECT {CHAT_COLUMNS} FROM chats c ORDER BY c.updated DESC, c.id DESC")
        return [chat_from_row(row) for row in rows]

    def search_chats(self, text: str) -> list[tuple[ChatRecord, str | None]]:
        """Chats whose title or a message contains ``text``, case-insensitive in any script
        (:func:`contains_folded`: SQLite's LIKE folds ASCII only, and "привет" found no
        "Привет"), most recently updated first, each with the first message that contains it (None:
        only the title does). A search longer than :data:`SEARCH_MAX_BYTES` is a :class:`HistoryError`
        saying so."""
        if len(text.encode("utf-8", "surrogatepass")) > SEARCH_MAX_BYTES:  # a lone surrogate is written as U+FFFD
            raise HistoryError(f"The search is too long ({len(text):,} characters): search for a shorter part of it.")
        rows = self._query(
            f"SELECT {CHAT_COLUMNS}, found FROM (SELECT *, (SELECT m.content FROM messages m WHERE"
            " m.chat_id = chats.id AND contains_folded(CAST(m.content AS BLOB), :p) ORDER BY m.id LIMIT 1) AS found"
            " FROM chats) c WHERE contains_folded(CAST(c.title AS BLOB), :p) OR found IS NOT NULL"
            " ORDER BY c.updated DESC, c.id DESC",
            {"p": text.casefold()})
        return [(chat_from_row(row[:-1]), row[-1]) for row in rows]

    def get_chat(self, chat_id: int) -> ChatRecord | None:
        """One chat, or None if it does not exist."""
        rows = self._query(f"SELECT {CHAT_COLUMNS} FROM chats c WHERE c.id = ?", (chat_id,))
        return chat_from_row(rows[0]) if rows else None

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._run("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def set_system_prompt(self, chat_id: int, system_prompt: str | None) -> None:
        """Set the chat's own system prompt; None means "use the profile's"."""
        self._run("UPDATE chats SET system_prompt = ? WHERE id = ?", (system_prompt, chat_id))

    def set_sampling(self, chat_id: int, sampling: dict[str, Any] | None) -> None:
        """Set the chat's own sampling; None follows the profile's."""
        self._run("UPDATE chats SET sampling = ? WHERE id = ?", (to_json(sampling), chat_id))

    def set_profile(self, chat_id: int, profile: str | None) -> None:
        self._run("UPDATE chats SET profile = ?, updated = ? WHERE id = ?", (profile, time.time(), chat_id))

    def delete_chat(self, chat_id: int) -> None:
        """Delete a chat and its messages (in one transaction). Its id is never given to another
        chat, so a window that still has it open is refused (:class:`ChatDeleted`), never mixed in."""
        with self._lock:
            self.deleted_here.add(chat_id)
            try:
                self._ensure_ready()
                with self._conn:
                    self._conn.execute("DELETE FROM messages WHERE chat_id = ?", (chat_id,))
                    self._conn.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
            except sqlite3.Error as exc:
                self.deleted_here.discard(chat_id)  # not deleted: a delete elsewhere later is not this one
                raise HistoryError(describe("Deleting the chat failed", exc, self.path), locked=is_lock_error(exc)) from exc

    # -- messages ------------------------------------------------------------------

    def add_message(
        self,
        chat_id: int,
        role: str,
        content: str,
        *,
        profile: str | None = None,
        stats: dict[str, Any] | None = None,
        pieces: Pieces | None = None,
        finish_reason: str | None = None,
    ) -> int:
        """Append a message to a chat and return its id; :class:`ChatDeleted` if the chat is gone."""
        now = time.time()
        cur, _ = self._write_chat(chat_id, (
            ("INSERT INTO messages(chat_id, role, content, profile, stats, pieces, finish_reason, created)"
             " VALUES (?,?,?,?,?,?,?,?)",
             (chat_id, role, content, profile, to_json(stats), to_json(pieces), finish_reason, now)),
            ("UPDATE chats SET updated = ?, profile = coalesce(?, profile) WHERE id = ?", (now, profile, chat_id)),
        ))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def update_message(
        self,
        chat_id: int,
        message_id: int,
        content: str,
        *,
        stats: dict[str, Any] | None = None,
        pieces: Pieces | None = None,
        finish_reason: str | None = None,
    ) -> None:
        """Rewrite a (streaming) message of chat ``chat_id`` with its text so far;
        :class:`ChatDeleted` if the chat (and so the message) is gone."""
        self._write_chat(chat_id, ((
            "UPDATE messages SET content = ?, stats = ?, pieces = ?, finish_reason = ? WHERE id = ? AND chat_id = ?",
            (content, to_json(stats), to_json(pieces), finish_reason, message_id, chat_id),
        ),))

    def mark_superseded(self, chat_id: int, first_id: int) -> None:
        """Mark prompt ``first_id`` and its replies (every later message of the chat up to the next
        prompt) as replaced (an edited prompt is about to follow them); repeating it changes
        nothing. Nothing is marked unless ``first_id`` is a message of this chat (a row of a chat
        deleted since is not). Up to the next prompt, not to the end: a second window's later
        exchanges in the same chat were marked replaced too (a hostile tester's)."""
        self._run("UPDATE messages SET superseded = 1 WHERE chat_id = ? AND id >= ?"
                  " AND id < COALESCE((SELECT MIN(id) FROM messages WHERE chat_id = ? AND role = 'user'"
                  " AND id > ?), 9223372036854775807)"
                  " AND EXISTS (SELECT 1 FROM messages WHERE id = ? AND chat_id = ?)",
                  (chat_id, first_id, chat_id, first_id, first_id, chat_id))

    def has_message(self, chat_id: int, message_id: int) -> bool:
        """True if message ``message_id`` is in chat ``chat_id``."""
        return bool(self._query("SELECT 1 FROM messages WHERE id = ? AND chat_id = ?", (message_id, chat_id)))

    def recent_prompts(self, limit: int = 200) -> list[str]:
        """The last ``limit`` prompts the user sent, in any chat, oldest first (for Up in the prompt box)."""
        rows = self._query("SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT ?", (limit,))
        return [str(row[0]) for row in reversed(rows)]

    def chat_ids(self) -> set[int]:
        """The ids of every chat in the file (another window's deletes show here)."""
        return {int(row[0]) for row in self._query("SELECT id FROM chats")}

    def drafting_texts(self, max_chars: int) -> list[str]:
        """Prompts and replies of every chat, oldest first: the newest up to ``max_chars``
        characters in all (for the suffix drafter, which drafts from earlier chats)."""
        rows = self._query("SELECT content FROM (SELECT id, content, SUM(LENGTH(content)) OVER (ORDER BY id DESC)"
                           " AS seen FROM messages WHERE role IN ('user', 'assistant') AND content != '')"
                           " WHERE seen <= ? ORDER BY id", (max_chars,))
        return [str(row[0]) for row in rows]

    def messages(self, chat_id: int) -> list[MessageRecord]:
        """A chat's messages in order."""
        rows = self._query(
            "SELECT id, chat_id, role, content, profile, stats, pieces, finish_reason, created, superseded"
            " FROM messages WHERE chat_id = ? ORDER BY id",
            (chat_id,),
        )
        return [message_from_row(row) for row in rows]
