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
import os
import re
import sys
from pathlib import Path

from engine.environment import device_override
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile


GPU_DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")
"""Files that exist where an NVIDIA (Linux, WSL) or ROCm driver is loaded."""

_BUILD_LINE = re.compile(r"^(cuda|hip)\s*(?::[^=]*)?=\s*['\"][^'\"]+['\"]", re.MULTILINE)


def cuda_present() -> bool:
    """True when the engine would run on CUDA here (``SPECCHAT_DEVICE`` respected).

    Asks torch when it is imported already. Otherwise (the app's UI process, which
    leaves torch to the engine's child: :mod:`app.ui.collector` says why) it answers
    without importing it: torch built for a GPU (its ``version.py`` names a CUDA or
    ROCm version) and a GPU driver loaded (:data:`GPU_DRIVER_PATHS`). A wrong guess
    only labels a profile; loading it still asks torch itself."""
    name = device_override()
    if name:
        return name.startswith("cuda")
    if "torch" in sys.modules:
        from engine.model.device import Device

        return Device.auto().is_cuda
    return torch_built_for_gpu() and any(os.path.exists(path) for path in GPU_DRIVER_PATHS)


def torch_built_for_gpu(version_text: str | None = None) -> bool:
    """Whether the installed torch is a CUDA or ROCm build, read from ``torch/version.py``
    (``version_text``: that file's text, for tests) without importing torch."""
    if version_text is None:
        spec = importlib.util.find_spec("torch")
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        try:
            version_text = next((Path(f) / "version.py").read_text() for f in folders
                                if (Path(f) / "version.py").is_file())
        except (StopIteration, OSError):
            return False
    return _BUILD_LINE.search(version_text) is not None


def unavailable_reason(profile: "ModelProfile", *, cuda: bool) -> str | None:
    """Why ``profile`` cannot run on this machine, or None when it can."""
    if getattr(profile, "device", "any") == "cuda" and not cuda:
        return "needs a CUDA GPU (device = \"cuda\" in its profile) and none was found on this machine"
    for spec in (profile.target, profile.draft):
        if spec is not None and spec.quantization in ("nf4", "int8") and importlib.util.find_spec("bitsandbytes") is None:
            return f"{spec.quantization} quantization needs the bitsandbytes package, which is not installed"
    return None
