"""The desktop's clipboard, where the terminal's may not reach.

F7 sends text to the terminal with OSC 52, which many terminals ignore without a word (tmux
without ``set-clipboard``, macOS Terminal, most terminals over SSH): the app cannot tell whether
anything arrived. Where a desktop clipboard tool is at hand it is used as well, and only then
does the app say "Copied"; otherwise it says what it sent and what to set.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping

TOOLS: tuple[tuple[tuple[str, ...], str | None, str | None], ...] = (
    (("wl-copy",), "WAYLAND_DISPLAY", None),
    (("xclip", "-selection", "clipboard"), "DISPLAY", None),
    (("xsel", "--clipboard", "--input"), "DISPLAY", None),
    (("pbcopy",), None, "darwin"),
    (("clip.exe",), "WSL_DISTRO_NAME", None),
)
"""Each tool's command, the environment variable that says its desktop is there, and the platform
it needs (None: any)."""
TIMEOUT_S = 2.0
"""The most a tool may take (they return at once: the X11 ones leave a child serving the selection)."""


def desktop_copy(text: str, env: Mapping[str, str] | None = None, platform: str = sys.platform) -> str | None:
    """Put ``text`` on the desktop's clipboard with the first tool that is installed, has its
    desktop and succeeds; returns its name, or None when none did."""
    env = os.environ if env is None else env
    for argv, needs, only_on in TOOLS:
        if (needs is not None and not env.get(needs)) or (only_on is not None and platform != only_on):
            continue
        path = shutil.which(argv[0], path=env.get("PATH"))
        if path is None:
            continue
        try:
            done = subprocess.run([path, *argv[1:]], input=text.encode("utf-8"), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=TIMEOUT_S, check=False, env=dict(env))
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return argv[0]
    return None


def sent_notice(what: str, size: str, env: Mapping[str, str] | None = None) -> str:
    """What to say when only the terminal was sent ``what`` (OSC 52), and what to set if it does not paste."""
    env = os.environ if env is None else env
    hint = " In tmux: set -g set-clipboard on." if env.get("TMUX") else ""
    return (f"Sent {what} to the terminal's clipboard (OSC 52): {size}. If it does not paste, the terminal "
            f"ignores OSC 52, and no wl-copy, xclip or xsel was found here.{hint}")
