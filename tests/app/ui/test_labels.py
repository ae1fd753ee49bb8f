"""Short names: a profile's pair, a chat's title."""
from __future__ import annotations

from app.ui.labels import chat_title, profile_pair
from tests.app.fakes import make_profiles


def test_profile_pair_and_titles() -> None:
    profiles = make_profiles()
    assert profile_pair(profiles.get("fast")) == "Target-1.7B (nf4) ← Draft-135M"
    assert profile_pair(profiles.get("lookup")) == "Target-360M ← n-gram lookup"
    assert chat_title("\n  first line\nsecond") == "first line"
    assert len(chat_title("x" * 100)) == 48
