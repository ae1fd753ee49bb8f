"""Model profiles: which target, which drafter, which settings (read from ``models.toml`` by
:mod:`engine.config.models_file`). A profile that could not run is refused when it is made,
with :class:`~engine.errors.ProfileError` naming the key to fix.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from engine.config.source_names import check_parts, check_wheel_source
from engine.errors import ModelSourceError, ProfileError
from engine.events import MAX_K, MIN_TEMPERATURE

if TYPE_CHECKING:
    from engine.config.server import ServerSpec

Quantization = Literal["none", "int4", "nf4", "int8"]
Drafter = Literal["model", "ngram", "suffix", "none"]
Backend = Literal["local", "server"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
DRAFTERS: tuple[str, ...] = get_args(Drafter)
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
WIDE_BLOCKS: tuple[str, ...] = ("int4", "planes")
DEVICES: tuple[str, ...] = ("any", "cuda", "cpu")
GROUP_SIZES: tuple[int, ...] = (32, 64, 128)  # int4 groups (engine.quant.int4 checks the same set)


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
    """The sha256 (hex) of the joined file, required with ``parts`` and checked at every use of the file."""
    wide_blocks: str = "int4"
    """int4 from a GGUF: its blocks of more than 4 bits requantized to ``"int4"``, or kept as two int4 ``"planes"``."""
    download_size: int | None = field(default=None, compare=False)
    """Bytes the first use downloads (the profile says; ``specchat profiles`` shows it; not part of
    what makes two specs the same model)."""

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ProfileError("a model's source must be a non-empty string")
        try:
            check_wheel_source(self.source)
        except ModelSourceError as exc:
            raise ProfileError(str(exc)) from None
        if self.parts:
            try:
                check_parts(self.source, self.parts)
            except ModelSourceError as exc:
                raise ProfileError(str(exc)) from None
            if not self.sha256:
                raise ProfileError(
                    f"parts need the sha256 of the file they join into ({self.source}), or swapped or replaced "
                    "parts would be joined and used unchecked: add sha256 = \"<64 hex digits>\" beside parts")
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
    """``"cuda"``: the profile needs a CUDA GPU and is listed as unavailable without one;
    ``"cpu"``: it runs on the CPU even where a GPU is present (``"any"``: CUDA when present)."""
    lookup: bool = False
    """With a model draft: copy from the conversation (n-gram lookup) instead, in rounds where that pays."""
    source_file: Path | None = None
    backend: Backend = "local"
    server: "ServerSpec | None" = None
    """Where a ``backend = "server"`` profile sends its chats (engine.remote)."""
    draft_required: bool = False
    """The draft was named for this run (``--draft``), not by a models.toml: one that cannot be
    found or read is bad input, an error, where a profile's falls back to the n-gram drafter."""

    def __post_init__(self) -> None:
        where = f"profile {self.name!r}" + (f" in {self.source_file}" if self.source_file else "")
        if self.backend not in ("local", "server") or (self.backend == "server") != (self.server is not None):
            raise ProfileError(f"{where}: backend must be \"local\" or \"server\" (a server needs url = ...)")
        if self.drafter not in DRAFTERS:
            raise ProfileError(f"{where}: unknown drafter {self.drafter!r}: use one of {', '.join(DRAFTERS)}")
        if self.drafter == "model" and self.draft is None:
            raise ProfileError(f"{where}: drafter = \"model\" needs a draft = {{ source = ... }} table")
        if self.k is not None and not 0 <= self.k <= MAX_K:
            raise ProfileError(f"{where}: k must be from 0 to {MAX_K} (or left out for adaptive K), got {self.k}")
        if not 0 <= self.k_min <= self.k_max <= MAX_K:
            raise ProfileError(f"{where}: need 0 <= k_min <= k_max <= {MAX_K}, got k_min={self.k_min}, "
                               f"k_max={self.k_max}")
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise ProfileError(f"{where}: temperature must be >= 0, got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ProfileError(f"{where}: temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, "
                               f"got {self.temperature:g}")
        if not 0 < self.top_p <= 1:
            raise ProfileError(f"{where}: top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ProfileError(f"{where}: top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.device not in DEVICES:
            raise ProfileError(f"{where}: device must be \"any\", \"cuda\" or \"cpu\", got {self.device!r}")
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
    invalid: Mapping[str, str] = field(default_factory=dict)
    """Profiles of the user's files that are disabled, by name: why (file, line, what to fix)."""
    notices: tuple[str, ...] = ()
    """What the user should be told once: each disabled profile, a user file left out, a default replaced."""

    def names(self) -> list[str]:
        """Profile names, sorted (the disabled ones are in :attr:`invalid`)."""
        return sorted(self.profiles)

    def get(self, name: str | None = None) -> ModelProfile:
        """The named profile, or the default for ``None``; an unknown name lists the known ones,
        a disabled one says why."""
        key = self.default if name is None else name
        if key in self.invalid and key not in self.profiles:
            raise ProfileError(f"{self.invalid[key]}; fix it there, or pick another profile: "
                               f"{', '.join(self.names()) or '(none)'}")
        try:
            return self.profiles[key]
        except KeyError:
            raise ProfileError(
                f"unknown profile {key!r}: known profiles are {', '.join(self.names()) or '(none)'}"
                f" (defined in {', '.join(str(f) for f in self.files) or 'no file'})"
            ) from None


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

    ``draft`` None (or ``"ngram"``) uses the n-gram drafter, ``"suffix"`` the suffix drafter
    (:mod:`engine.decode.suffix`), ``"none"`` plain decoding; any other is a model that must load
    (``draft_required``): the user named it, so one not found is an error, not the n-gram drafter.
    """
    if draft is None or draft == "ngram":
        return ModelProfile(name=name, target=ModelSpec(target), drafter="ngram", description="from --target")
    if draft in ("none", "suffix"):
        return ModelProfile(name=name, target=ModelSpec(target), drafter=draft, description="from --target")
    return ModelProfile(
        name=name, target=ModelSpec(target), drafter="model", draft=ModelSpec(draft),
        description="from --target/--draft", draft_required=True,
    )
