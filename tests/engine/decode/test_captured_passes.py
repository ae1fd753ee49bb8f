"""Captured passes (issue 35, items 2 and 4) on the CPU, through a stand-in backend that records
captures and replays each by calling the pass on the static buffers (as a CUDA graph reruns
its kernels on them): which shapes are captured, once each, replays that equal eager passes,
capturing again when the cache or the head changes, the fallback to eager passes with the
reason told once, and ``SPECCHAT_CUDA_GRAPHS=0``."""
from __future__ import annotations

import logging

import pytest
import torch

from engine.decode.decoder import SpecDecoder
from engine.decode.drafters import ModelDrafter, NgramDrafter
from engine.decode.runner import ModelRunner
from engine.events import GenerationParams
from engine.model.capture import (SPAN_STEP, SPANS_HELD, CudaGraphs, PassCapture, RecordingBackend,
                                  attention_span, capture_shapes)
from engine.model.device import Device
from engine.model.kv import StaticKV
from tests.tiny import noisy_copy, tiny_llama

CPU = Device(torch.device("cpu"))
PROMPT = [3, 5, 7, 11, 13]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(seed=1)


def captured(backend: RecordingBackend) -> Device:
    return Device(torch.device("cpu"), static_cache=True, graphs=backend)


def reply(decoder: SpecDecoder, prompt: list[int], **kw: object) -> tuple[list[int], list[str]]:
    out: list[int] = []
    notices: list[str] = []
    for event in decoder.generate(prompt, GenerationParams(**kw)):
        out += event.token_ids
        notices += [event.notice] if event.notice else []
    return out, notices


def test_capture_shapes_are_the_step_the_catch_up_and_each_verify_width() -> None:
    assert capture_shapes(3) == {(1, 1), (2, 1), (2, 2), (3, 3), (4, 4)}


def test_each_shape_is_captured_once_at_first_use_and_replays_equal_eager_passes(target) -> None:
    expected, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=40)
    backend = RecordingBackend()
    device = captured(backend)
    decoder = SpecDecoder(target, device, ModelDrafter(noisy_copy(target, 0.4, seed=3), device), calibrate_every=5)
    got, notices = reply(decoder, PROMPT, max_new_tokens=40, k=3)
    assert got == expected and notices == []
    target_shapes = decoder.target.capture.captured_shapes()
    draft_shapes = decoder.drafter.runner.capture.captured_shapes()  # type: ignore[union-attr]
    assert {(1, 1), (4, 4)} <= target_shapes <= capture_shapes(3)  # plain steps (calibration) and K=3 verifies
    assert (1, 1) in draft_shapes and draft_shapes <= {(1, 1), (2, 1)}
    assert len(backend.captured) == len(target_shapes) + len(draft_shapes)  # once per shape and runner
    assert backend.replayed > 20
    again, _ = reply(decoder, PROMPT + got + [7, 8], max_new_tokens=20, k=3)  # a second turn
    shapes = decoder.target.capture.captured_shapes() | decoder.drafter.runner.capture.captured_shapes()  # type: ignore[union-attr]
    assert len(backend.captured) == len(decoder.target.capture.captured_shapes()) + len(
        decoder.drafter.runner.capture.captured_shapes())  # type: ignore[union-attr]  # still once per shape
    assert shapes <= capture_shapes(3)
    assert again == reply(SpecDecoder(target, CPU), PROMPT + got + [7, 8], max_new_tokens=20)[0]


def test_a_replay_reads_the_static_buffers_it_was_captured_with() -> None:
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def static_pass(ids: torch.Tensor, cache: object, positions: torch.Tensor, keep: int, span: int) -> torch.Tensor:
        assert span == 16  # the window: the smallest span is larger
        seen.append((ids, positions))
        return (ids.float() * 100 + positions.float()).unsqueeze(-1)[:, -keep:]

    cache = StaticKV(1, 16)
    cache.allocate_layers(torch.zeros(1, 1, 0, 2))
    capture = PassCapture(RecordingBackend())
    first = capture.run(static_pass, cache, torch.tensor([[7, 8, 9]]), 4, 3)
    second = capture.run(static_pass, cache, torch.tensor([[1, 2, 3]]), 9, 3)
    assert first is not None and second is not None
    assert first.flatten().tolist() == [704, 805, 906] and second.flatten().tolist() == [109, 210, 311]
    assert all(ids is seen[0][0] and pos is seen[0][1] for ids, pos in seen)  # the same buffers every time
    assert capture.run(static_pass, cache, torch.tensor([[1, 2, 3, 4, 5, 6]]), 9, 1) is None  # not a captured shape


def test_a_span_covers_every_cached_key_and_wastes_under_a_step_or_a_third() -> None:
    assert [attention_span(n, 4096) for n in (1, 256, 257, 512, 513, 1024, 1025, 2049, 4096)] == [
        256, 256, 512, 512, 768, 1024, 1536, 3072, 4096]
    assert attention_span(300, 300) == 300 and attention_span(5, 100) == 100  # never past the window
    spans = [attention_span(n, 1 << 15) for n in range(1, 1 << 15)]
    assert all(s >= n for n, s in enumerate(spans, start=1))
    assert all(s - n < SPAN_STEP for n, s in enumerate(spans, start=1) if n <= 4 * SPAN_STEP)
    assert all((s - n) * 3 < s for n, s in enumerate(spans, start=1) if n > 4 * SPAN_STEP)
    assert len(set(spans)) <= 4 * 7 + 1  # four spans an octave from 256 to 32,768, and 256
    with pytest.raises(ValueError):
        attention_span(0, 16)


def test_a_reply_crossing_spans_captures_each_span_and_keeps_the_last_two() -> None:
    target = tiny_llama(seed=1)
    target.config.max_position_embeddings = 1024  # the window (rope has no limit of its own)
    prompt = [(7 * i) % 90 + 3 for i in range(250)]
    expected, _ = reply(SpecDecoder(target, CPU), prompt, max_new_tokens=24)
    backend = RecordingBackend()
    decoder = SpecDecoder(target, captured(backend), NgramDrafter())
    decoder.set_speculation(False)
    got, notices = reply(decoder, prompt, max_new_tokens=24)  # positions 250 .. 273: spans 256 and 512
    assert got == expected and notices == []
    capture = decoder.target.capture
    assert capture.captured_spans() == [256, 512] and capture.captured_shapes() == {(1, 1)}
    assert capture.captures == 2  # the one-token step once a span
    longer = [(5 * i) % 80 + 3 for i in range(600)]  # a new chat: 600 .. 611 lie in span 768
    again, _ = reply(decoder, longer, max_new_tokens=12)
    assert again == reply(SpecDecoder(target, CPU), longer, max_new_tokens=12)[0]
    assert capture.captured_spans()[-1] == 768 and len(capture.captured_spans()) <= SPANS_HELD
    assert len({k[2] for k in capture._captured}) <= SPANS_HELD  # older spans' graphs are dropped


def test_a_new_window_or_head_makes_the_runner_capture_again(target) -> None:
    backend = RecordingBackend()
    runner = ModelRunner(target, captured(backend))
    runner.forward([3, 5, 7, 11])  # the prefill allocates the cache eagerly
    assert backend.captured == []
    runner.forward([13])
    assert runner.capture.captures == 1
    runner.forward([17])
    assert runner.capture.captures == 1 and runner.capture.replays == 1
    runner.set_window(128)  # new buffers: the captured pass wrote the old ones
    logits = runner.forward([19])
    assert runner.capture.captures == 2
    fresh = ModelRunner(target, CPU)
    torch.testing.assert_close(logits, fresh.forward([3, 5, 7, 11, 13, 17, 19]), rtol=1e-5, atol=1e-4)
    runner.restrict_vocab(torch.arange(0, 96, 2))
    restricted = runner.forward([23])
    assert runner.capture.captures == 3 and backend.releases >= 2
    assert torch.isinf(restricted[0, 1::2]).all()  # the replayed pass runs the new head


def test_a_failing_capture_falls_back_to_eager_passes_and_says_why_once(target, caplog) -> None:
    expected, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=30)
    backend = RecordingBackend(fail_with=RuntimeError("operation not permitted when stream is capturing"))
    device = captured(backend)
    decoder = SpecDecoder(target, device, ModelDrafter(noisy_copy(target, 0.4, seed=3), device))
    with caplog.at_level(logging.WARNING, logger="engine.model.capture"):
        got, notices = reply(decoder, PROMPT, max_new_tokens=30, k=2)
        more, later = reply(decoder, PROMPT + got + [4], max_new_tokens=10, k=2)
    assert got == expected
    assert more == reply(SpecDecoder(target, CPU), PROMPT + got + [4], max_new_tokens=10)[0]
    assert len(notices) == 2 and later == []  # the target's reason and the draft's, once each
    assert all("operation not permitted when stream is capturing" in n and "eager" in n for n in notices)
    assert not decoder.target.capture.active and decoder.target.capture.captures == 0
    assert sum("capturing a" in r.getMessage() for r in caplog.records) == 2  # target and draft, once each


def test_the_real_backend_without_a_card_fails_into_the_fallback(target) -> None:
    if torch.cuda.is_available():
        pytest.skip("a card is here: the real backend would capture")
    capture = PassCapture(CudaGraphs(torch.device("cuda")))
    runner = ModelRunner(target, Device(torch.device("cpu"), static_cache=True))
    runner.capture = capture
    runner.forward([3, 5, 7])
    logits = runner.forward([11])
    assert not capture.active and "no CUDA support" in (capture.take_notice() or "")
    torch.testing.assert_close(logits, ModelRunner(target, CPU).forward([3, 5, 7, 11]), rtol=1e-5, atol=1e-4)


def test_the_environment_turns_captured_passes_off(target, monkeypatch) -> None:
    monkeypatch.setenv("SPECCHAT_CUDA_GRAPHS", "0")
    backend = RecordingBackend()
    decoder = SpecDecoder(target, captured(backend), NgramDrafter())
    got, notices = reply(decoder, [1, 2, 3, 1, 2, 3, 1, 2], max_new_tokens=20)
    assert backend.captured == [] and isinstance(decoder.target.cache, StaticKV)
    assert notices == ["captured passes off (SPECCHAT_CUDA_GRAPHS=0); eager passes"]
    assert got == reply(SpecDecoder(target, CPU), [1, 2, 3, 1, 2, 3, 1, 2], max_new_tokens=20)[0]


def test_the_cpu_default_captures_nothing_and_says_nothing(target) -> None:
    runner = ModelRunner(target, CPU)
    assert runner.capture.backend is None and runner.capture.take_notice() is None


def test_a_captured_round_still_reads_back_once(target, monkeypatch) -> None:
    from tests.engine.decode.test_gpu_syncs import Transfers

    device = captured(RecordingBackend())
    decoder = SpecDecoder(target, device, ModelDrafter(noisy_copy(target, 0.05, seed=2), device))
    steps = decoder.generate(PROMPT, GenerationParams(max_new_tokens=12, k=3))
    next(steps)
    next(steps)  # every shape this reply uses is captured by now
    transfers = Transfers(monkeypatch)
    event = next(steps)
    monkeypatch.undo()
    assert event.stats.proposed > 0 and decoder.target.capture.replays > 0
    assert transfers.calls == ["tolist"]  # the draft's K picks and the target's choices together


def compiles() -> int:
    import torch._dynamo.utils

    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def test_compiled_passes_give_the_eager_reply_and_compile_a_few_times_not_every_step(target, monkeypatch) -> None:
    import torch._dynamo

    monkeypatch.setenv("SPECCHAT_COMPILE", "aot_eager")  # dynamo's trace and aot's graphs, torch's own kernels
    torch._dynamo.reset()
    expected, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=30)
    device = captured(RecordingBackend())
    decoder = SpecDecoder(target, device, ModelDrafter(noisy_copy(target, 0.4, seed=3), device))
    before = compiles()
    got, notices = reply(decoder, PROMPT, max_new_tokens=30, k=3)
    assert got == expected and notices == []
    assert decoder.target.passes_compiled
    first = compiles() - before
    assert 1 <= first <= 8  # per runner: one token, several (any width), the whole window
    more, _ = reply(decoder, PROMPT + got + [4, 9], max_new_tokens=20, k=3)
    assert more == reply(SpecDecoder(target, CPU), PROMPT + got + [4, 9], max_new_tokens=20)[0]
    assert compiles() - before == first  # a second turn compiles nothing


def test_a_compile_that_fails_leaves_uncompiled_passes_and_says_so_once(target, monkeypatch, caplog) -> None:
    import engine.decode.runner as runner_module

    def broken(graph: object, inputs: object) -> object:
        raise RuntimeError("no compiler for this card")

    monkeypatch.setattr(runner_module, "compile_backend", lambda card=False: broken)
    expected, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=20)
    device = captured(RecordingBackend())
    decoder = SpecDecoder(target, device, NgramDrafter())
    with caplog.at_level(logging.WARNING, logger="engine.model.capture"):
        got, notices = reply(decoder, PROMPT, max_new_tokens=20)
        again, later = reply(decoder, PROMPT + got, max_new_tokens=5)
    assert got == expected and later == []
    assert len(notices) == 1 and "compiled passes off" in notices[0] and "no compiler for this card" in notices[0]
    assert not decoder.target.passes_compiled
    assert decoder.target.capture.active  # capture itself goes on, over the uncompiled pass


def test_one_compile_serves_every_layer(monkeypatch) -> None:
    """Regional compilation: the compiled function is one layer (its keys and values written once
    each), and a model of four layers compiles it a few times (widths), not once a layer."""
    import torch._dynamo

    import engine.decode.runner as runner_module

    graphs: list[torch.fx.GraphModule] = []

    def recording(gm: torch.fx.GraphModule, inputs: object) -> object:
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(runner_module, "compile_backend", lambda card=False: recording)
    torch._dynamo.reset()
    model = tiny_llama(seed=2, layers=4)
    expected, _ = reply(SpecDecoder(model, CPU), PROMPT, max_new_tokens=16)
    decoder = SpecDecoder(model, captured(RecordingBackend()), NgramDrafter())
    got, notices = reply(decoder, PROMPT, max_new_tokens=16)
    assert got == expected and notices == [] and decoder.target.passes_compiled
    writes = [sum("index_copy" in str(node.target) for node in gm.graph.nodes) for gm in graphs]
    assert writes and all(w == 2 for w in writes), writes
    assert len(graphs) < 4, f"{len(graphs)} graphs for 4 layers"


def test_a_card_compiles_by_default_and_the_environment_decides_first(monkeypatch) -> None:
    from engine.model.compiled import compile_backend

    monkeypatch.delenv("SPECCHAT_COMPILE", raising=False)
    assert compile_backend(card=True) == "inductor" and compile_backend(card=False) is None
    monkeypatch.setenv("SPECCHAT_COMPILE", "0")
    assert compile_backend(card=True) is None
    monkeypatch.setenv("SPECCHAT_COMPILE", "1")
    assert compile_backend(card=False) == "inductor"
    monkeypatch.setenv("SPECCHAT_COMPILE", "aot_eager")
    assert compile_backend(card=True) == "aot_eager"
    monkeypatch.setenv("SPECCHAT_COMPILE", "junk")  # it ended every load with torch's InvalidBackend traceback
    from engine.errors import SettingError

    with pytest.raises(SettingError, match=r"SPECCHAT_COMPILE='junk': use 1 or 0 \(on or off\), a torch.compile "
                                           r"backend \(.*inductor.*\), or unset it"):
        compile_backend(card=True)


def test_compiling_at_load_leaves_the_first_reply_nothing_to_compile(target, monkeypatch) -> None:
    """``compile_now`` (the loader's stage) compiles the one-token and the many-token layer, leaves
    the caches empty, and the replies after it compile nothing and equal eager decoding's."""
    import torch._dynamo

    monkeypatch.setenv("SPECCHAT_COMPILE", "aot_eager")
    torch._dynamo.reset()
    expected, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=24)
    device = captured(RecordingBackend())
    decoder = SpecDecoder(target, device, ModelDrafter(noisy_copy(target, 0.4, seed=3), device))
    before = compiles()
    assert decoder.compile_now() > 0
    at_load = compiles() - before
    assert at_load >= 2  # one token, and every width from two up
    assert len(decoder.target) == 0 and decoder.target.cached_length() == 0
    assert len(decoder.drafter.runner) == 0  # type: ignore[union-attr]
    got, notices = reply(decoder, PROMPT, max_new_tokens=24, k=3)
    assert got == expected and notices == []
    assert compiles() - before == at_load
    assert decoder.compile_now() == 0.0  # once


def test_only_layers_of_tensors_are_compiled_by_default() -> None:
    """A card compiles by default only a model whose projections are all tensors; a layer of
    another kind (bitsandbytes', here a subclass of ``nn.Linear``) would break the trace."""
    from engine.model.lean import lean_forward

    class Wrapped(torch.nn.Linear):
        pass

    plain = tiny_llama(seed=4)
    assert lean_forward(plain).compilable  # type: ignore[union-attr]
    odd = tiny_llama(seed=4)
    down = odd.model.layers[1].mlp.down_proj
    wrapped = Wrapped(down.in_features, down.out_features, bias=False)
    wrapped.weight = down.weight
    odd.model.layers[1].mlp.down_proj = wrapped
    assert not lean_forward(odd).compilable  # type: ignore[union-attr]


def test_out_of_memory_while_compiling_at_load_leaves_uncompiled_passes(target, monkeypatch) -> None:
    """A card that runs out of memory in the loader's compile keeps the model: uncompiled passes, an
    empty cache, the reason told once with the first reply, and that reply the eager one."""
    import torch._dynamo

    monkeypatch.setenv("SPECCHAT_COMPILE", "aot_eager")
    torch._dynamo.reset()
    expected, _ = reply(SpecDecoder(target, CPU), PROMPT, max_new_tokens=16)
    decoder = SpecDecoder(target, captured(RecordingBackend()))
    runner = decoder.target
    real = runner.forward

    def short_of_memory(ids: object, logits_to_keep: int = 1) -> torch.Tensor:
        if len(runner) == 2:  # the second pass of the compile
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return real(ids, logits_to_keep)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "forward", short_of_memory)
    decoder.compile_now()
    monkeypatch.setattr(runner, "forward", real)
    assert not runner.passes_compiled and len(runner) == 0 and runner.cached_length() == 0
    got, notices = reply(decoder, PROMPT, max_new_tokens=16)
    assert got == expected
    assert len(notices) == 1 and "out of memory while compiling" in notices[0] and "2.00 GiB" in notices[0]
