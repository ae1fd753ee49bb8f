"""Runs the app on the fake backend in a real terminal (driven by test_smoke_tty)."""
from __future__ import annotations

import sys

from app.ui.app import SpecChatApp
from tests.app.fakes import FakeLoader, make_profiles

if __name__ == "__main__":
    app = SpecChatApp(loader=FakeLoader(delay=0.05), profiles_loader=make_profiles)
    app.run()
    sys.exit(app.return_code or 0)
