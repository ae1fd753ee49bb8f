"""Chatting with a speculative-decoding server instead of local models.

``backend = "server"`` profiles (and ``--server URL``) load a
:class:`~engine.remote.backend.ServerBackend`: the same
:class:`~engine.api.ChatBackend` surface as the local engine, over the
OpenAI-compatible ``/v1/chat/completions`` stream, standard library only.

* :mod:`engine.config.server`: the profile keys (url, model, api_key_env, timeout).
* :mod:`engine.remote.client`: HTTP requests; :mod:`engine.remote.sse`: the event stream;
  :mod:`engine.remote.server_errors`: every failure a named error.
* :mod:`engine.remote.figures`: the server's own α, τ, per-position acceptance.
* :mod:`engine.remote.backend`: replies, figures per reply, the plain calibration.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.progress import ProgressFn, no_progress

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile
    from engine.remote.backend import ServerBackend


def connect(profile: "ModelProfile", progress: ProgressFn = no_progress) -> "ServerBackend":
    """The backend for a ``backend = "server"`` profile, after checking the server answers."""
    from engine.errors import ProfileError
    from engine.remote.backend import ServerBackend

    if profile.server is None:
        raise ProfileError(f"profile {profile.name!r} has backend = \"server\" but no url")
    return ServerBackend.connect(profile.server, profile.name, progress)
