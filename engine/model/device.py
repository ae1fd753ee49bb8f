"""The one place that knows whether we run on CUDA or the CPU.

Everything device-specific goes through :class:`Device`: where tensors live,
how token ids get there (:meth:`Device.ids_tensor`: pinned, non-blocking on
CUDA), how much memory is free, how to time a step honestly (CUDA kernels are
asynchronous: :meth:`Device.now` reads the clock after ``torch.cuda.synchronize``;
:meth:`Device.mark` / :meth:`Device.seconds_between` time a decoding round with
CUDA events and one wait instead), what an out-of-memory error looks like, and which
KV cache and pass capture a runner gets (:meth:`Device.uses_static_cache`,
:meth:`Device.graph_backend`: a static cache and CUDA graphs on a card, the growing cache
and eager passes on the CPU).
"""
from __future__ import annotations

import contextlib
import gc
import re
import time
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from typing import Any, Union

import psutil
import torch

from engine.environment import device_override, switch
from engine.errors import SettingError
from engine.model.capture import ENV as GRAPHS_ENV, CudaGraphs, GraphBackend, graphs_disabled


CUDA_ATTENTION_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
"""The SDPA kernels a pass on a card may take (names of ``torch.nn.attention.SDPBackend``): not
cuDNN's, which PyTorch prefers on an H100 but which builds an execution plan for each new shape,
and decoding makes a new shape (one more key) every step: a first reply on an H200 decoded
27-36 tok/s with it allowed, 249-269 without (docs/gpu.md)."""

Mark = Union[float, "torch.cuda.Event"]
"""A point in time from :meth:`Device.mark`: a ``perf_counter`` reading on the CPU, a
recorded CUDA event on a card."""

# Error texts that mean an allocation failed although torch raised a plain RuntimeError:
# cuBLAS and cuDNN report a failed workspace allocation with these status names, and
# torch's CPU allocator says "DefaultCPUAllocator: can't allocate memory".
OOM_WORDS = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed", "can't allocate memory")
STATIC_CACHE_ENV = "SPECCHAT_STATIC_CACHE"
"""``1`` or ``0``: force the static KV cache on or off (default: on a card only)."""


@dataclass(frozen=True)
class Device:
    """A torch device plus the operations the engine needs from it.

    ``static_cache``: force the KV cache kind (None: :meth:`uses_static_cache` decides).
    ``graphs``: the capture backend to use instead of CUDA graphs (a stand-in: the CPU tests).
    """

    torch_device: torch.device
    static_cache: bool | None = None
    graphs: GraphBackend | None = None

    @staticmethod
    def auto(prefer: str | None = None) -> "Device":
        """CUDA when present (or when ``prefer`` names it), otherwise the CPU.

        ``SPECCHAT_DEVICE`` overrides the choice (``cpu`` or ``cuda[:N]``).
        """
        name = prefer or device_override()
        if name:
            if name.startswith("cuda") and not torch.cuda.is_available():
                raise SettingError(no_cuda_here(name))
            return Device(torch.device(name))
        return Device(torch.device("cuda" if torch.cuda.is_available() else "cpu"))

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    @property
    def description(self) -> str:
        if self.is_cuda:
            return f"cuda ({torch.cuda.get_device_name(self.torch_device)})"
        return f"cpu ({torch.get_num_threads()} threads)"

    def compute_capability(self) -> tuple[int, int] | None:
        """CUDA compute capability ``(major, minor)``: (7, 5) on a T4, (8, 6) on an RTX 3090;
        None on the CPU."""
        if not self.is_cuda:
            return None
        major, minor = torch.cuda.get_device_capability(self.torch_device)
        return int(major), int(minor)

    @property
    def fast_bf16(self) -> bool:
        """Whether bfloat16 runs at full speed: CUDA from compute capability 8.0
        (Ampere) on. Older cards (T4, RTX 20xx, V100) have no bf16 tensor cores;
        there float16 is the half-precision choice. False on the CPU (fp32 there)."""
        capability = self.compute_capability()
        return capability is not None and capability >= (8, 0)

    def attention_implementation(self, dtype: str, config: Any = None) -> str | None:
        """``flash_attention_2`` where it runs: CUDA from compute capability 8.0, a
        half-precision dtype, the ``flash_attn`` package installed (the ``flash`` extra)
        and a model class that supports it (``config``'s). None: transformers' default
        (SDPA), which over a verify pass of K+1 tokens takes a masked path that
        repeats K/V for every query head (docs/gpu.md)."""
        capability = self.compute_capability()
        if capability is None or capability < (8, 0) or dtype not in ("float16", "bfloat16"):
            return None
        from transformers import AutoModelForCausalLM
        from transformers.utils import is_flash_attn_2_available

        if not is_flash_attn_2_available():
            return None
        model_class = getattr(AutoModelForCausalLM, "_model_mapping", {}).get(type(config), None) if config else None
        return "flash_attention_2" if getattr(model_class, "_supports_flash_attn", False) else None

    def attention_kernels(self) -> contextlib.AbstractContextManager[Any]:
        """The context every model pass runs in: on a card, SDPA limited to
        :data:`CUDA_ATTENTION_BACKENDS` (global flags, put back on exit); nothing on the CPU."""
        if not self.is_cuda:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, name) for name in CUDA_ATTENTION_BACKENDS])

    def uses_static_cache(self) -> bool:
        """Whether runners get :class:`~engine.model.kv.StaticKV` (the window preallocated, fixed
        shapes, capturable passes) rather than :class:`~engine.model.kv.GrowingKV`: on a card by
        default; ``static_cache`` or ``SPECCHAT_STATIC_CACHE=1``/``0`` decide otherwise. The CPU
        keeps the growing cache and its C attention step, which a whole-window mask would slow."""
        if self.static_cache is not None:
            return self.static_cache
        forced = switch(STATIC_CACHE_ENV)
        return self.is_cuda if forced is None else forced

    def graph_backend(self) -> tuple[GraphBackend | None, str | None]:
        """The backend that captures a runner's static passes, and why there is none: CUDA
        graphs on a card, ``graphs`` where one was given, nothing on the CPU (no reason to
        tell) or with ``SPECCHAT_CUDA_GRAPHS=0`` (said once)."""
        if graphs_disabled():
            return None, f"captured passes off ({GRAPHS_ENV}=0); eager passes"
        if self.graphs is not None:
            return self.graphs, None
        if self.is_cuda:
            return CudaGraphs(self.torch_device), None
        return None, None

    def synchronize(self) -> None:
        """Wait for queued kernels, so that a clock read after this is honest."""
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)

    def now(self) -> float:
        """A timestamp in seconds, taken after synchronising the device."""
        self.synchronize()
        return time.perf_counter()

    def ids_tensor(self, ids: Sequence[int]) -> torch.Tensor:
        """Token ids ``[n]`` as a long tensor ``[1, n]`` on this device (:func:`ids_tensor`)."""
        return ids_tensor(ids, self.torch_device)

    def mark(self) -> Mark:
        """Now, without waiting: a clock reading on the CPU; on CUDA an event recorded on the
        current stream (it fires when the kernels queued before it have run). Pass the
        marks of one round to :meth:`seconds_between`."""
        if not self.is_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start_read(self, values: torch.Tensor) -> Callable[[], list[int]]:
        """Start copying ``values`` (``[n]``, integers) to the host without waiting; the function
        returned waits for that copy alone and gives the list. On a card the copy goes to pinned
        memory behind an event, so work queued after it (the next chain of rounds) keeps the card
        busy while the host reads; ``tolist`` would wait for all of it. On the CPU: ``tolist``."""
        if not self.is_cuda:
            return lambda: values.tolist()
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(values.device))  # the copy's stream, whichever card is current

        def finish() -> list[int]:
            done.synchronize()
            return host.tolist()

        return finish

    def seconds_between(self, marks: Sequence[Mark]) -> list[float]:
        """Seconds between consecutive marks ``[m0, m1, ..., mn]`` (``n`` figures). On CUDA
        this waits once, for the last event; the round's host transfer has usually
        waited for the same kernels already."""
        if not self.is_cuda:
            return [float(b) - float(a) for a, b in zip(marks, marks[1:])]  # type: ignore[arg-type]
        marks[-1].synchronize()  # type: ignore[union-attr]
        return [a.elapsed_time(b) / 1000.0 for a, b in zip(marks, marks[1:])]  # type: ignore[union-attr]

    def memory_free_total(self) -> tuple[int, int]:
        """(free, total) bytes: ``torch.cuda.mem_get_info`` on CUDA, available RAM on CPU."""
        if self.is_cuda:
            free, total = torch.cuda.mem_get_info(self.torch_device)
            return int(free), int(total)
        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    def memory_used_by_process(self) -> int:
        """Bytes this process holds on the device (allocated tensors on CUDA, RSS on CPU)."""
        if self.is_cuda:
            return int(torch.cuda.memory_allocated(self.torch_device))
        return int(psutil.Process().memory_info().rss)

    def release_memory(self) -> None:
        """Return freed blocks to the system after a model or cache was dropped."""
        gc.collect()
        if self.is_cuda:
            torch.cuda.empty_cache()
        else:
            _malloc_trim()

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        """True for CUDA OOM, for host allocation failures, and for cuBLAS/cuDNN failing to
        allocate their workspace (``CUBLAS_STATUS_ALLOC_FAILED``: a full card seen from
        inside a matmul, raised as a plain RuntimeError)."""
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
        if isinstance(exc, MemoryError):
            return True
        text = str(exc).lower()
        return isinstance(exc, RuntimeError) and any(word in text for word in OOM_WORDS)


def choose_device(wanted: str, *, cuda_found: bool, int4: bool = False, int4_problem: str | None = None,
                  override: str | None = None) -> tuple[str, str | None]:
    """Where a profile runs, and why not on a card where it could have: ``(torch device name, reason)``.

    ``wanted``: the profile's ``device`` (``"any"``, ``"cuda"`` or ``"cpu"``); ``cuda_found``:
    whether torch sees a card; ``int4``: whether the profile has an int4 model, and
    ``int4_problem`` why the card cannot run torch's int4 kernels (:func:`engine.quant.int4.cuda_int4_problem`);
    ``override``: ``SPECCHAT_DEVICE``. ``"cpu"`` always runs on the CPU. ``"any"`` takes the card, and
    falls back to the CPU (its kernels, as without a card) when there is none or when the card
    cannot run its int4 models, with the reason. ``"cuda"`` never falls back: without a card the
    profile is unavailable, and on a card below int4's needs it is refused with the way out
    (:func:`engine.load.loader.check_int4_device`). The reason is None where nothing was given up.
    """
    if wanted == "cpu":
        return "cpu", None
    if override:
        if override.startswith("cuda") and not cuda_found:
            raise SettingError(no_cuda_here(override))
        return override, (f"SPECCHAT_DEVICE={override}" if not override.startswith("cuda") else None)
    if not cuda_found:
        return "cpu", "no CUDA device found"
    if wanted == "any" and int4 and int4_problem:
        return "cpu", f"{int4_problem}; its int4 models run on the CPU instead"
    return "cuda", None


def no_cuda_here(name: str) -> str:
    """Why ``SPECCHAT_DEVICE=<name>`` cannot be had: torch sees no card (or was built without CUDA)."""
    why = ("this torch was built without CUDA" if torch.version.cuda is None and torch.version.hip is None
           else "torch sees no CUDA card")
    return f"SPECCHAT_DEVICE={name}, but {why} (torch {torch.__version__}); unset it to run on the CPU"


def oom_summary(exc: BaseException) -> str:
    """An out-of-memory error in a few words for the HUD: torch's CUDA message is one long line
    (capacity, free, reserved, a link) of which the request and the cap, if one was set, matter."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    asked = re.match(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]?i?B)", text)
    if asked is None:
        return text
    allowed = re.search(r"([\d.]+ [KMGT]?i?B) allowed", text)
    return f"CUDA out of memory: asked for {asked.group(1)}" + (f", {allowed.group(1)} allowed to this process" if allowed else "")


def ids_tensor(ids: Sequence[int], torch_device: torch.device) -> torch.Tensor:
    """Token ids ``[n]`` as a long tensor ``[1, n]`` on ``torch_device`` (:func:`to_device`; on
    the CPU this is ``torch.tensor([ids])``)."""
    return to_device(torch.tensor([list(ids)], dtype=torch.long), torch_device)


def to_device(host: torch.Tensor, torch_device: torch.device) -> torch.Tensor:
    """A tensor built on the host, on ``torch_device``. For CUDA it goes through pinned memory
    and is copied without blocking: a pageable copy makes the host wait until the card's queue
    reaches it, a sync in the middle of passes meant to run without one. On the CPU, ``host``."""
    if torch_device.type != "cuda":
        return host
    return host.pin_memory().to(torch_device, non_blocking=True)


def _malloc_trim() -> None:
    """Ask glibc to hand freed heap pages back to the OS (no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
