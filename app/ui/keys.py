"""The App's keys, in one table: what the footer, the help screen and the command palette show."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer

BINDINGS: list[BindingType] = [
    Binding("escape", "stop", "Stop", tooltip="stop the reply, keeping what was written (or a profile's load)"),
    # Not a priority key: a selection in the prompt box or on screen is copied first.
    Binding("ctrl+c", "interrupt", "Stop", show=False,
            tooltip="as Esc, the way ollama stops a reply (a selection is copied instead)"),
    # All but Esc are priority keys: the app runs them as it reads them, before the
    # keys typed after them, which then reach the dialog they open (F2 Enter picks a
    # profile instead of sending the prompt; see app.ui.screens.dialog). F6 and F7 are
    # the prompt box's select-line/select-all too: priority makes them the app's.
    Binding("f1", "help", "Help", priority=True, tooltip="the keys, the HUD's figures and where files live"),
    Binding("f2", "pick_profile", "Profile", priority=True, tooltip="switch the model pair this chat talks to"),
    Binding("f3", "chats", "Chats", priority=True, tooltip="search, open, rename, delete or export saved chats"),
    # Short names: all of them fit the footer at 80 columns (the palette and F1 say more).
    Binding("f4,ctrl+t", "toggle_sources", "Colour", priority=True,
            tooltip="colour each token: draft accepted vs target produced"),
    Binding("f5", "toggle_speculation", "Spec", key_display="f5", priority=True,
            tooltip="speculative decoding on or off"),
    Binding("f6", "toggle_hud", "HUD", priority=True, tooltip="the side panel, or one status line"),
    Binding("f7", "copy", "Copy", priority=True, tooltip="the last reply, a message or a code block"),
    # Quit before New chat: while a reply streams, Esc's "Stop" leaves 80 columns one key short,
    # and the one cut off should not be the way out.
    Binding("ctrl+q", "quit", "Quit", priority=True, tooltip="leave specchat (unsent text comes back next time)"),
    Binding("ctrl+n", "new_chat", "New chat", priority=True, tooltip="an empty chat (the open one stays saved)"),
    Binding("ctrl+r", "regenerate", "Regenerate", show=False, priority=True,
            tooltip="answer the last prompt again (the earlier reply stays)"),
    Binding("ctrl+g", "edit_last_prompt", "Edit last prompt", show=False, priority=True,
            tooltip="change the last prompt and ask again (the earlier exchange stays)"),
    Binding("f8", "edit_system_prompt", "System prompt", show=False, priority=True,
            tooltip="this chat's instructions to the model"),
    Binding("f9", "export_chat", "Export", show=False, priority=True,
            tooltip="the chat as Markdown with its statistics"),
    Binding("f10", "sampling", "Sampling…", show=False, priority=True,
            tooltip="temperature, top-p, top-k and seed for this chat"),
]
MAIN_SCREEN_ACTIONS = frozenset(b.action for b in BINDINGS if isinstance(b, Binding)) - {"quit", "stop", "interrupt"}
"""The keys that act on the chat: a dialog on top takes them instead."""

EXTRA_COMMANDS = [
    ("Copy last reply", "the last reply to the clipboard", "copy_last_reply"),
    ("Copy last code block", "the last code block of the replies to the clipboard", "copy_last_code"),
    ("New private chat", "a chat that is not saved and that no later chat is drafted from", "new_chat(True)"),
]
"""Commands only the palette offers: (title, help, action)."""


class KeysFooter(Footer):
    """Textual's footer with its keys in :data:`BINDINGS`' order (Esc, F1 to F7, ctrl+q, ctrl+n).
    Textual orders them as it meets them from the focused widget up: the prompt box's own f6
    and f7 (select line, select all: the App's keys win) and the base App's ctrl+q came first,
    so the footer read "f6 HUD f7 Copy ^q Quit f1 Help …"."""

    def compose(self) -> ComposeResult:
        order = {b.action: i for i, b in enumerate(BINDINGS) if isinstance(b, Binding)}
        yield from sorted(super().compose(), key=lambda key: order.get(getattr(key, "action", ""), len(order)))
