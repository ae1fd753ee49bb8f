"""Short names: a profile's pair, a chat's title."""
from __future__ import annotations

from app.ui.labels import chat_title, profile_pair, shown_title
from tests.app.fakes import make_profiles


def test_profile_pair_and_titles() -> None:
    profiles = make_profiles()
    assert profile_pair(profiles.get("fast")) == "Target-1.7B (nf4) ← Draft-135M"
    assert profile_pair(profiles.get("lookup")) == "Target-360M ← n-gram lookup"
    assert chat_title("\n  first line\nsecond") == "first line"
    assert len(chat_title("x" * 100)) == 48


def test_the_header_names_the_profile_after_a_private_chat_marker() -> None:
    from app.ui.labels import header_title, profile_pair
    from tests.app.fakes import make_profiles

    fast = make_profiles().get("fast")
    assert header_title(fast) == f"fast · {profile_pair(fast)}"
    assert header_title(fast, private=True) == f"private chat · fast · {profile_pair(fast)}"
    assert header_title(None, private=True) == "private chat" and header_title(None) == ""


def test_an_empty_or_blank_title_reads_untitled() -> None:
    """A history file edited by hand: a chat titled "" showed only its "● open" badge in F3."""
    assert shown_title("") == shown_title(" \n\t ") == "(untitled)"
    assert shown_title("  two\nlines  ") == "two lines"
