"""Model profiles: which target, which drafter, which settings, read from ``models.toml``.

Files are read in this order, each adding profiles or replacing whole profiles
of the same name, and each free to change ``default``:

1. the shipped ``models.toml`` (inside the ``engine`` package),
2. the user's ``config_dir()/models.toml`` (skipped when absent),
3. the file given to :func:`load_profiles` or else the one named by ``SPECCHAT_MODELS``.

The keys are documented at the top of the shipped ``models.toml``. Every
problem raises :class:`~engine.errors.ProfileError` naming the file, the profile
and the key to fix.
"""
from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, get_args

from engine.config.source_names import check_parts
from engine.errors import ModelSourceError, ProfileError
from engine.paths import config_dir
from engine.sizes import parse_size

if TYPE_CHECKING:
    from engine.config.server import ServerSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Quantization = Literal["none", "int4", "nf4", "int8"]
Drafter = Literal["model", "ngram", "none"]
Backend = Literal["local", "server"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
DRAFTERS: tuple[str, ...] = get_args(Drafter)
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
WIDE_BLOCKS: tuple[str, ...] = ("int4", "planes")
GROUP_SIZES: tuple[int, ...] = (32, 64, 128)  # int4 groups (engine.quant.int4 checks the same set)
MODELS_ENV = "SPECCHAT_MODELS"


@dataclass(frozen=True)
class ModelSpec:
    """Where one model comes from and how to load it.

    ``source`` is a hub id (``org/name``), a local directory saved with
    ``save_pretrained``, a local ``.gguf`` file, or a file inside a wheel on the
    package index (``wheel:DIST==VERSION/path/in/wheel.gguf``); see
    :mod:`engine.fetch.sources`.
    """

    source: str
    quantization: Quantization = "none"
    dtype: str = "auto"
    trust_remote_code: bool = False
    allow_pickle: bool = False
    group_size: int = 32
    quantize_head: bool = True
    draft_vocab: int = 0  # a draft proposes from this many most frequent tokens (0: all)
    parts: tuple[str, ...] = ()
    """``wheel:`` sources whose files, joined in order, make the GGUF named ``source`` (:mod:`engine.fetch.parts`)."""
    sha256: str = ""
    """The sha256 (hex) of the joined file, checked before it is used; empty: the parts' RECORD hashes only."""
    wide_blocks: str = "int4"
    """int4 from a GGUF: its blocks of more than 4 bits requantized to ``"int4"``, or kept as two int4 ``"planes"``."""
    download_size: int | None = field(default=None, compare=False)
    """Bytes the first use downloads (the profile says; ``specchat profiles`` shows it; not part of
    what makes two specs the same model)."""

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ProfileError("a model's source must be a non-empty string")
        if self.parts:
            try:
                check_parts(self.source, self.parts)
            except ModelSourceError as exc:
                raise ProfileError(str(exc)) from None
        if self.wide_blocks not in WIDE_BLOCKS:
            raise ProfileError(f"unknown wide_blocks {self.wide_blocks!r}: use one of {', '.join(WIDE_BLOCKS)}")
        if self.sha256 and not re.fullmatch(r"[0-9a-fA-F]{64}", self.sha256):
            raise ProfileError(f"sha256 must be 64 hex digits, got {self.sha256!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ProfileError(
                f"unknown quantization {self.quantization!r}: use one of {', '.join(QUANTIZATIONS)}"
            )
        if self.dtype not in DTYPES:
            raise ProfileError(f"unknown dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.draft_vocab and self.draft_vocab < 256:
            raise ProfileError(f"draft_vocab must be 0 (the whole vocabulary) or at least 256, got {self.draft_vocab}")
        if self.group_size not in GROUP_SIZES:
            raise ProfileError(
                f"group_size {self.group_size} is not supported: use one of {', '.join(map(str, GROUP_SIZES))}"
            )

    @property
    def label(self) -> str:
        """A short human name, e.g. ``SmolLM2-135M-Instruct (Q4_1 gguf)``."""
        src = self.source.rstrip("/")
        tags: list[str] = []
        name = src.rsplit("/", 1)[-1]
        if name.lower().endswith(".gguf"):
            stem = name[: -len(".gguf")]
            base, dot, quant = stem.rpartition(".")
            if dot and re.fullmatch(r"(?i)(I?Q\d\w*|F16|F32|BF16)", quant):
                name = base
                tags.append(f"{quant} gguf")
            else:
                name = stem
                tags.append("gguf")
        if self.quantization != "none":
            tags.append(self.quantization)
        return f"{name} ({', '.join(tags)})" if tags else name


@dataclass(frozen=True)
class ModelProfile:
    """A named target + drafter combination with its generation defaults."""

    name: str
    target: ModelSpec
    drafter: Drafter
    draft: ModelSpec | None = None
    description: str = ""
    k: int | None = None
    k_min: int = 1
    k_max: int = 8
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    system_prompt: str | None = None
    context_length: int = 2048
    memory_budget: int | None = None
    device: str = "any"
    """``"cuda"``: the profile needs a CUDA GPU and is listed as unavailable without one."""
    lookup: bool = False
    """With a model draft: copy from the conversation (n-gram lookup) instead, in rounds where that pays."""
    source_file: Path | None = None
    backend: Backend = "local"
    server: "ServerSpec | None" = None
    """Where a ``backend = "server"`` profile sends its chats (engine.remote)."""

    def __post_init__(self) -> None:
        where = f"profile {self.name!r}" + (f" in {self.source_file}" if self.source_file else "")
        if self.backend not in ("local", "server") or (self.backend == "server") != (self.server is not None):
            raise ProfileError(f"{where}: backend must be \"local\" or \"server\" (a server needs url = ...)")
        if self.drafter not in DRAFTERS:
            raise ProfileError(f"{where}: unknown drafter {self.drafter!r}: use one of {', '.join(DRAFTERS)}")
        if self.drafter == "model" and self.draft is None:
            raise ProfileError(f"{where}: drafter = \"model\" needs a draft = {{ source = ... }} table")
        if self.k is not None and self.k < 0:
            raise ProfileError(f"{where}: k must be >= 0 (or left out for adaptive K), got {self.k}")
        if not 0 <= self.k_min <= self.k_max:
            raise ProfileError(f"{where}: need 0 <= k_min <= k_max, got k_min={self.k_min}, k_max={self.k_max}")
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise ProfileError(f"{where}: temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ProfileError(f"{where}: top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ProfileError(f"{where}: top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.device not in ("any", "cuda"):
            raise ProfileError(f"{where}: device must be \"any\" or \"cuda\", got {self.device!r}")
        if self.context_length < 1:
            raise ProfileError(f"{where}: context_length must be >= 1, got {self.context_length}")
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise ProfileError(f"{where}: memory_budget must be positive, got {self.memory_budget}")


@dataclass(frozen=True)
class Profiles:
    """All profiles after merging, the default's name and the files read."""

    profiles: Mapping[str, ModelProfile]
    default: str
    files: tuple[Path, ...]

    def names(self) -> list[str]:
        """Profile names, sorted."""
        return sorted(self.profiles)

    def get(self, name: str | None = None) -> ModelProfile:
        """The named profile, or the default for ``None``; an unknown name lists the known ones."""
        key = self.default if name is None else name
        try:
            return self.profiles[key]
        except KeyError:
            raise ProfileError(
                f"unknown profile {key!r}: known profiles are {', '.join(self.names()) or '(none)'}"
                f" (defined in {', '.join(str(f) for f in self.files) or 'no file'})"
            ) from None


# ----------------------------------------------------------------------------- parsing

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


def _parse_spec(raw: Any, field: str, where: str) -> ModelSpec:
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
            fields[key] = _parse_spec(value, key, where)
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
    """Parse one models.toml: its profiles and its ``default`` (or None)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"models file not found: {path}") from None
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
    return {name: _parse_profile(name, raw, path) for name, raw in raw_profiles.items()}, default


def shipped_models_file() -> Path:
    """The ``models.toml`` that ships inside the ``engine`` package."""
    return Path(str(resources.files("engine").joinpath("models.toml")))


def user_models_file() -> Path:
    """``config_dir()/models.toml``; it need not exist."""
    return config_dir() / "models.toml"


def load_profiles(models_file: Path | str | None = None) -> Profiles:
    """Read and merge the shipped, the user's and the given (or ``$SPECCHAT_MODELS``) models files."""
    paths: list[Path] = [shipped_models_file()]
    user = user_models_file()
    if user.is_file():
        paths.append(user)
    extra = models_file if models_file is not None else os.environ.get(MODELS_ENV) or None
    if extra is not None:
        extra_path = Path(extra).expanduser().absolute()
        if not extra_path.is_file():
            raise ProfileError(f"models file not found: {extra_path}")
        paths.append(extra_path)
    merged: dict[str, ModelProfile] = {}
    default: str | None = None
    default_from: Path | None = None
    for path in paths:
        profiles, file_default = read_profiles_file(path)
        merged.update(profiles)
        if file_default is not None:
            default, default_from = file_default, path
    if default is None:
        raise ProfileError(f"no default profile: add default = \"NAME\" to {paths[-1]}")
    if default not in merged:
        raise ProfileError(
            f"{default_from}: default = {default!r} names no profile; "
            f"known profiles are {', '.join(sorted(merged)) or '(none)'}"
        )
    return Profiles(profiles=MappingProxyType(merged), default=default, files=tuple(paths))


def server_profile(name: str, server: Any, *, source_file: Path | None = None, **fields: Any) -> ModelProfile:
    """A profile whose chats go to ``server`` (:class:`engine.config.server.ServerSpec`);
    ``target`` only names the model for display."""
    fields.setdefault("description", f"chat with the server at {server.root}")
    return ModelProfile(
        name=name, target=ModelSpec(server.model or "the server's model"), drafter="none",
        backend="server", server=server, source_file=source_file, **fields,
    )


def profile_from_server(url: str, model: str | None = None, api_key_env: str | None = None,
                        *, name: str = "server") -> ModelProfile:
    """The profile behind ``--server URL [--server-model NAME] [--api-key-env VAR]``."""
    from engine.config.server_fields import server_from_options

    server = server_from_options(url, model, api_key_env)
    return server_profile(name, server, description=f"from --server {server.root}")


def profile_from_sources(target: str, draft: str | None = None, *, name: str = "cli") -> ModelProfile:
    """A profile for ``--target SRC [--draft SRC]`` without a models.toml entry.

    ``draft`` None (or ``"ngram"``) uses the n-gram drafter, ``"none"`` plain decoding.
    """
    if draft is None or draft == "ngram":
        return ModelProfile(name=name, target=ModelSpec(target), drafter="ngram", description="from --target")
    if draft == "none":
        return ModelProfile(name=name, target=ModelSpec(target), drafter="none", description="from --target")
    return ModelProfile(
        name=name, target=ModelSpec(target), drafter="model", draft=ModelSpec(draft),
        description="from --target/--draft",
    )
