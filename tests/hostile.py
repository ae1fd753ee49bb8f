"""Escape sequences a hostile model, server or file may send, for the terminal-safety tests."""
from __future__ import annotations

HOSTILE: dict[str, str] = {
    "osc0-title": "\x1b]0;pwned\x07",
    "osc8-link": "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "osc52-clipboard": "\x1b]52;c;cm0gLXJmIH4=\x07",
    "csi-clear": "\x1b[2J",
    "dcs": "\x1bP1$r0m\x1b\\",
    "c1-csi": "\x9b2J",
    "c1-osc": "\x9d0;pwned\x07",
    "bidi-override": "rm -rf ~ \u202e#\u2066 harmless\u2069\u202c",
}
"""Name: sequence (OSC 0 window title, OSC 8 hyperlink, OSC 52 clipboard write, CSI 2J
clear screen, a DCS string, the 8-bit CSI and OSC, bidirectional overrides that make a line
read in another order than it runs)."""

ALL = "".join(f"<{name}>{seq}" for name, seq in HOSTILE.items())
"""Every sequence in one text, each after a visible marker."""

RAW = ("\x1b", "\x07", "\x90", "\x9b", "\x9d", "\x9c", "\u202e", "\u2066", "\u2069", "\u202c")
"""Characters that must never reach the terminal from outside text."""


def raw_in(text: str) -> list[str]:
    """The raw controls of :data:`RAW` that ``text`` still holds."""
    return [c for c in RAW if c in text]
