"""What can go wrong talking to a server, said so that the user knows what to check.

Every failure is a :class:`ServerError` (an :class:`~engine.errors.EngineError`) whose ``kind``
names the case: ``refused``, ``auth``, ``not_found``, ``http``, ``timeout``, ``cut`` (the stream
stopped before the reply ended), ``malformed`` (not JSON) or ``server`` (the server reported an
error inside the stream). A server's own words are quoted on one line, cut short, made inert.
"""
from __future__ import annotations

import datetime
import json
import re
from email.utils import parsedate_to_datetime
from typing import Any

from engine.config.server import ServerSpec
from engine.errors import EngineError
from engine.text_safety import inert

MAX_MESSAGE_CHARS = 1000
"""The most of an error's text shown (a server's own message is quoted in it)."""


class ServerError(EngineError):
    """A request to the server failed; ``kind`` says how, ``status`` the HTTP status if any."""

    def __init__(self, kind: str, message: str, status: int | None = None, retry_after_s: float | None = None) -> None:
        if len(message) > MAX_MESSAGE_CHARS:  # it quotes the server: 200,000 characters were printed whole
            message = message[:MAX_MESSAGE_CHARS] + f"… ({len(message) - MAX_MESSAGE_CHARS:,} characters more)"
        super().__init__(inert(message))  # it quotes the server, and is shown on a terminal
        self.kind = kind
        self.status = status
        self.retry_after_s = retry_after_s
        """The seconds the server asked to wait before trying again (its ``Retry-After``), if it said."""


RETRY_AFTER_MAX_S = 3600.0
"""The longest ``Retry-After`` read as given (a larger one is still a wait of an hour or more)."""


def retry_after(header: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: a number of seconds or an HTTP date (None when absent
    or unreadable)."""
    if not header:
        return None
    header = header.strip()
    try:
        seconds = float(header)
    except ValueError:
        try:
            when = parsedate_to_datetime(header)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:
            return None
        seconds = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)




def error_message(payload: Any) -> str:
    """The human part of an OpenAI-style ``{"error": {"message": ...}}`` body (or FastAPI's
    ``{"detail": ...}``, whose list of problems is joined by their messages)."""
    if isinstance(payload, dict) and "error" not in payload and "detail" in payload:  # FastAPI-style bodies
        detail = payload["detail"]
        if isinstance(detail, list):
            return "; ".join(str(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in detail)
        return str(detail)
    err = payload.get("error", payload) if isinstance(payload, dict) else payload
    if isinstance(err, dict):
        return str(err.get("message") or err.get("msg") or err)
    return str(err)


_TAG = re.compile(r"<(script|style)\b.*?</\1\s*>|<!--.*?-->|<[^>]*>", re.S | re.I)


def one_line(text: str, limit: int = 200) -> str:
    """A server's text for a one-line message: an HTML page's tags, scripts and comments dropped,
    white space run together, at most ``limit`` characters."""
    if text.lstrip().startswith("<"):
        text = _TAG.sub(" ", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def http_error(status: int, url: str, raw: bytes, spec: ServerSpec, retry_after_s: float | None = None) -> ServerError:
    """The error for an HTTP status >= 400, with the server's own message on one line and, where
    the server said how long to wait (``retry_after_s``), when to try again."""
    text = spec.hide_secrets(raw.decode("utf-8", "replace").strip())  # before any cut: no key's head shows
    try:  # and again once parsed: JSON's escapes ("sk-ab\\/cd", "\\u00e4") hid the secret from the first
        detail = one_line(spec.hide_secrets(error_message(json.loads(text))))
    except (ValueError, RecursionError):
        detail = one_line(text)
    said = f" (the server says: {detail})" if detail else ""
    if status in (401, 403):
        fix = (f"check the key in ${spec.api_key_env}" if spec.api_key_env else
               "check the user and password in the url" if spec.basic_authorization() else
               "the server wants an API key: put it in an environment variable and name it with "
               "--api-key-env, or api_key_env in the profile (e.g. api_key_env = \"OPENAI_API_KEY\")")
        return ServerError("auth", f"{url}: {status} {'unauthorized' if status == 401 else 'forbidden'}: {fix}{said}",
                           status)
    if status == 404:
        return ServerError("not_found", f"{url}: 404 not found: check the url (the server's root, e.g. "
                                        f"http://127.0.0.1:8080) and the model name{said}", status)
    again = f"; it asks to try again in {retry_after_s:.0f} s" if retry_after_s is not None else ""
    return ServerError("http", f"{url}: HTTP {status}{said}{again}", status, retry_after_s)
