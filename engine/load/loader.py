"""Put a whole engine together from a profile (one model is loaded by :mod:`engine.load.weights`).

:func:`load_engine` resolves both sources, reads their configs, makes the
memory plan *before* any weight is read, loads the target, checks that the
draft's tokenizer matches (falling back to the n-gram drafter when it does
not, or when the plan has no room for it) and returns a ready
:class:`engine.chat.session.ChatEngine`.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.api import EngineInfo
from engine.progress import DownloadMeter, ProgressFn, Steps, no_progress, ticking
from engine.model.compat import check_pair
from engine.model.device import Device, oom_summary
from engine.environment import device_override
from engine.errors import IncompatibleDraftError, ModelSourceError, ProfileError, QuantizationError
from engine.model.plan import Plan, plan_memory
from engine.config.profiles import ModelProfile, ModelSpec
from engine.fetch.sources import ResolvedSource, download_meter, locate, prepare, read_config
from engine.load.weights import load_tokenizer, load_weights, same_tokenizer_files

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from engine.decode.drafters import ModelDrafter

    from engine.chat.session import ChatEngine

log = logging.getLogger(__name__)


def frequent_token_ids(tokenizer: "PreTrainedTokenizerBase", n: int) -> "torch.Tensor":
    """The ``n`` token ids a frequent-token draft head keeps (FR-Spec), plus every special token.

    A byte-level BPE vocabulary numbers its tokens in merge order, and merges are
    made most-frequent first, so the lowest ids approximate the most frequent
    tokens without a corpus to count them on.
    """
    import torch

    ids = {int(i) for i in tokenizer.all_special_ids}
    candidates = iter(range(len(tokenizer)))
    while len(ids) < n or len(ids) % 16:  # the int4 kernel packs output rows in 16s
        nxt = next(candidates, None)
        if nxt is None:
            break
        ids.add(nxt)
    return torch.tensor(sorted(ids), dtype=torch.long)


def model_drafter(profile: ModelProfile, draft_model: "PreTrainedModel", target_model: "PreTrainedModel",
                  tokenizer: "PreTrainedTokenizerBase", device: Device) -> "ModelDrafter":
    """The drafter a profile's draft model makes: its frequent-token head (``draft_vocab``),
    no id past the target's vocabulary, and an n-gram lookup asked first (``lookup``)."""
    from engine.decode.drafters import ModelDrafter, NgramDrafter

    assert profile.draft is not None
    spec = profile.draft
    subset = frequent_token_ids(tokenizer, spec.draft_vocab) if spec.draft_vocab else None
    return ModelDrafter(draft_model, device, name=spec.label, vocab_subset=subset,
                        vocab_limit=int(target_model.config.get_text_config().vocab_size),
                        lookup=NgramDrafter() if profile.lookup else None)


def profile_device(profile: ModelProfile) -> Device:
    """Where a profile runs (:func:`profile_device_choice`)."""
    return profile_device_choice(profile)[0]


def profile_device_choice(profile: ModelProfile) -> tuple[Device, str | None]:
    """Where a profile runs and why not on a card where it could have: the CPU for ``device =
    "cpu"``; else CUDA when present (``SPECCHAT_DEVICE`` respected), except that a ``device =
    "any"`` profile with int4 models (and none that needs bitsandbytes, which the CPU cannot run)
    falls back to the CPU on a card that cannot run torch's int4 kernels
    (:func:`engine.model.device.choose_device`)."""

    import torch

    from engine.model.device import choose_device
    from engine.quant.int4 import cuda_int4_problem

    cuda_found = profile.device != "cpu" and torch.cuda.is_available()
    specs = [s for s in (profile.target, profile.draft) if s is not None]
    # a bitsandbytes model runs on a card only: such a profile is refused with the way out, not moved
    int4 = any(s.quantization == "int4" for s in specs) and not any(s.quantization in ("nf4", "int8") for s in specs)
    problem = cuda_int4_problem(torch.device("cuda")) if cuda_found and int4 else None
    name, reason = choose_device(profile.device, cuda_found=cuda_found, int4=int4, int4_problem=problem,
                                 override=device_override())
    return Device(torch.device(name)), reason


def cpu_kernel_name(spec: ModelSpec, device: Device) -> str | None:
    """Which CPU int4 kernel multiplies ``spec``'s weights on ``device``: a variant of specchat's
    (``avx2``, ``avx512-vnni``, ``avx-vnni``) or ``torch``; None off the CPU or without int4."""
    from engine.quant import cpu_kernel

    if device.is_cuda or spec.quantization != "int4":
        return None
    return cpu_kernel.variant() or "torch"


def check_int4_device(profile: ModelProfile, device: Device) -> None:
    """Raise :class:`QuantizationError` when an int4 model of ``profile`` would go to a card
    whose torch int4 kernels do not run (below compute capability 8.0, or a torch built for
    CUDA before 12), naming the two ways out."""
    from engine.quant.int4 import cuda_int4_problem

    problem = cuda_int4_problem(device.torch_device)
    if problem is None:
        return
    for role, spec in (("target", profile.target), ("draft", profile.draft)):
        if spec is not None and spec.quantization == "int4":
            raise QuantizationError(
                f"profile {profile.name!r}: its {role} {spec.label} uses quantization = \"int4\", but {problem}. "
                f"Set device = \"cpu\" in the profile to run it on the CPU, or choose quantization = \"nf4\" "
                "(bitsandbytes) or \"none\" for this card")


@dataclass
class _Side:
    """One model of the pair while the engine is being put together."""

    spec: ModelSpec
    resolved: ResolvedSource
    config: Any


def _locate_side(spec: ModelSpec, progress: ProgressFn, reuse: _Side | None = None,
                 meter: DownloadMeter | None = None) -> _Side:
    resolved = locate(spec, progress, meter)
    if reuse is not None and reuse.resolved.location == resolved.location:
        return _Side(spec, resolved, reuse.config)
    with ticking(progress, f"reading the settings of {spec.label}", 0.05):  # a GGUF's metadata: seconds
        return _Side(spec, resolved, read_config(resolved, spec))


def _footprint(model: Any) -> int | None:
    try:
        return int(model.get_memory_footprint())
    except (AttributeError, RuntimeError):
        return None


def _free_after_warm_up(target_model: Any, device: Device, free_before: int) -> tuple[int, int] | None:
    """``(free, used by the target)`` bytes, measured after one warm-up pass of the
    target over 8 tokens (a verify pass's shape) has loaded the kernels and
    workspaces a first pass allocates lazily, and its cache and activations were
    freed again. None when even that pass ran out of memory."""
    from engine.decode.runner import ModelRunner

    runner, failed = ModelRunner(target_model, device, window=8), False  # a card's static cache: 8 tokens, not the window
    try:
        runner.forward([0] * 8, logits_to_keep=8)
    except Exception as exc:  # noqa: BLE001 - only OOM is handled
        if not device.is_out_of_memory(exc):
            raise
        failed = True
    runner.release()
    device.release_memory()  # outside the except block: the failed pass's frames are gone
    if failed:
        return None
    free_now, _total = device.memory_free_total()
    return free_now, max(0, free_before - free_now)


def _load_draft(draft: _Side, device: Device, on_layer: Callable[[int, int], None] | None = None,
                ) -> tuple[Any, str | None]:
    """The draft's weights; or None and the reason when loading ran out of memory. The
    memory is released after the ``except`` block is left: until then the
    exception's traceback keeps the half-loaded model alive."""
    error = ""
    try:
        return load_weights(draft.resolved, draft.spec, device, draft.config, on_layer), None
    except Exception as exc:  # noqa: BLE001 - only OOM is handled
        if not device.is_out_of_memory(exc):
            raise
        error = oom_summary(exc)
    device.release_memory()
    return None, f"draft model dropped: out of memory while loading it ({error}); using the n-gram drafter"


def load_engine(
    profile: ModelProfile,
    *,
    memory_budget: int | None = None,
    device: Device | None = None,
    progress: ProgressFn = no_progress,
) -> "ChatEngine":
    """Everything ``profile`` names, planned, loaded and checked: a ready ChatEngine.

    ``memory_budget`` (the ``--memory-budget`` option) overrides the profile's.
    A ``backend = "server"`` profile gets a connected
    :class:`~engine.remote.backend.ServerBackend` instead (same ChatBackend surface).
    """
    if profile.backend == "server":  # the server decodes; nothing loads here
        from engine.remote import connect

        return connect(profile, progress)  # type: ignore[return-value]
    from engine.fetch.convert import one_metadata_read

    with one_metadata_read():  # a GGUF's metadata is parsed once, not by each reader of it
        return _load_local(profile, memory_budget, device, progress)


def _load_local(profile: ModelProfile, memory_budget: int | None, device: Device | None,
                progress: ProgressFn) -> "ChatEngine":
    """:func:`load_engine` for a profile that runs here."""
    from engine.load.availability import unavailable_reason
    from engine.decode.drafters import NgramDrafter
    from engine.decode.suffix import SuffixDrafter
    from engine.chat.session import ChatEngine

    device_reason: str | None = None
    if device is None:
        device, device_reason = profile_device_choice(profile)
        if device_reason:
            log.info("profile %s runs on the CPU: %s", profile.name, device_reason)
    why_not = unavailable_reason(profile, cuda=device.is_cuda)
    if why_not:
        raise ProfileError(f"profile {profile.name!r} cannot run here: {why_not}; pick another profile")
    check_int4_device(profile, device)  # before anything is downloaded

    progress("locating models", None)
    with_draft = profile.drafter == "model" and profile.draft is not None
    meter = download_meter([profile.target, *([profile.draft] if with_draft and profile.draft else [])], progress)
    target = _locate_side(profile.target, progress, meter=meter)
    draft: _Side | None = None
    draft_error: str | None = None
    if profile.drafter == "model" and profile.draft is not None:
        try:
            draft = _locate_side(profile.draft, progress, reuse=target, meter=meter)
        except ModelSourceError as exc:
            if profile.draft_required:  # asked for by name for this run: bad input, as a missing target is
                raise ModelSourceError(f"--draft {profile.draft.source}: {exc}") from None
            draft_error = f"the draft {profile.draft.label} is unavailable ({exc})"
    free, _total = device.memory_free_total()
    plan: Plan = plan_memory(
        target.config, draft.config if draft else None, profile, free,
        memory_budget=memory_budget, cuda=device.is_cuda, bf16=device.fast_bf16, draft_error=draft_error,
        graphs=device.uses_static_cache() and device.graph_backend()[0] is not None,
    )
    log.info("memory plan: %s", plan.summary())
    fallback = plan.reason if plan.choice == "target+ngram" and profile.drafter == "model" else None

    kernel = cpu_kernel_name(profile.target, device)
    stage = f"loading target {profile.target.label}{f' on the {kernel} CPU kernel' if kernel else ''}"
    progress(stage, 0.1)
    target.resolved = prepare(target.resolved, progress)  # the converted copy: read as later starts read it
    layers = Steps("layers")  # minutes while an int4 cache is built: say how many layers are done
    with ticking(progress, stage, 0.1, end=0.55, steps=layers):
        target_model = load_weights(target.resolved, profile.target, device, target.config, layers)
    tokenizer = load_tokenizer(target.resolved, profile.target)

    drafter: Any = None
    draft_model: Any = None
    compat_note: str | None = None
    if plan.choice == "target+draft" and draft is not None:
        progress(f"checking draft {draft.spec.label}", 0.6)
        try:
            same = same_tokenizer_files(target.resolved, draft.resolved)
            compat_note = check_pair(tokenizer, tokenizer if same else load_tokenizer(draft.resolved, draft.spec)).summary
        except IncompatibleDraftError as exc:
            fallback = f"draft model dropped: {exc}"
        else:
            # Decide on the draft from memory measured now, then load it (an OOM there falls back too).
            measured = _free_after_warm_up(target_model, device, free)
            fallback = plan.draft_shortfall(*measured) if measured else (
                "draft model dropped: the target's first pass ran out of memory; using the n-gram drafter")
            if fallback is None:
                progress(f"loading draft {draft.spec.label}", 0.7)
                draft.resolved = prepare(draft.resolved, progress)
                layers = Steps("layers")
                with ticking(progress, f"loading draft {draft.spec.label}", 0.7, end=0.95, steps=layers):
                    draft_model, fallback = _load_draft(draft, device, layers)
        if draft_model is not None:
            drafter = model_drafter(profile, draft_model, target_model, tokenizer, device)
    if drafter is None and profile.drafter != "none":
        drafter = SuffixDrafter() if profile.drafter == "suffix" else NgramDrafter()
    if plan.choice == "target+draft" and draft_model is None:  # dropped after planning: the plan says so
        plan = plan.without_draft(fallback or "the draft model was not loaded")
    if fallback:
        log.warning("%s", fallback)
    if compat_note:
        log.info("%s", compat_note)

    mode = "plain" if drafter is None else ("spec" if draft_model is not None else "ngram")
    info = EngineInfo(
        profile=profile.name,
        target=profile.target.label,
        drafter="none" if drafter is None else str(drafter.name),
        mode=mode,
        device=device.description + (f"; not a card: {device_reason}" if device_reason else ""),
        quantization=profile.target.quantization,
        plan=plan.to_dict(),
        fallback_reason=fallback,
        target_bytes=_footprint(target_model),
        draft_bytes=_footprint(draft_model) if draft_model is not None else None,
        free_bytes=free,
        compat_note=compat_note,
        cpu_kernel=kernel,
    )
    engine = ChatEngine(tokenizer=tokenizer, target_model=target_model, drafter=drafter, device=device, info=info)
    if engine.decoder.target.passes_compiled:  # a card: the layers compile here, not in the first reply
        with ticking(progress, COMPILE_STAGE, 0.96):
            seconds = engine.decoder.compile_now()
        log.info("compiled the static passes in %.1f s (SPECCHAT_COMPILE=0 turns compiling off)", seconds)
    progress("ready", 1.0)
    return engine


COMPILE_STAGE = "compiling the model's layers for this card (about 30 s at a first start, less once cached)"
