"""Profiles whose chats go to a server: ``backend = "server"`` in models.toml,
or ``--server URL`` on the command line.

A server profile names where to connect and the reply settings specchat sends;
the models, the drafter and K are the server's business, so those keys are
refused with a message saying so.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.errors import ProfileError
from engine.config.server import NOT_A_VARIABLE, SERVER_KEYS, ServerSpec, parse_server_spec

REPLY_KEYS: tuple[str, ...] = ("description", "temperature", "top_p", "top_k", "system_prompt")
PROFILE_KEYS: tuple[str, ...] = ("backend", *SERVER_KEYS, *REPLY_KEYS)


def parse_server_fields(raw: dict[str, Any], where: str,
                        check_type: Callable[[Any, str, str], None]) -> tuple[ServerSpec, dict[str, Any]]:
    """The server and the reply settings of a ``[profiles.NAME]`` table with ``backend = "server"``;
    :mod:`engine.config.profiles` makes the profile of them."""
    unknown = sorted(set(raw) - set(PROFILE_KEYS))
    if unknown:
        raise ProfileError(
            f"{where}: {unknown[0]!r} does not apply to backend = \"server\" (the server chooses the models, "
            f"the drafter and K); allowed keys are {', '.join(PROFILE_KEYS)}"
        )
    fields: dict[str, Any] = {}
    for key in REPLY_KEYS:
        if key in raw:
            check_type(raw[key], key, where)
            fields[key] = float(raw[key]) if key in ("temperature", "top_p") else raw[key]
    return parse_server_spec(raw, where), fields


def server_from_options(url: str, model: str | None = None, api_key_env: str | None = None) -> ServerSpec:
    """The server behind ``--server URL [--server-model NAME] [--api-key-env VAR]``."""
    try:
        return ServerSpec(url=url, model=model, api_key_env=api_key_env)
    except ProfileError as exc:
        if str(exc) == NOT_A_VARIABLE:
            raise ProfileError("--api-key-env " + NOT_A_VARIABLE.partition(" ")[2]) from None
        raise ProfileError(f"--server: {exc}") from None
