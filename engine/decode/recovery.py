"""What the decoder does when a pass runs out of memory (or a draft's logits go non-finite): the
drafter is dropped for good and the reply goes on with plain decoding from where it stood, with a
notice saying so; the target's own out-of-memory error is an :class:`~engine.errors.EngineError`
that tells the user what to change. Mixed into :class:`~engine.decode.decoder.SpecDecoder`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from engine.decode.drafters import EMPTY_DRAFT, Draft, Drafter
from engine.decode.runner import ModelRunner
from engine.decode.sampling import Randomness
from engine.decode.verify import Verdict
from engine.errors import EngineError, NonFiniteLogitsError
from engine.events import GenerationParams
from engine.model.device import Device, Mark

T = TypeVar("T")
TARGET_OOM = ("the target model ran out of memory; start a new chat (a shorter context), lower the "
              "profile's context_length, or choose a smaller quantization or profile")


class Decoder(Protocol):
    """What recovery uses of :class:`~engine.decode.decoder.SpecDecoder` (named here, not imported:
    the decoder imports this module)."""

    target: ModelRunner
    drafter: Drafter | None
    device: Device
    fallback_reason: str | None

    def _release(self, *, target: bool) -> None: ...

    def _verify(self, seq: list[int], draft: Draft, params: GenerationParams, generator: Randomness) -> Verdict: ...

    def drop_drafter(self, reason: str) -> str: ...

    def _guarded(self, step: Callable[[], T], reason: str | Callable[[], str],
                 instead: Callable[[], T]) -> tuple[T, str | None]: ...


class DraftRecovery:
    """Dropping the drafter on out-of-memory, mixed into :class:`~engine.decode.decoder.SpecDecoder`."""

    def drop_drafter(self: Decoder, reason: str) -> str:
        """Free the drafter for good and go on with plain decoding; returns the notice."""
        self._release(target=False)
        self.fallback_reason = reason
        return f"draft dropped ({reason}); continuing with plain decoding"

    def _verify_alone(self: Decoder, seq: list[int], params: GenerationParams,
                      generator: Randomness) -> tuple[Draft, Verdict, Mark]:
        """After a failed :func:`~engine.decode.read_once.draft_and_verify` (the drafter dropped): the target's own pass,
        from where the round began."""
        self.target.truncate(len(seq) - 1)
        t_draft = self.device.mark()
        return EMPTY_DRAFT, self._verify(seq, EMPTY_DRAFT, params, generator), t_draft

    def _guarded(self: Decoder, step: Callable[[], T], reason: str | Callable[[], str],
                 instead: Callable[[], T]) -> tuple[T, str | None]:
        """Run ``step``; on out-of-memory, or NaN/inf logits from the draft model, drop the
        drafter and run ``instead``. Returns the result and the notice (None if ``step``
        succeeded). Recovery runs after the ``except`` block: until then the traceback keeps
        the failed pass's frames and activations alive (pytorch/pytorch#18853). With no
        drafter to drop, an unchained :class:`EngineError`. The target's NaN/inf logits
        raise :class:`~engine.errors.NonFiniteLogitsError` as they are."""
        non_finite: str | None = None  # the error's text, not the error: its traceback holds the frames
        try:
            return step(), None
        except NonFiniteLogitsError as exc:
            if exc.role != "draft" or self.drafter is None:
                raise
            non_finite = str(exc)
        except Exception as exc:  # noqa: BLE001 - everything but OOM is re-raised as is
            if not self.device.is_out_of_memory(exc):
                raise
        if self.drafter is None:
            raise EngineError(TARGET_OOM)
        reason = reason if isinstance(reason, str) else reason()
        if non_finite is not None:
            reason = f"{reason.replace('out of memory', 'non-finite logits')}: {non_finite}"
        notice = self.drop_drafter(reason)  # releases memory: the failed frames are gone by now
        # The retry is guarded too: with the drafter gone, an OOM there is the EngineError.
        return self._guarded(instead, reason, instead)[0], notice
