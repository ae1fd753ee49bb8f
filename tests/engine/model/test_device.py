"""Device: which device is picked, what a card can do, memory figures and OOM errors (a card faked on the CPU)."""
from __future__ import annotations

import types

import pytest
import torch

from engine.model import device as device_module
from engine.model.device import Device
from engine.model.memory import published_config

CPU = Device(torch.device("cpu"))


def fake_cuda(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> Device:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    return Device(torch.device("cuda:0"))


def test_auto_takes_prefer_then_specchat_device_then_what_torch_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("SPECCHAT_DEVICE", "cpu")
    assert Device.auto().torch_device == torch.device("cpu")
    assert Device.auto(prefer="cuda:1").torch_device == torch.device("cuda:1")
    monkeypatch.delenv("SPECCHAT_DEVICE")
    assert Device.auto() == Device(torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Device.auto() == CPU and not Device.auto().is_cuda


def test_description_names_the_threads_or_the_card(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CPU.description == f"cpu ({torch.get_num_threads()} threads)"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    card = fake_cuda(monkeypatch, (7, 5))
    assert card.is_cuda and card.description == "cuda (Tesla T4)"


@pytest.mark.parametrize(("capability", "fast"), [((6, 1), False), ((7, 5), False), ((8, 0), True), ((12, 0), True)])
def test_bf16_is_fast_from_compute_capability_8(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int],
                                                fast: bool) -> None:
    card = fake_cuda(monkeypatch, capability)
    assert card.compute_capability() == capability and card.fast_bf16 is fast
    assert CPU.compute_capability() is None and CPU.fast_bf16 is False


def test_flash_attention_needs_a_supporting_model_class_and_half_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers.utils

    device = fake_cuda(monkeypatch, (8, 9))
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: True)
    qwen = published_config("Qwen/Qwen2.5-7B-Instruct")
    assert device.attention_implementation("bfloat16", qwen) == "flash_attention_2"
    assert device.attention_implementation("float32", qwen) is None
    assert device.attention_implementation("bfloat16", None) is None  # unknown class (remote code)
    assert Device(torch.device("cpu")).attention_implementation("bfloat16", qwen) is None


def test_flash_attention_needs_ampere_and_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers.utils

    qwen = published_config("Qwen/Qwen2.5-7B-Instruct")
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: True)
    assert fake_cuda(monkeypatch, (7, 5)).attention_implementation("float16", qwen) is None
    ampere = fake_cuda(monkeypatch, (8, 0))
    assert ampere.attention_implementation("float16", qwen) == "flash_attention_2"
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: False)
    assert ampere.attention_implementation("float16", qwen) is None


def test_memory_figures_on_the_cpu_come_from_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_module.psutil, "virtual_memory", lambda: types.SimpleNamespace(available=3, total=8))
    rss = types.SimpleNamespace(memory_info=lambda: types.SimpleNamespace(rss=1234))
    monkeypatch.setattr(device_module.psutil, "Process", lambda: rss)
    assert CPU.memory_free_total() == (3, 8)
    assert CPU.memory_used_by_process() == 1234


def test_memory_figures_on_a_card_come_from_torch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    card = fake_cuda(monkeypatch, (8, 6))
    asked: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (asked.append(d), (5 * 2**30, 24 * 2**30))[1])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 7 * 2**20)
    assert card.memory_free_total() == (5 * 2**30, 24 * 2**30) and asked == [torch.device("cuda:0")]
    assert card.memory_used_by_process() == 7 * 2**20


def test_the_clock_is_read_after_the_card_is_synchronised(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(f"sync {d}"))
    monkeypatch.setattr(device_module, "time", types.SimpleNamespace(perf_counter=lambda: calls.append("clock") or 42.0))
    assert fake_cuda(monkeypatch, (8, 0)).now() == 42.0
    assert calls == ["sync cuda:0", "clock"]
    calls.clear()
    assert CPU.now() == 42.0 and calls == ["clock"]  # nothing to wait for on the CPU


def test_release_memory_empties_the_cuda_cache_or_trims_the_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(device_module, "_malloc_trim", lambda: calls.append("malloc_trim"))
    fake_cuda(monkeypatch, (8, 0)).release_memory()
    CPU.release_memory()
    assert calls == ["empty_cache", "malloc_trim"]


@pytest.mark.parametrize("exc, oom", [
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (MemoryError(), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (RuntimeError("HIP Out Of Memory"), True),
    (RuntimeError("shape mismatch"), False),
    (ValueError("out of memory"), False),  # only runtime errors are read for the words
])
def test_what_counts_as_out_of_memory(exc: BaseException, oom: bool) -> None:
    assert Device.is_out_of_memory(exc) is oom


def test_a_failed_host_allocation_in_torch_is_out_of_memory() -> None:
    with pytest.raises(RuntimeError) as err:
        torch.empty(2**50, dtype=torch.uint8)  # 1 PiB: refused at once by the CPU allocator
    assert Device.is_out_of_memory(err.value)  # "DefaultCPUAllocator: can't allocate memory: ..."


def test_passes_on_a_card_keep_cudnn_attention_out_and_the_cpu_untouched() -> None:
    """cuDNN's SDPA builds a plan per shape, and each decoding step has a new one (one more key):
    an H200 decoded 27-36 tok/s with it allowed, 249-269 without. The flags are global, so the
    context must put them back."""
    flags = (torch.backends.cuda.cudnn_sdp_enabled, torch.backends.cuda.flash_sdp_enabled,
             torch.backends.cuda.mem_efficient_sdp_enabled, torch.backends.cuda.math_sdp_enabled)
    before = [f() for f in flags]
    with Device(torch.device("cuda:0")).attention_kernels():
        assert [f() for f in flags] == [False, True, True, True]
    assert [f() for f in flags] == before
    with Device(torch.device("cpu")).attention_kernels():
        assert [f() for f in flags] == before


def test_every_model_pass_runs_inside_the_devices_attention_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's one pass method enters the context for the lean forward and transformers' alike."""
    from engine.decode.runner import ModelRunner
    from tests.tiny import tiny_llama

    entered: list[bool] = []

    class Watch:
        def __enter__(self) -> None:
            entered.append(True)

        def __exit__(self, *exc: object) -> None:
            entered.append(False)

    monkeypatch.setattr(Device, "attention_kernels", lambda self: Watch())
    for lean in (True, False):
        entered.clear()
        runner = ModelRunner(tiny_llama(0), CPU, lean=lean)
        runner.forward([1, 2, 3])
        runner.forward([4])
        assert entered == [True, False, True, False], lean


def test_an_out_of_memory_error_is_told_in_a_few_words() -> None:
    from engine.model.device import oom_summary

    seen_on_an_h100 = (  # the whole of torch's message when a capped allocator refused the draft
        "CUDA out of memory. Tried to allocate 520.00 MiB. GPU 0 has a total capacity of 79.18 GiB of which "
        "78.46 GiB is free. Including non-PyTorch memory, this process has 732.00 MiB memory in use. 288.00 MiB "
        "allowed; Of the allocated memory 32.57 MiB is allocated by PyTorch, and 1.43 MiB is reserved by PyTorch "
        "but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")
    assert oom_summary(torch.cuda.OutOfMemoryError(seen_on_an_h100)) == (
        "CUDA out of memory: asked for 520.00 MiB, 288.00 MiB allowed to this process")
    uncapped = seen_on_an_h100.replace(" 288.00 MiB allowed;", "")
    assert oom_summary(torch.cuda.OutOfMemoryError(uncapped)) == "CUDA out of memory: asked for 520.00 MiB"
    assert oom_summary(MemoryError()) == "MemoryError"
    assert oom_summary(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 bytes\\nmore")) == (
        "DefaultCPUAllocator: can't allocate memory: you tried 9 bytes\\nmore")


@pytest.mark.parametrize(("wanted", "cuda_found", "int4", "problem", "override", "expected"), [
    ("cpu", True, True, None, None, ("cpu", None)),
    ("cpu", True, False, None, "cuda", ("cpu", None)),  # a CPU profile stays there whatever SPECCHAT_DEVICE says
    ("any", False, True, None, None, ("cpu", "no CUDA device found")),
    ("any", True, True, None, None, ("cuda", None)),
    ("any", True, True, "the card is 7.5", None, ("cpu", "the card is 7.5; its int4 models run on the CPU instead")),
    ("any", True, False, "the card is 7.5", None, ("cuda", None)),  # nf4 or bf16: the card's business, not int4's
    ("cuda", True, True, "the card is 7.5", None, ("cuda", None)),  # refused later with the way out, never moved
    ("cuda", False, False, None, None, ("cpu", "no CUDA device found")),  # then listed as unavailable
    ("any", True, True, None, "cpu", ("cpu", "SPECCHAT_DEVICE=cpu")),
    ("any", True, True, None, "cuda:1", ("cuda:1", None)),  # without a card: refused (tests/engine/test_environment.py)
])
def test_choose_device_falls_back_to_the_cpu_with_the_reason(
    wanted: str, cuda_found: bool, int4: bool, problem: str | None, override: str | None,
    expected: tuple[str, str | None],
) -> None:
    from engine.model.device import choose_device

    assert choose_device(wanted, cuda_found=cuda_found, int4=int4, int4_problem=problem, override=override) == expected
