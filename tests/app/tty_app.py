"""Runs the app on the fake backend in a real terminal (driven by test_smoke_tty)."""
from __future__ import annotations

import os
import sys

from app.ui.app import SpecChatApp
from tests.app.fakes import FakeLoader, make_profiles

LONG_REPLY = [[(f"word{i} " + ("\n\n" if i % 12 == 11 else ""), "draft" if i % 3 else "target")] for i in range(3000)]
"""A reply that streams for about 15 s (``TTY_APP_LONG=1``): the terminal can be closed under it."""

if __name__ == "__main__":
    long = os.environ.get("TTY_APP_LONG") == "1"
    loader = FakeLoader(delay=0.005, script=LONG_REPLY) if long else FakeLoader(delay=0.05)
    app = SpecChatApp(loader=loader, profiles_loader=make_profiles)
    app.run()
    if app.exit_note:  # as the command prints it (app.cli)
        print(app.exit_note, file=sys.stderr)
    sys.exit(app.return_code or 0)
