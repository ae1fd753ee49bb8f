"""Text from outside (a model, a server, a saved chat, a profile, a paste) made safe to show on a terminal.

A terminal obeys control characters and escape sequences wherever they appear
in what it is given: ``ESC ] 0 ; … BEL`` sets the window title, ``ESC ] 52 ; c ;
…`` writes the clipboard, ``ESC [ 2 J`` clears the screen, and the 8-bit C1
forms (``\\x9b`` for ``ESC [``, ``\\x9d`` for ``ESC ]``, ``\\x90`` for DCS) do the
same on terminals that read them. Textual passes such characters in a widget's
text straight through to the terminal, as ``print`` does.

:func:`inert` shows every such character as a visible stand-in instead, as
``less`` and ``git`` do with untrusted text: a C0 control as its Unicode
Control Picture (ESC as ``␛``, BEL as ``␇``), DEL as ``␡``, a C1 control or a
bidirectional override as ``<U+009B>``, ``<U+202E>``. An escape sequence therefore stays readable, character for
character (``␛]52;c;cm0gLXJmIH4=␇``), and can no longer act: the terminal only
starts a sequence at a real ESC or C1 byte, and none is left. Line feeds and
tabs are kept; a carriage return ends a line only as ``\\r\\n`` (a lone ``\\r``,
which would let text overwrite the start of its own line, is shown as ``␍``).

The mapping is per character, so pieces of a stream can be made inert one at a
time and joined: the result is the same as the whole text made inert (but for a
``\\r\\n`` split between two pieces, which shows as ``␍`` then a new line).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

_UNSAFE = re.compile(r"\r\n|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""C0 controls but for tab and line feed (a CR LF pair is matched whole), DEL, C1 controls, and
the bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069): in a terminal
that reorders text they make a line read in another order than its characters run ("Trojan
Source", CVE-2021-42574), e.g. a command copied from a reply. Right-to-left text needs none of them.
Lone surrogates too (no character: a terminal's UTF-8 cannot carry one, and printing it raised)."""


def _stand_in(match: re.Match[str]) -> str:
    ch = match.group()
    if ch == "\r\n":
        return "\n"
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)  # Unicode Control Pictures: U+241B SYMBOL FOR ESCAPE, ...
    if code == 0x7F:
        return "\u2421"  # SYMBOL FOR DELETE
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"  # a lone surrogate: REPLACEMENT CHARACTER
    return f"<U+{code:04X}>"


_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def without_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate (no character: what JSON's ``\\ud800`` alone decodes to,
    and what Python keeps of bytes that are not UTF-8) as U+FFFD, so that UTF-8 can write it (a
    terminal, SQLite). A well-formed pair is one character already and stays."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def inert(text: str) -> str:
    """``text`` with every control character but ``\\n`` and ``\\t`` (C0, DEL, C1, so every
    escape sequence's start, and the bidirectional overrides) replaced by a visible stand-in;
    ``\\r\\n`` becomes ``\\n``."""
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(_stand_in, text)


def is_inert(text: str) -> bool:
    """Whether ``text`` holds nothing a terminal would act on (what :func:`inert` returns)."""
    return not _UNSAFE.search(text)


_JSON_RAW = re.compile(r"[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def json_text(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, **kwargs)`` with DEL, the C1 controls and the
    line/paragraph separators written as ``\\uXXXX`` escapes too: JSON escapes only the C0
    controls itself, and a raw ``\\x9b`` would reach the terminal the JSON is printed on.
    Those characters occur only inside JSON strings, so escaping them keeps the same value.
    A float that is not finite is written ``null``: ``Infinity`` is no JSON, and strict
    parsers refuse the whole document."""
    text = json.dumps(_finite(obj), ensure_ascii=False, allow_nan=False, **kwargs)
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float (in dicts, lists and tuples) as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
