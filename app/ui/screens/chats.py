"""Past chats: search, reopen, rename, delete, export, or start a new one.

The search box (``/`` or ctrl+f from the list) filters the chats by title and message
text as it is typed (:meth:`app.store.history.History.search_chats`); a match in a
message shows the words around it. Enter in the box opens the highlighted match, Down
goes to the list.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

from textual.app import ComposeResult
from textual.actions import SkipAction
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Footer, Input, Label, OptionList
from textual.widgets.option_list import Option

from app.store.history import ChatRecord, HistoryError
from app.ui.archive import Archive
from app.ui.export import ask_export
from app.ui.key_order import OrderedInput
from app.ui.screens.dialog import Dialog, HoldsKeys
from app.ui.labels import message_count, shown_title
from app.ui.screens.edit import ConfirmScreen, EditScreen
from engine.text_safety import inert

ChatsResult = tuple[str, "int | None"]
"""``("open", chat_id)`` or ``("new", None)``."""


TITLE_KEPT = 200
"""The most characters a title renamed by hand keeps."""

ROWS_SHOWN = 200
"""The most chats the list shows at once (the newest); a search reaches the others. Rows for
5,000 chats took most of a second to build each time the list was filled."""

SEARCH_PAUSE_S = 0.15
"""How long typing in the search box pauses before the search runs."""

SNIPPET_CHARS = 60
"""About how much of a matching message a search result shows."""


def folded_find(text: str, query: str) -> int:
    """Where ``query`` first stands in ``text``, case folded as the history's search folds it
    (:func:`~app.store.db_file.contains_folded`), as an index into ``text``; -1 when it does not.
    A character may fold to several ("ß" to "ss"): each folded one maps back to its own."""
    folded, origin = [], []
    for i, char in enumerate(text):
        part = char.casefold()
        folded.append(part)
        origin.extend([i] * len(part))
    at = "".join(folded).find(query.casefold())
    return origin[at] if at >= 0 else -1


def snippet(text: str, query: str, width: int = SNIPPET_CHARS) -> str:
    """The words of ``text`` around the first ``query`` (found as the search found it, case folded
    in any script), on one line, with … where text was cut."""
    flat = " ".join(text.split())
    at = max(folded_find(flat, " ".join(query.split())), 0)
    start = max(0, min(at - width // 3, len(flat) - width))
    part = flat[start:start + width]
    return ("…" if start > 0 else "") + part + ("…" if start + width < len(flat) else "")


def chat_option(chat: ChatRecord, current: bool, found: str | None = None, elsewhere: bool = False) -> Option:
    """A saved chat's row (``found``: the words of a message that matched a search; ``elsewhere``:
    another specchat window shows it); its title, profile and messages come from the history
    file: shown, never obeyed."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated))
    return Option(
        Content.assemble(
            (inert(shown_title(chat.title)), "bold"),
            ("  ● open" if current else "", "$text-success"),
            ("  ◐ open in another window" if elsewhere else "", "$text-warning"),
            "\n  ",
            (inert(f"{when} · {chat.profile or '—'} · {message_count(chat.message_count)}"), "$text-muted"),
            *(("\n  ", (inert(found), "italic")) if found else ()),
        ),
        id=str(chat.id),
    )


class ChatsScreen(Dialog["ChatsResult | None"]):
    """The list of saved chats, read from and changed in ``archive``; ``current`` is the open chat."""

    class Deleted(Message):
        """A chat was deleted here (the open one may be among them); ``prompts``: what its user
        messages said, which Up in the prompt box no longer recalls."""

        def __init__(self, chat_id: int, prompts: tuple[str, ...] = ()) -> None:
            super().__init__()
            self.chat_id = chat_id
            self.prompts = prompts

    class Renamed(Message):
        """A chat was renamed here (the open one's header follows)."""

        def __init__(self, chat_id: int, title: str) -> None:
            super().__init__()
            self.chat_id = chat_id
            self.title = title

    # Priority, like a dialog's Esc and Enter (app.ui.screens.dialog): the app runs them as it
    # reads them, so the keys typed right after r (a new name) are held for the rename box
    # instead of reaching this list first (where the n of "Plans" started a new chat).
    BINDINGS = [
        Binding("n", "new", "New chat", priority=True),
        Binding("r", "rename", "Rename", priority=True),
        Binding("d,delete", "delete", "Delete", priority=True),
        Binding("e", "export", "Export", priority=True),
        Binding("slash,ctrl+f", "search", "Search", priority=True),
        Binding("down", "to_list", "To the list", show=False),  # from the search box
    ]

    def __init__(self, archive: Archive, current: int | None) -> None:
        super().__init__()
        self._archive = archive
        self._current = current
        self._shown = ""
        """The search the list shows (what was typed since is searched once typing pauses)."""
        self._pause_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog chats-dialog"):
            yield Label("Chats", classes="dialog-title")
            yield Label("Enter opens · n new · r rename · d delete · e export · Esc closes",
                        classes="dialog-hint")
            yield OrderedInput(placeholder="/ searches titles and messages", id="chat-search")
            yield OptionList(id="chat-list")
        yield Footer()

    def on_mount(self) -> None:
        self._reload()
        self.query_one(OptionList).focus()

    def _reload(self) -> None:
        """Fill the list from the history (or the search), then fit it to the dialog again: a
        search that empties the box can bring back more rows than the dialog holds."""
        self._show(self._query(), *self._find(self._query()))

    def _query(self) -> str:
        return self.query_one("#chat-search", Input).value

    def _find(self, query: str) -> tuple[list[tuple[ChatRecord, str | None]], str | None]:
        """The chats to list for ``query`` (all of them for none), or why they could not be read.
        Safe on any thread: it reads the history only."""
        history = self._archive.history
        try:
            if history is None:
                return [], None
            if query.strip():
                return [(c, found and snippet(found, query)) for c, found in history.search_chats(query.strip())], None
            return [(c, None) for c in history.list_chats()], None
        except HistoryError as exc:
            return [], str(exc)

    def _show(self, query: str, chats: list[tuple[ChatRecord, str | None]], error: str | None,
              first: bool = False) -> None:
        """List ``chats`` (the first :data:`ROWS_SHOWN`), found for ``query``; ``first``: the first
        highlighted (a new search), else the row highlighted before, where it still is one."""
        self._shown = query
        option_list = self.query_one(OptionList)
        highlighted = None if first else option_list.highlighted
        option_list.clear_options()
        if error is not None:
            self.notify(inert(error), severity="error", markup=False)
        if not chats:
            shown = shown_title(query.strip())  # a pasted 30,000 characters filled the dialog
            empty = f"No chat contains “{inert(shown)}”." if query.strip() else "No saved chats yet."
            option_list.add_option(Option(Content.styled(empty, "$text-muted"), disabled=True))
        else:
            open_chats = self._archive.open_chats
            option_list.add_options(chat_option(c, c.id == self._current, found, open_chats.elsewhere(c.id))
                                    for c, found in chats[:ROWS_SHOWN])
            if len(chats) > ROWS_SHOWN:
                more = len(chats) - ROWS_SHOWN
                older = (f"{more:,} older match{'es' if more > 1 else ''}: type more to narrow the search"
                         if query.strip() else f"{more:,} older chat{'s' if more > 1 else ''}: / searches them")
                option_list.add_option(Option(Content.styled(f"… {older}", "$text-muted"), disabled=True))
            option_list.highlighted = 0 if highlighted is None else min(highlighted, min(len(chats), ROWS_SHOWN) - 1)
        self._fit_lists()

    def on_input_changed(self, event: Input.Changed) -> None:
        """The search box changed: once typing pauses (:data:`SEARCH_PAUSE_S`), the chats that
        match are found off the UI's thread and shown, the first highlighted. Found at every key
        on the UI's thread, 5,000 chats froze the dialog 0.7 s a key (a hostile test's)."""
        event.stop()
        if self._pause_timer is not None:
            self._pause_timer.stop()
        self._pause_timer = self.set_timer(SEARCH_PAUSE_S, self._search)

    def _search(self) -> None:
        query = self._query()

        def find() -> None:
            found = self._find(query)
            try:
                self.app.call_from_thread(self._found, query, *found)
            except RuntimeError:  # the app has quit meanwhile
                pass

        self.run_worker(find, thread=True, group="chat-search", exclusive=True, exit_on_error=False)

    def _found(self, query: str, chats: list[tuple[ChatRecord, str | None]], error: str | None) -> None:
        # else a later search is on its way, or this one was shown already (Down, Enter): the user's
        # highlight stays where they moved it
        if self.is_attached and query == self._query() and query != self._shown:
            self._show(query, chats, error, first=True)

    def action_search(self) -> None:
        """/ or ctrl+f: into the search box, holding the keys typed after it until the box has the
        focus: the letters of `/ dye` in one read reached the list's d (delete) and y (yes) first."""
        self._typing()
        release = cast(HoldsKeys, self.app).key_hold.hold()
        self.query_one("#chat-search", Input).focus()
        self.app.call_later(release)  # after the focus, which Textual sets from the app's queue

    def action_to_list(self) -> None:
        if isinstance(self.focused, Input):
            self._catch_up()  # Down and Enter at once opened a row of the list before the search
            self.query_one(OptionList).focus()

    def _catch_up(self) -> None:
        """Show the search typed so far now, where typing has not paused long enough for it."""
        if self._pause_timer is not None:
            self._pause_timer.stop()
        if self._shown != self._query():
            self._show(self._query(), *self._find(self._query()), first=True)

    def entered(self, value: str) -> None:
        """Enter in the search box opens the highlighted match (of this search: typed a moment
        ago, it is found now)."""
        self._catch_up()
        option = self.query_one(OptionList).highlighted_option
        if option is not None and not option.disabled:
            self.picked(option)

    def _selected_chat(self) -> ChatRecord | None:
        """The highlighted chat, as saved now (None: no chat, or it is gone)."""
        option = self.query_one(OptionList).highlighted_option
        history = self._archive.history
        if option is None or not option.id or history is None:
            return None
        try:
            chat = history.get_chat(int(option.id))
        except HistoryError as exc:
            self.notify(inert(str(exc)), severity="error", markup=False)
            return None
        if chat is None:  # deleted in another window since the list was read: say so, show the list as it is
            self.notify("That chat no longer exists (deleted in another window).", severity="warning", markup=False)
            self._reload()
        return chat

    def picked(self, option: Option) -> None:
        if option.id:
            self.dismiss(("open", int(option.id)))

    def _typing(self) -> None:
        """A letter typed into a text box here is text, not a command (SkipAction passes it on)."""
        if isinstance(self.focused, Input):
            raise SkipAction()

    def action_new(self) -> None:
        self._typing()
        self.dismiss(("new", None))

    def action_rename(self) -> None:
        self._typing()
        chat = self._selected_chat()
        if chat is None:
            return

        def done(title: str | None) -> None:
            title = " ".join((title or "").split())[:TITLE_KEPT]  # one line, as titles made from prompts are
            history = self._archive.history
            if title and history is not None:  # told only when it was renamed (not under a lock)
                self._write(lambda: history.rename_chat(chat.id, title), self.Renamed(chat.id, title))

        self.ask(EditScreen("Rename chat", inert(chat.title)), done)

    def action_delete(self) -> None:
        self._typing()
        chat = self._selected_chat()
        if chat is None:
            return

        def done(yes: bool | None) -> None:
            history = self._archive.history
            if yes and history is not None:
                said = tuple(m.content for m in self._archive.db(history.messages, chat.id) or () if m.role == "user")
                self._write(lambda: history.delete_chat(chat.id), self.Deleted(chat.id, said))  # or nothing changed

        elsewhere = (" It is open in another specchat window, which will save what it adds next to a new chat."
                     if self._archive.open_chats.elsewhere(chat.id) else "")
        self.ask(ConfirmScreen(inert(f"Delete “{shown_title(chat.title)}” and its {message_count(chat.message_count)}?{elsewhere}"),
                               enter_confirms=True,
                               hint="Enter or y deletes · Esc or n keeps it"), done)

    def _write(self, write: Callable[[], object], told: Message) -> None:
        """Run a history write (rename, delete) on a thread of its own, then tell the App ``told``
        and fill the list again; a failed write is reported and changes nothing. On the UI's
        thread, a write waiting out another program's lock froze the dialog and every key for
        the lock's 5 s (app.store.history.BUSY_TIMEOUT_S)."""
        app = self.app

        def changed() -> None:
            app.post_message(told)  # to the App itself: this dialog may have closed meanwhile
            if self.is_attached:
                self._reload()

        def run() -> None:
            if self._archive.done(write):
                try:
                    app.call_from_thread(changed)
                except RuntimeError:  # the app has quit meanwhile
                    pass

        app.run_worker(run, thread=True, group="history-writes", exit_on_error=False)  # outlives the dialog

    def action_export(self) -> None:
        self._typing()
        chat = self._selected_chat()
        history = self._archive.history
        if chat is None or history is None:
            return
        saver = self._archive.saver
        self.ask(*ask_export(history, chat.id, chat.title,
                             lambda text, severity: self.notify(inert(text), severity=severity,  # type: ignore[arg-type]
                                                                title="Export", markup=False),
                             saver.writing if saver is not None else tuple))
