"""Can a profile run on this machine? Said before anything is downloaded or loaded.

A profile is unavailable when it sets ``device = "cuda"`` (the shipped GPU
profiles do: their quantized 7-14B targets are sized for a card, and on a CPU
they would download gigabytes to run at a fraction of a token per second) and
no CUDA device is present, or when its quantization needs bitsandbytes and that
package is not installed. A ``device = "cpu"`` profile runs on the CPU wherever it is
(:func:`engine.load.loader.profile_device`). The picker and ``specchat profiles`` show the reason;
:func:`engine.load.loader.load_engine` refuses such a profile with it.
"""
from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile


def cuda_present() -> bool:
    """True when the engine would run on CUDA here (``SPECCHAT_DEVICE`` respected)."""
    from engine.model.device import Device

    return Device.auto().is_cuda


def unavailable_reason(profile: "ModelProfile", *, cuda: bool) -> str | None:
    """Why ``profile`` cannot run on this machine, or None when it can."""
    if getattr(profile, "device", "any") == "cuda" and not cuda:
        return "needs a CUDA GPU (device = \"cuda\" in its profile) and none was found on this machine"
    for spec in (profile.target, profile.draft):
        if spec is not None and spec.quantization in ("nf4", "int8") and importlib.util.find_spec("bitsandbytes") is None:
            return f"{spec.quantization} quantization needs the bitsandbytes package, which is not installed"
    return None
