"""Where a server profile points: URL, model name, and where its API key lives.

The key itself never appears in a models file: ``api_key_env`` names an
environment variable that holds it, read only when a request is made. A
user name and password in the URL (``http://user:secret@host:8080``) are sent
as HTTP Basic authorization and shown nowhere: every message, title and log
line names the server by :attr:`ServerSpec.root`, which reads
``http://user:***@host:8080``, and the spec's ``repr`` hides them too.
"""
from __future__ import annotations

import base64
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from engine.errors import EngineError, ProfileError

SERVER_KEYS: tuple[str, ...] = ("url", "model", "api_key_env", "timeout")
"""Profile keys that configure the connection (besides ``backend = "server"``)."""

DEFAULT_TIMEOUT_S = 120.0
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://|)(?P<userinfo>[^/?#]*)@")
"""A URL's user part, its scheme left out too (``user:secret@host``, a mistake still shown)."""
_LOOSE_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://|)(?P<userinfo>[^\s]*)@")
"""Everything up to the last ``@``: a password holding ``/``, ``?`` or ``#`` unescaped ends the URL's
user part early for a parser, and the rest is still the password to the eye."""
NOT_A_VARIABLE = ("api_key_env must name an environment variable (like OPENAI_API_KEY), and what was given is not "
                  "a variable's name (it is not repeated here, in case it is the key itself); "
                  "never put the key itself in a models file or on the command line")


_CONVENTIONAL_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def shown_env_name(name: str) -> str:
    """``api_key_env`` as it may be printed: a name in capitals (``OPENAI_API_KEY``) or a short
    one as it is; a long name in mixed or lower case (a token such as ``ghp_16C7e42F…`` is a
    valid name too) as ``(not shown)``, in case the key itself was given instead of its name."""
    return name if _CONVENTIONAL_NAME.fullmatch(name) or len(name) < 20 else "(not shown)"


def redact_url(url: str) -> str:
    """``url`` with the password of its user part shown as ``***`` (``http://user:***@host``); a user
    part without a password (often a token) is hidden whole (``http://***@host``)."""
    match = _USERINFO.match(url) or (_LOOSE_USERINFO.match(url) if _garbled_by_userinfo(url) else None)
    if match is None:
        return url
    user, colon, _ = match.group("userinfo").partition(":")  # a user name holds no ":", a password may
    shown = f"{user}:***" if colon else "***"
    return f"{match.group('scheme')}{shown}@{url[match.end():]}"


def _garbled_by_userinfo(url: str) -> bool:
    """Whether an ``@`` in ``url`` may end a user part a parser did not see as one (a password
    holding ``/``, ``?`` or ``#``: ``admin:1234/abcd@host``). The shape is ambiguous, so hiding
    wins, except where the ``@`` begins a path segment (``http://h:8/@team``), which no password
    ends with."""
    scheme, sep, rest = url.partition("://")
    before = (rest if sep else scheme).rpartition("@")[0]
    return bool(before) and not before.endswith("/")


SECRET_MIN_CHARS = 4
"""The shortest key or password :meth:`ServerSpec.hide_secrets` hides in a server's words."""


@dataclass(frozen=True, repr=False)
class ServerSpec:
    """An OpenAI-compatible server: ``url`` is its root (``http://host:port``;
    a trailing ``/v1`` is accepted), ``model`` the name sent with each request
    (None: the first model the server lists), ``api_key_env`` the environment
    variable holding a bearer key (None: no key), ``timeout`` the seconds to
    wait for the server's next byte before giving up. A user and password in
    ``url`` are sent as Basic authorization (:meth:`basic_authorization`)."""

    url: str
    model: str | None = None
    api_key_env: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        shown = redact_url(self.url) if isinstance(self.url, str) else self.url
        try:
            parts = urlsplit(self.url) if isinstance(self.url, str) else None
        except ValueError as exc:  # "Invalid IPv6 URL": a bracket left open
            raise ProfileError(f"server url {shown!r} cannot be read ({exc})") from None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProfileError(f"server url must look like http://127.0.0.1:8080, got {shown!r}")
        try:
            parts.port
        except ValueError:
            raise ProfileError(f"server url {shown!r} has an invalid port") from None
        if any(ord(c) < 0x21 or 0x7f <= ord(c) <= 0x9f for c in self.url):  # http.client refused it later,
            raise ProfileError(f"server url {shown!r} holds a space or a control character")  # blamed on the server
        if parts.query or parts.fragment:  # every request's path is built below the root: it was dropped in silence
            raise ProfileError(f"server url {shown!r} has a ?query or #fragment, which specchat cannot send; "
                               "give the server's address and path only")
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ProfileError("server model must be a non-empty string (or left out for the server's first model)")
        if self.api_key_env is not None and not _ENV_NAME.fullmatch(str(self.api_key_env)):
            raise ProfileError(NOT_A_VARIABLE)
        if self.api_key_env is not None and parts.username is not None:
            raise ProfileError(f"server url {shown!r} carries a user and password and api_key_env names a key too: "
                               "give the server one of them")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) \
                or not math.isfinite(self.timeout) or self.timeout <= 0:
            raise ProfileError(f"server timeout must be a positive number of seconds, got {self.timeout!r}")

    def __repr__(self) -> str:
        return (f"ServerSpec(url={redact_url(self.url)!r}, model={self.model!r}, "
                f"api_key_env={self.api_key_env if self.api_key_env is None else shown_env_name(self.api_key_env)!r}, timeout={self.timeout!r})")

    @property
    def root(self) -> str:
        """The URL without a trailing ``/`` or ``/v1``: endpoints hang below it. Its password
        reads ``***`` (:func:`redact_url`): this is the server's name wherever it is shown."""
        root = redact_url(self.url).rstrip("/")
        return root[: -len("/v1")] if root.endswith("/v1") else root

    def basic_authorization(self) -> str | None:
        """The ``Authorization`` header for the URL's ``user:password``, None without one."""
        parts = urlsplit(self.url)
        if parts.username is None:
            return None
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        return "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")

    def hide_secrets(self, text: str) -> str:
        """``text`` (a server's own words) with the API key, the URL's password and the
        ``Authorization`` values made of them each replaced by ``***``. A server that echoed the
        request's header in its error ("Incorrect API key provided: Bearer sk-…") had the key
        printed by ``generate``, written to ``--json`` and shown in the app's toast. Secrets
        shorter than :data:`SECRET_MIN_CHARS` are left: replacing them would garble the text."""
        secrets: list[str] = []
        if self.api_key_env is not None:
            key = os.environ.get(self.api_key_env, "")
            secrets += [key, key.strip()]
        parts = urlsplit(self.url)
        if parts.username is not None:
            basic = self.basic_authorization() or ""
            password = parts.password or ""
            secrets += [basic.removeprefix("Basic "), unquote(password), password,
                        f"{unquote(parts.username)}:{unquote(password)}" if password else ""]
        forms = set()
        for secret in (s for s in secrets if len(s) >= SECRET_MIN_CHARS):  # as JSON may write it too: "sk-ab\/cd", "\u00e4"
            escaped = json.dumps(secret)[1:-1]
            forms |= {secret, escaped, escaped.replace("/", "\\/"), json.dumps(secret, ensure_ascii=False)[1:-1]}
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form, "***")
        return text

    def api_key(self) -> str | None:
        """The key from ``api_key_env``; an error says which variable to set."""
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key and shown_env_name(self.api_key_env) != self.api_key_env:
            raise EngineError(
                "the API key's variable named by api_key_env (--api-key-env) is not set or empty; its name is not repeated "
                "here, as a long name in lower or mixed case may be the key itself: put the key in a variable "
                "such as OPENAI_API_KEY and give that name"
            )
        if not key:
            raise EngineError(
                f"the profile reads its API key from ${self.api_key_env}, which is "
                f"{'empty' if self.api_key_env in os.environ else 'not set'}: "
                f"export {self.api_key_env}=... (or remove api_key_env if the server needs no key)"
            )
        return key


def parse_server_spec(raw: dict[str, Any], where: str) -> ServerSpec:
    """The connection keys of a ``backend = "server"`` profile table."""
    if "url" not in raw:
        raise ProfileError(f"{where}: backend = \"server\" needs url = \"http://HOST:PORT\"")
    for key in ("url", "model", "api_key_env"):
        if key in raw and not isinstance(raw[key], str):
            got = "" if key == "api_key_env" else f", got {raw[key]!r}"  # never print what may be a key
            raise ProfileError(f"{where}: {key} must be a string{got}")
    timeout = raw.get("timeout", DEFAULT_TIMEOUT_S)
    try:
        return ServerSpec(url=raw["url"], model=raw.get("model"), api_key_env=raw.get("api_key_env"),
                          timeout=float(timeout) if isinstance(timeout, int) and not isinstance(timeout, bool)
                          else timeout)
    except ProfileError as exc:
        raise ProfileError(f"{where}: {exc}") from None
