"""What the app writes to the terminal, for the tests that check nothing from outside is obeyed.

Under ``run_test`` Textual's headless driver writes nothing; :func:`screen_output` renders
the whole screen as the real driver would write it for a full repaint (Textual's own
``CompositorUpdate.render_segments``: the text with Textual's styles and cursor moves).
:func:`foreign_controls` takes out the sequences Textual writes itself and returns
whatever control characters are left: there must be none.
"""
from __future__ import annotations

import re

from textual.app import App

_TEXTUAL_OWN = re.compile(
    r"\x1b\[[0-9;:]*m"  # colours and styles
    r"|\x1b\[\d+;\d+H|\x1b\[\d*[ABCDGK]"  # cursor moves, clearing to the end of a line
    r"|\x1b\]8;id=[^;\x1b\x07]*;[^\x1b\x07]*\x1b\\|\x1b\]8;;\x1b\\"  # Textual's own links (with an id)
)


def screen_output(app: App) -> str:  # type: ignore[type-arg]
    """The text a full repaint of the app's screen writes to the terminal."""
    return app.screen._compositor.render_update(full=True).render_segments(app.console)


def foreign_controls(output: str) -> list[str]:
    """The control characters (C0 but \\n, DEL, C1, the bidirectional overrides) left once Textual's
    own sequences are taken out, each with a little context."""
    rest = _TEXTUAL_OWN.sub("", output)
    return [repr(rest[max(0, m.start() - 12):m.end() + 12])
            for m in re.finditer(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", rest)]
