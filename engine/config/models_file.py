"""Reading ``models.toml`` files into profiles, with a message that says what to fix.

Files are read in this order, each adding profiles or replacing whole profiles
of the same name, and each free to change ``default``:

1. the shipped ``models.toml`` (inside the ``engine`` package),
2. the user's ``config_dir()/models.toml`` (skipped when absent),
3. the file given to :func:`load_profiles` or else the one named by ``SPECCHAT_MODELS``.

The keys are documented at the top of the shipped ``models.toml``. Every
problem is a :class:`~engine.errors.ProfileError` naming the file, the profile
and the key to fix; in the user's files a bad profile is only left out, with a
notice (:attr:`Profiles.notices <engine.config.profiles.Profiles.notices>`), so
the others still work (:func:`load_profiles`).
"""
from __future__ import annotations

import os
import re
import sys
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from engine.config.profiles import DRAFTERS, ModelProfile, ModelSpec, Profiles, server_profile
from engine.config.source_names import names_a_path
from engine.errors import ProfileError
from engine.paths import config_dir
from engine.sizes import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MODELS_ENV = "SPECCHAT_MODELS"

_SPEC_KEYS = ("source", "quantization", "dtype", "trust_remote_code", "allow_pickle", "group_size", "quantize_head",
              "draft_vocab", "parts", "sha256", "wide_blocks", "download_size")
_PROFILE_KEYS = (
    "target", "drafter", "draft", "description", "k", "k_min", "k_max", "temperature",
    "top_p", "top_k", "system_prompt", "context_length", "memory_budget", "backend", "device", "lookup",
)
_TOP_KEYS = ("default", "profiles")
_TYPES: dict[str, tuple[type, ...]] = {
    "drafter": (str,), "backend": (str,), "description": (str,), "k": (int,), "k_min": (int,), "k_max": (int,),
    "temperature": (int, float), "top_p": (int, float), "top_k": (int,), "system_prompt": (str,),
    "context_length": (int,), "memory_budget": (int, str), "device": (str,), "lookup": (bool,),
    "source": (str,), "quantization": (str,), "dtype": (str,),
    "trust_remote_code": (bool,), "allow_pickle": (bool,), "group_size": (int,), "quantize_head": (bool,), "draft_vocab": (int,),
    "parts": (list,), "sha256": (str,), "wide_blocks": (str,), "download_size": (int, str),
}


_TYPE_NAMES: dict[tuple[type, ...], str] = {
    (str,): "a string", (int,): "an integer", (int, float): "a number",
    (bool,): "true or false", (int, str): "a size (bytes, or a string like \"2GiB\")",
    (list,): "a list of strings",
}


def _check_type(value: Any, key: str, where: str) -> None:
    types = _TYPES[key]
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise ProfileError(f"{where}: {key} must be {_TYPE_NAMES[types]}, got {value!r}")


def beside(source: str, base: Path) -> str:
    """``source`` with a relative local path made absolute from ``base``, the folder of the models
    file that names it (it was taken from the folder specchat was started in, so one profile
    worked or not by where it was launched). A hub id ``org/name`` stays one unless a folder of
    that name lies beside the file; ``wheel:`` and ``hf:`` sources are left as they are."""
    if source.startswith(("wheel:", "hf:", "~")) or Path(source).is_absolute():
        return source
    there = base / source
    return str(there) if names_a_path(source, there) else source  # the rule classify() reads sources by


def _parse_spec(raw: Any, field: str, where: str, base: Path | None = None) -> ModelSpec:
    if isinstance(raw, str):
        raw = {"source": raw}
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: {field} must be a table like {{ source = \"org/name\" }}, got {raw!r}")
    unknown = sorted(set(raw) - set(_SPEC_KEYS))
    if unknown:
        raise ProfileError(
            f"{where}: unknown key {field}.{unknown[0]}: allowed keys are {', '.join(_SPEC_KEYS)}"
        )
    if "source" not in raw:
        raise ProfileError(f"{where}: missing field {field}.source (a hub id, directory, .gguf file or wheel:...)")
    for key, value in raw.items():
        _check_type(value, key, f"{where}: {field}")
    if base is not None and "parts" not in raw:  # joined from parts, the source is the file's name, not a path
        raw = {**raw, "source": beside(raw["source"], base)}
    if "parts" in raw:
        raw = {**raw, "parts": tuple(raw["parts"])}
    if "download_size" in raw:
        try:
            raw = {**raw, "download_size": parse_size(raw["download_size"])}
        except ProfileError as exc:
            raise ProfileError(f"{where}: {field}.download_size: {exc}") from None
    try:
        return ModelSpec(**raw)
    except ProfileError as exc:
        raise ProfileError(f"{where}: {field}: {exc}") from None


def _parse_profile(name: str, raw: Any, path: Path) -> ModelProfile:
    where = f"profile {name!r} in {path}"
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: [profiles.{name}] must be a table")
    if raw.get("backend") == "server":
        from engine.config.server_fields import parse_server_fields

        server, reply = parse_server_fields(raw, where, _check_type)
        try:
            return server_profile(name, server, source_file=path, **reply)
        except ProfileError as exc:
            raise ProfileError(str(exc) if str(path) in str(exc) else f"{where}: {exc}") from None
    if raw.get("backend", "local") != "local":
        raise ProfileError(f"{where}: backend must be \"local\" (default) or \"server\", got {raw['backend']!r}")
    unknown = sorted(set(raw) - set(_PROFILE_KEYS))
    if unknown:
        raise ProfileError(f"{where}: unknown key {unknown[0]!r}: allowed keys are {', '.join(_PROFILE_KEYS)}")
    for required in ("target", "drafter"):
        if required not in raw:
            raise ProfileError(f"{where}: missing field {required!r}")
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("target", "draft"):
            fields[key] = _parse_spec(value, key, where, path.parent)
            continue
        _check_type(value, key, where)
        fields[key] = value
    if fields["drafter"] not in DRAFTERS:
        raise ProfileError(f"{where}: unknown drafter {fields['drafter']!r}: use one of {', '.join(DRAFTERS)}")
    if fields["drafter"] == "model" and "draft" not in fields:
        raise ProfileError(f"{where}: missing field 'draft' (drafter = \"model\" needs draft = {{ source = ... }})")
    if fields["drafter"] != "model" and "draft" in fields:
        raise ProfileError(f"{where}: 'draft' is only used with drafter = \"model\"; remove it or set drafter = \"model\"")
    if "memory_budget" in fields:
        try:
            fields["memory_budget"] = parse_size(fields["memory_budget"])
        except ProfileError as exc:
            raise ProfileError(f"{where}: memory_budget: {exc}") from None
    for key in ("temperature", "top_p"):
        if key in fields:
            fields[key] = float(fields[key])
    try:
        return ModelProfile(name=name, source_file=path, **fields)
    except ProfileError as exc:
        msg = str(exc)
        raise ProfileError(msg if str(path) in msg else f"{where}: {msg}") from None


def read_profiles_file(path: Path) -> tuple[dict[str, ModelProfile], str | None]:
    """Parse one models.toml: its profiles and its ``default`` (or None); any mistake raises."""
    profiles, default, _ = _read(path, lenient=False)
    return profiles, default


def _line_of(text: str, name: str) -> int | None:
    """The line of ``[profiles.NAME]`` (or its first sub-table) in a models.toml's text."""
    quoted = re.escape(name)
    header = re.compile(rf"""^\s*\[\s*profiles\s*\.\s*(?:"{quoted}"|'{quoted}'|{quoted})\s*[\].]""")
    return next((i for i, line in enumerate(text.splitlines(), 1) if header.match(line)), None)


def _disabled(name: str, path: Path, text: str, exc: ProfileError) -> str:
    """The notice for a profile left out: the file, its line, and the reason."""
    reason = str(exc)
    prefix = f"profile {name!r} in {path}: "
    reason = reason[len(prefix):] if reason.startswith(prefix) else reason
    line = _line_of(text, name)
    return f"profile {name!r} in {path}{f' line {line}' if line else ''} is disabled: {reason}"


def _read(path: Path, lenient: bool) -> tuple[dict[str, ModelProfile], str | None, dict[str, str]]:
    """One models.toml: its profiles, its default, and (``lenient``) the profiles left out with why;
    without ``lenient`` a bad profile raises. A file that cannot be read or parsed always raises."""
    if path.exists() and not path.is_file() and not path.is_dir():  # a FIFO would hang the read
        raise ProfileError(f"models file {path} is not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if path.is_symlink():
            raise ProfileError(f"models file {path} is a link to {os.readlink(path)}, which does not exist") from None
        raise ProfileError(f"models file not found: {path}") from None
    except IsADirectoryError:
        raise ProfileError(f"models file {path} is a folder, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read models file {path}: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: TOML syntax error: {exc}") from None
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise ProfileError(
            f"{path}: unknown top-level key {unknown[0]!r}: allowed keys are {', '.join(_TOP_KEYS)}"
            " (profiles go in [profiles.NAME] tables)"
        )
    default = data.get("default")
    if default is not None and not isinstance(default, str):
        raise ProfileError(f"{path}: default must be a profile name (a string), got {default!r}")
    raw_profiles = data.get("profiles", {})
    if not isinstance(raw_profiles, dict):
        raise ProfileError(f"{path}: profiles must be tables written as [profiles.NAME]")
    profiles: dict[str, ModelProfile] = {}
    invalid: dict[str, str] = {}
    for name, raw in raw_profiles.items():
        try:
            profiles[name] = _parse_profile(name, raw, path)
        except ProfileError as exc:
            if not lenient:
                raise
            invalid[name] = _disabled(name, path, text, exc)
    return profiles, default, invalid


def shipped_models_file() -> Path:
    """The ``models.toml`` that ships inside the ``engine`` package."""
    return Path(str(resources.files("engine").joinpath("models.toml")))


def user_models_file() -> Path:
    """``config_dir()/models.toml``; it need not exist."""
    return config_dir() / "models.toml"


def load_profiles(models_file: Path | str | None = None, *, from_env: bool = True) -> Profiles:
    """Read and merge the shipped, the user's and the given (or ``$SPECCHAT_MODELS``, unless not
    ``from_env``) models files. An error in the file ``$SPECCHAT_MODELS`` names says so.

    A mistake in the shipped file raises. In the user's files a bad profile is left out with a
    notice naming it, its file, line and reason (asked for by name it raises that reason), and the
    others work; the user's own models.toml that cannot be parsed at all is left out with a notice.
    A default that names a disabled profile gives way to the one an earlier file named."""
    shipped = shipped_models_file()
    paths: list[Path] = [shipped]
    user = user_models_file()
    if user.exists() or user.is_symlink():  # a folder or a broken link is named in a notice, not skipped
        paths.append(user)
    named = (os.environ.get(MODELS_ENV, "").strip() or None) if from_env else None
    extra = models_file if models_file is not None else named
    whence = f" (named by {MODELS_ENV}: fix it or unset it)" if models_file is None and extra is not None else ""
    extra_path: Path | None = None
    if extra is not None:
        extra_path = Path(extra).expanduser().absolute()
        if not extra_path.exists():
            raise ProfileError(f"models file not found: {extra_path}{whence}")
        paths.append(extra_path)
    merged: dict[str, ModelProfile] = {}
    invalid: dict[str, str] = {}
    notices: list[str] = []
    defaults: list[tuple[str, Path]] = []
    for path in paths:
        try:
            profiles, file_default, bad = _read(path, lenient=path != shipped)
        except ProfileError as exc:
            if path == extra_path and whence:  # the user may not remember setting it
                raise ProfileError(f"{exc}{whence}") from None
            if path != user:
                raise
            notices.append(f"{exc}; the profiles in it are left out until it is fixed")
            continue
        for name in profiles:
            invalid.pop(name, None)
        for name in bad:
            before = merged.pop(name, None)
            if before is not None:  # "[profiles.pocket] temperature = 0.2": meant as one key changed
                bad[name] += (f"; a profile named like one read before ({name}, from {before.source_file}) replaces it "
                              "whole, not key by key: give all its keys (copy its table) or another name")
        merged.update(profiles)
        invalid.update(bad)
        if file_default is not None:
            defaults.append((file_default, path))
    notices.extend(invalid.values())  # those still left out once every file is read
    if not defaults:
        raise ProfileError(f"no default profile: add default = \"NAME\" to {paths[-1]}")
    default, default_from = defaults[-1]
    if default not in merged and default not in invalid:
        said = (f"{default_from}: default = {default!r} names no profile; "
                f"known profiles are {', '.join(sorted(merged)) or '(none)'}")
        usable = [name for name, _ in defaults if name in merged]
        if default_from == shipped or not usable:
            raise ProfileError(said)
        notices.append(f"{said}; using {usable[-1]!r} until it is fixed")  # a typo there stopped every command
        default = usable[-1]
    if default in invalid:
        usable = [name for name, _ in defaults if name in merged]
        if usable:
            notices.append(f"the default profile {default!r} ({default_from}) is disabled; using {usable[-1]!r}")
            default = usable[-1]
    return Profiles(profiles=MappingProxyType(merged), default=default, files=tuple(paths),
                    invalid=MappingProxyType(invalid), notices=tuple(notices))
