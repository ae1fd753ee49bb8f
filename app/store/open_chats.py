"""Which saved chats another specchat window shows, so that two windows do not write one chat.

Each window holds an exclusive ``flock`` on ``open-chats/<chat id>.lock`` beside the history
database for the chat it shows (:meth:`OpenChats.show`); another window asks whether a chat is
shown elsewhere (:meth:`OpenChats.elsewhere`) by trying that lock without waiting. The kernel
lets go of a lock when its process ends, however it ends, so a crashed window never leaves a
chat marked as open. Two windows that each wrote into one chat saved an interleaving that
neither showed, and what each window's model had seen no longer matched the saved chat.

The lock files stay (empty, one per chat ever shown): removing one while another window may
be opening it would let two windows each hold a lock on a different file for the same chat.
Without ``fcntl`` (not on Linux or macOS) or without a history file, nothing is locked and no
chat is ever shown elsewhere.
"""
from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

FOLDER = "open-chats"
"""The lock files' folder, beside the history database."""


class OpenChats:
    """The lock of the chat this window shows, and questions about other windows' (one per App)."""

    def __init__(self, history_file: Path | None) -> None:
        self._folder = history_file.parent / FOLDER if history_file is not None and fcntl is not None else None
        self._held: tuple[int, int] | None = None  # (chat id, file descriptor)

    @property
    def shown(self) -> int | None:
        """The chat whose lock this window holds."""
        return self._held[0] if self._held is not None else None

    def show(self, chat_id: int | None) -> bool:
        """This window now shows ``chat_id`` (None: an unsaved or private chat): the lock of the
        chat shown before is let go of and this one's taken. False when another window holds it
        (both then show it; the caller has said so)."""
        if chat_id is not None and chat_id == self.shown:
            return True
        self.release()
        if chat_id is None or self._folder is None:
            return True
        fd = self._open(chat_id, create=True)
        if fd is None:
            return True  # the folder cannot be written: nothing to hold, nothing to tell
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._held = (chat_id, fd)
        return True

    def elsewhere(self, chat_id: int) -> bool:
        """Whether another specchat window shows ``chat_id`` now."""
        if self._folder is None or chat_id == self.shown:
            return False
        fd = self._open(chat_id, create=False)
        if fd is None:
            return False  # no window ever showed it (a window makes the file before it locks it)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # closing lets go of a lock taken just to ask
        return False

    def release(self) -> None:
        """Let go of the shown chat's lock (a new chat, or the app closing)."""
        if self._held is not None:
            os.close(self._held[1])
            self._held = None

    def _open(self, chat_id: int, create: bool) -> int | None:
        assert self._folder is not None
        try:
            if create:
                self._folder.mkdir(parents=True, exist_ok=True)
            flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
            return os.open(self._folder / f"{int(chat_id)}.lock", flags, 0o600)
        except OSError:
            return None
