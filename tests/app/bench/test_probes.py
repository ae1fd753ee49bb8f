"""The bench's instruments on the CPU: every forward pass timed (hooked or lean), peak memory, the machine."""
from __future__ import annotations

import os

import torch

from app.bench.probes import ForwardLog, ForwardTimer, PeakMemory, machine_info
from engine.decode.runner import ModelRunner
from engine.model.device import Device
from tests.tiny import tiny_llama

CPU = Device(torch.device("cpu"))


def test_a_log_sums_its_passes_and_leaves_the_prompts_out_of_decoding() -> None:
    log = ForwardLog(((12, 0.5), (1, 0.25), (3, 0.125)))
    assert log.seconds == 0.875 and log.decode_calls == ((1, 0.25), (3, 0.125))
    assert ForwardLog().seconds == 0 and ForwardLog().decode_calls == ()


def test_every_pass_is_timed_with_the_tokens_it_was_fed_until_removed() -> None:
    model = tiny_llama(seed=3)
    timer = ForwardTimer(model, CPU)
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3]]))
        model(torch.tensor([[4]]))  # positional ids too
    ModelRunner(model, CPU).forward([5, 6, 7, 8], logits_to_keep=1)  # the lean path, which no hook sees
    log = timer.take()
    assert [n for n, _ in log.calls] == [3, 1, 4] and all(s >= 0 for _, s in log.calls)
    assert timer.take() == ForwardLog()  # taken: a fresh start
    timer.remove()
    with torch.no_grad():
        model(torch.tensor([[4]]))
    ModelRunner(model, CPU).forward([5], logits_to_keep=1)
    assert timer.take() == ForwardLog()


def test_peak_memory_on_the_cpu_sees_an_allocation_after_a_reset() -> None:
    peak = PeakMemory(CPU)
    assert peak.kind in ("peak RSS (VmHWM)", "RSS after the reply")
    peak.reset()
    before = peak.peak()
    block = b"x" * (64 * 2**20)
    assert peak.peak() >= before + 60 * 2**20 and len(block)


def test_machine_info_describes_the_cpu_and_the_libraries() -> None:
    import transformers

    info = machine_info(CPU)
    assert info["device"] == f"cpu ({torch.get_num_threads()} threads)" and info["device_type"] == "cpu"
    assert info["torch"] == torch.__version__ and info["transformers"] == transformers.__version__
    assert info["cpu_count"] == os.cpu_count() and info["memory_total_bytes"] > 0
    assert "gpu" not in info and "cuda" not in info


def test_machine_info_names_the_cpu_kernel_that_ran_and_the_cpus_features(monkeypatch) -> None:
    """Figures from two machines are never compared blindly: the bench's JSON says which CPU
    kernel variant multiplied (or torch's) and which of the relevant flags the CPU reports."""
    from engine.quant import cpu_kernel

    monkeypatch.setenv(cpu_kernel.ENV, "avx2")
    info = machine_info(CPU)
    assert info["cpu_kernel"] == (cpu_kernel.variant() or "torch")
    assert info["cpu_features"] == cpu_kernel.cpu_features()
    monkeypatch.setenv(cpu_kernel.ENV, "torch")
    assert machine_info(CPU)["cpu_kernel"] == "torch"
