"""Instruments for ``specchat bench``: forward-pass timers, peak memory, the machine's description.

:class:`ForwardTimer` hooks a model's top-level ``forward`` so every pass is
timed the same way whoever calls it (specchat's runner or transformers'
``generate``), with the device's synchronising clock.
"""
from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from engine.model.device import Device
from engine.decode.runner import watch_passes


@dataclass(frozen=True)
class ForwardLog:
    """Forward passes of one model during one reply: ``(tokens fed, seconds)`` each."""

    calls: tuple[tuple[int, float], ...] = ()

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.calls)

    @property
    def decode_calls(self) -> tuple[tuple[int, float], ...]:
        """All but the first pass (the one that reads the prompt)."""
        return self.calls[1:]


class ForwardTimer:
    """Times every forward pass of a model through module hooks (synchronised clock)."""

    def __init__(self, model: torch.nn.Module, device: Device) -> None:
        self.device = device
        self.calls: list[tuple[int, float]] = []
        self._start: list[tuple[int, float]] = []
        self._handles = [
            model.register_forward_pre_hook(self._pre, with_kwargs=True),
            model.register_forward_hook(self._post, with_kwargs=True),
        ]
        # specchat's runner feeds Llama-family models through its lean path,
        # which no module hook sees: it reports those passes itself.
        self._stop_watching = watch_passes(model, lambda n, seconds: self.calls.append((n, seconds)))

    def _pre(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        n = int(ids.shape[-1]) if ids is not None else 0
        self._start.append((n, self.device.now()))

    def _post(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        n, start = self._start.pop()
        self.calls.append((n, self.device.now() - start))

    def take(self) -> ForwardLog:
        """The passes since the last call, and start afresh."""
        log, self.calls = ForwardLog(tuple(self.calls)), []
        return log

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._stop_watching()


class PeakMemory:
    """Peak memory of one reply: CUDA allocations, or the process's peak RSS.

    On Linux the kernel's high-water mark (VmHWM) is reset before each reply by
    writing 5 to ``/proc/self/clear_refs``; elsewhere the RSS after the reply
    is the best available figure. :attr:`kind` says which one is reported.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self.kind = "cuda max_memory_allocated" if device.is_cuda else self._cpu_kind()

    @staticmethod
    def _cpu_kind() -> str:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return "peak RSS (VmHWM)"
        except OSError:
            return "RSS after the reply"

    def reset(self) -> None:
        if self.device.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device.torch_device)
        elif self.kind.startswith("peak RSS"):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")

    def peak(self) -> int:
        if self.device.is_cuda:
            return int(torch.cuda.max_memory_allocated(self.device.torch_device))
        if self.kind.startswith("peak RSS"):
            with open("/proc/self/status") as f:
                match = re.search(r"VmHWM:\s+(\d+)\s+kB", f.read())
            if match:
                return int(match.group(1)) * 1024
        return int(psutil.Process().memory_info().rss)


def machine_info(device: Device) -> dict[str, Any]:
    """Device, library versions and threads, for the JSON's ``machine``."""
    import transformers

    info: dict[str, Any] = {
        "device": device.description,
        "device_type": device.torch_device.type,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "memory_total_bytes": int(psutil.virtual_memory().total),
    }
    if not device.is_cuda:  # which CPU kernel ran, and what the CPU offers: figures of two machines compared knowingly
        from engine.quant import cpu_kernel

        info["cpu_kernel"] = cpu_kernel.variant() or "torch"
        info["cpu_features"] = cpu_kernel.cpu_features()
    if device.is_cuda:
        info["cuda"] = torch.version.cuda
        info["gpu"] = torch.cuda.get_device_name(device.torch_device)
    return info
