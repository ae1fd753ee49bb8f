"""Editing keys in the order typed: a text box runs its own key bindings as the key arrives.

Textual inserts a printable key in the focused widget's ``_on_key`` at once, but runs the
widget's key bindings (Home, ctrl+u, ctrl+w, the arrows…) only after the key has bubbled up
through every parent, a hop of the message queue each. Keys that come in one read (a fast
typist, a paste of keys, a laggy SSH link) were then applied out of order: ``Home H`` typed
"helloH", ``ctrl+u Quick`` in F3's rename box left it empty. Running the widget's own binding
from its ``_on_key`` does what Textual would do at the end of the bubbling, before the next key.
The app's keys are priority bindings: Textual runs those before the widget sees the key.
"""
from __future__ import annotations

from textual import events
from textual.widget import Widget
from textual.widgets import Input, TextArea


async def run_own_binding(widget: Widget, event: events.Key) -> bool:
    """Run ``widget``'s own (non-priority) binding for ``event`` now; answers whether one ran
    (the event is then stopped, as Textual stops a key a binding handled)."""
    for binding in widget._bindings.key_to_bindings.get(event.key, ()):
        if not binding.priority and await widget.app.run_action(binding.action, widget):
            event.stop()
            event.prevent_default()
            return True
    return False


class OrderedInput(Input):
    """Textual's one-line Input, its editing keys taken in the order typed."""

    async def _on_key(self, event: events.Key) -> None:
        if await run_own_binding(self, event):
            return
        await super()._on_key(event)


class OrderedTextArea(TextArea):
    """Textual's TextArea, its editing keys taken in the order typed."""

    async def _on_key(self, event: events.Key) -> None:
        if await run_own_binding(self, event):
            return
        await super()._on_key(event)
