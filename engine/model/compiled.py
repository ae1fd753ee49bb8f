"""Compiled passes: a static pass's layer function through ``torch.compile``.

A static pass (captured or not, :mod:`engine.model.capture`) may go through ``torch.compile``
first (:class:`CompiledPass`; :func:`compile_backend` says when, ``SPECCHAT_COMPILE``): its fusion joins the norms, rope, SwiGLU and residual adds into fewer
kernels, which a graph then replays. Every static pass of the runner (prefill chunks and
uncaptured widths too) takes the compiled function, so plain and speculative passes compute
alike; one compile serves every width (``dynamic=True``; one token and the whole window are
compiled apart). A compile that fails leaves the uncompiled pass for good, said once.

Also the environment's off switches (:func:`switched_off`), which the capture and the card's
attention read too.
"""
from __future__ import annotations

import logging
import os

from engine.environment import OFF, ON, switch
from engine.errors import SettingError
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

def switched_off(name: str) -> bool:
    """Whether the environment switch ``name`` says off (:func:`engine.environment.switch`)."""
    return switch(name) is False


COMPILE_ENV = "SPECCHAT_COMPILE"
"""``0`` turns compiled passes off, ``1`` on (inductor) where they are not the default; another
value names the backend (``aot_eager``: the CPU tests)."""


def compile_backend(card: bool = False) -> str | None:
    """The ``torch.compile`` backend for a runner's static passes: ``SPECCHAT_COMPILE`` when set
    (None for ``0``), else inductor on a card (``card``: a CUDA model whose layers compile whole,
    not bitsandbytes') and None elsewhere. On an H200 the compiled
    passes decoded the random pair at 1,683 tok/s against 1,355 and pocket int4 at 656 against 536,
    for 27-28 s of compiling once a process (docs/gpu.md, 2026-11-27), spent while loading
    (:meth:`engine.decode.runner.ModelRunner.compile_now`)."""
    value = os.environ.get(COMPILE_ENV, "").strip().lower()
    if value == "":
        return "inductor" if card else None
    if value in OFF:  # the switches' words for off
        return None
    if value in ON:
        return "inductor"
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if value not in known:  # it ended every load with torch's InvalidBackend traceback, naming no variable
        raise SettingError(f"{COMPILE_ENV}={os.environ[COMPILE_ENV].strip()!r}: use 1 or 0 (on or off), a "
                           f"torch.compile backend ({', '.join(b for b in known if 'TESTING' not in b)}), "
                           "or unset it")
    return value


def keep_compiled_kernels() -> None:
    """Point inductor's caches (FX graphs, Triton kernels) into specchat's cache folder unless the
    user chose a folder: later starts then read the compiled layers back instead of compiling
    them again, and the files leave with ``specchat``'s cache (not /tmp, which a reboot clears)."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from engine.paths import cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")


class CompiledPass:
    """A static pass's layer function (:func:`engine.model.layer_parts.static_layer`) through
    ``torch.compile`` (``fullgraph``, the sizes ``varying`` marks dynamic): one compile serves every layer of the model
    (they differ in their weights, not in their shapes) and every width, where compiling the whole
    pass unrolled every layer into one graph (68 s for the random pair's 8 layers on an H200).
    At its first failure it falls back to the uncompiled function for good (:attr:`failure` says
    why, for the runner to tell once). An out-of-memory error is not a compile failure: it
    propagates."""

    RECOMPILES = 32
    """Dynamo's limit on compiled versions of one function, raised to this: the target's and a
    model draft's layers (two shapes) share the function, each with a one-token and a general
    version, and a new span or width may add one."""

    def __init__(self, fn: Callable[..., Any], backend: str | Callable[..., Any],
                 varying: Callable[..., None] | None = None) -> None:
        """``varying(*args)`` marks the sizes of ``fn``'s arguments that vary between calls
        (``torch._dynamo.maybe_mark_dynamic``); every other size is compiled as it is."""
        import torch._dynamo

        self.fn = fn
        self.varying = varying
        if backend == "inductor":
            keep_compiled_kernels()
        config = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
            if hasattr(config, name):
                setattr(config, name, max(int(getattr(config, name)), self.RECOMPILES))
        self._compiled: Callable[..., Any] | None = torch.compile(fn, backend=backend, fullgraph=True)
        self.failure: str | None = None
        """Why passes are no longer compiled, until the runner took it (then None again)."""

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def __call__(self, *args: Any) -> Any:
        if self._compiled is not None:
            try:
                if self.varying is not None:
                    self.varying(*args)
                with torch._dynamo.config.patch(automatic_dynamic_shapes=False):  # only the marked sizes vary
                    return self._compiled(*args)
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - any compile failure means uncompiled passes, said once
                root: BaseException = exc  # dynamo wraps the compiler's own error: say that one
                while (inner := getattr(root, "inner_exception", None) or root.__cause__) is not None:
                    root = inner
                first = str(root).strip().splitlines()[0] if str(root).strip() else "no message"
                self.disable(f"{type(root).__name__}: {first[:200]}")
        return self.fn(*args)

    def disable(self, why: str) -> None:
        """Uncompiled calls from now on, for ``why`` (logged; :attr:`failure` for the runner to tell)."""
        self._compiled = None
        self.failure = f"compiled passes off, uncompiled from now on ({why})"
        log.warning("%s", self.failure)
