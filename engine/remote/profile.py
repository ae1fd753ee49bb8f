"""Profiles whose chats go to a server: ``backend = "server"`` in models.toml,
or ``--server URL`` on the command line.

A server profile names where to connect and the reply settings specchat sends;
the models, the drafter and K are the server's business, so those keys are
refused with a message saying so.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import ProfileError
from engine.profiles import ModelProfile, ModelSpec
from engine.remote.config import SERVER_KEYS, ServerSpec, parse_server_spec

REPLY_KEYS: tuple[str, ...] = ("description", "temperature", "top_p", "top_k", "system_prompt")
PROFILE_KEYS: tuple[str, ...] = ("backend", *SERVER_KEYS, *REPLY_KEYS)


def server_profile(name: str, server: ServerSpec, *, source_file: Path | None = None,
                   **fields: Any) -> ModelProfile:
    """A :class:`ModelProfile` for ``server``; ``target`` only names the model for display."""
    fields.setdefault("description", f"chat with the server at {server.root}")
    return ModelProfile(
        name=name, target=ModelSpec(server.model or "the server's model"), drafter="none",
        backend="server", server=server, source_file=source_file, **fields,
    )


def parse_server_profile(name: str, raw: dict[str, Any], path: Path,
                         check_type: Callable[[Any, str, str], None]) -> ModelProfile:
    """A ``[profiles.NAME]`` table with ``backend = "server"``."""
    where = f"profile {name!r} in {path}"
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
    server = parse_server_spec(raw, where)
    try:
        return server_profile(name, server, source_file=path, **fields)
    except ProfileError as exc:
        msg = str(exc)
        raise ProfileError(msg if str(path) in msg else f"{where}: {msg}") from None


def profile_from_server(url: str, model: str | None = None, api_key_env: str | None = None,
                        *, name: str = "server") -> ModelProfile:
    """The profile behind ``--server URL [--server-model NAME] [--api-key-env VAR]``."""
    try:
        server = ServerSpec(url=url, model=model, api_key_env=api_key_env)
    except ProfileError as exc:
        raise ProfileError(f"--server: {exc}") from None
    return server_profile(name, server, description=f"from --server {server.root}")
