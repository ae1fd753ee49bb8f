"""``--server URL``: the command line's way to a server profile, and loading one for a command."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from engine.errors import SpecChatError

if TYPE_CHECKING:
    from engine.progress import ProgressFn
    from engine.remote.backend import ServerBackend
    from engine.config.profiles import ModelProfile


def server_profile_from_args(args: argparse.Namespace) -> "ModelProfile | None":
    """The profile for ``--server URL [--server-model NAME] [--api-key-env VAR]``, or None without ``--server``."""
    server = getattr(args, "server", None)
    model = getattr(args, "server_model", None)
    key_env = getattr(args, "api_key_env", None)
    if not server:
        if model or key_env:
            raise SpecChatError("--server-model and --api-key-env need --server URL")
        return None
    if getattr(args, "target", None) or getattr(args, "draft", None):
        raise SpecChatError("--server and --target/--draft exclude each other: the server has its own models")
    from engine.config.profiles import profile_from_server

    return profile_from_server(server, model, key_env)


def load_server(profile: "ModelProfile", mode: str, progress: "ProgressFn") -> "ServerBackend":
    """Connect to a server profile's server; ``mode`` plain asks it not to speculate."""
    from engine.remote import connect

    if mode in ("ngram", "suffix"):
        raise SpecChatError("with a server the server decides how it drafts: use --mode spec, or --mode plain "
                            "to ask it not to speculate")
    backend = connect(profile, progress)
    if mode == "plain":
        backend.set_speculation(False)
    return backend
