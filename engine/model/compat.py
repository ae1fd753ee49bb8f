"""Can this draft model draft for this target? Only if they speak the same token ids.

Speculative decoding compares draft and target token by token, so both must
map every token string to the same id and agree on the special ids. Vocabulary
*sizes* may differ (Qwen2.5-7B pads its embedding to 152064 rows, 0.5B to
151936, with identical tokenizers), so the token -> id maps are compared.

One kind of difference is let through, counted and reported: special tokens
that are reserved or unused (placeholders such as Llama 3's
``<|reserved_special_token_N|>``), i.e. marked special, named in neither chat
template and not the BOS/EOS/PAD id. A related model may name a few of those
slots differently (Llama 3.2 beside 3.1), and about 245 of them would otherwise
refuse a good pair. Letting them through costs nothing in exactness: the target
verifies ids, so a draft token it would not emit is simply rejected.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from engine.errors import IncompatibleDraftError

SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")

def vocab_differences(target_vocab: dict[str, int], draft_vocab: dict[str, int]) -> list[tuple[str, int | None, int | None]]:
    """``(token, target_id, draft_id)`` for every token whose id differs or that only one side has,
    in target id order, then draft-only tokens in draft id order."""
    diffs: list[tuple[str, int | None, int | None]] = []
    for token, tid in sorted(target_vocab.items(), key=lambda item: item[1]):
        did = draft_vocab.get(token)
        if did != tid:
            diffs.append((token, tid, did))
    only_draft = sorted((did, token) for token, did in draft_vocab.items() if token not in target_vocab)
    diffs.extend((token, None, did) for did, token in only_draft)
    return diffs


Difference = tuple[str, "int | None", "int | None"]


@dataclass(frozen=True)
class PairReport:
    """What :func:`check_pair` let through: differences ``(token, target_id,
    draft_id)`` confined to reserved or unused special tokens."""

    ignored: tuple[Difference, ...] = ()

    @property
    def summary(self) -> str | None:
        """One line for the log and ``EngineInfo.compat_note``; None when the maps are equal."""
        if not self.ignored:
            return None
        shown = "; ".join(_describe(d) for d in self.ignored[:3]) + ("; ..." if len(self.ignored) > 3 else "")
        return (f"tokenizers match except {len(self.ignored)} reserved or unused special token(s), which no chat "
                f"template uses and which are ignored: {shown}")


def _describe(diff: Difference) -> str:
    token, tid, did = diff
    if tid is None:
        return f"{token!r} (id {did}) exists only in the draft"
    return f"{token!r} is id {tid} in the target but {'missing' if did is None else f'id {did}'} in the draft"


def _special_tokens(tok: Any) -> set[str]:
    added = getattr(tok, "added_tokens_decoder", None) or {}
    return {t.content for t in added.values() if getattr(t, "special", False)} | set(getattr(tok, "all_special_tokens", ()))


def _template_text(tok: Any) -> str:
    template = getattr(tok, "chat_template", None) or ""
    return "\n".join(template.values()) if isinstance(template, dict) else str(template)


def _reserved_filter(target_tok: Any, draft_tok: Any) -> "Callable[[Difference], bool]":
    """True for a difference confined to special tokens named in neither chat
    template, on neither side a BOS/EOS/PAD id."""
    specials = (_special_tokens(target_tok), _special_tokens(draft_tok))
    templates = _template_text(target_tok) + "\n" + _template_text(draft_tok)
    fixed = {getattr(tok, attr, None) for tok in (target_tok, draft_tok) for attr in SPECIAL_IDS} - {None}

    def reserved(diff: Difference) -> bool:
        token, *ids = diff
        sides = [(i, names) for i, names in zip(ids, specials) if i is not None]
        return token not in templates and all(token in names and i not in fixed for i, names in sides)

    return reserved


def check_pair(target_tok: Any, draft_tok: Any) -> PairReport:
    """Raise :class:`IncompatibleDraftError` saying what differs between the two
    tokenizers; otherwise report the reserved special tokens that differ (if any)."""
    problems: list[str] = []
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    reserved = _reserved_filter(target_tok, draft_tok)
    ignored, diffs = [], []
    for diff in vocab_differences(target_vocab, draft_vocab):
        (ignored if reserved(diff) else diffs).append(diff)
    if diffs:
        example = _describe(diffs[0])
        problems.append(
            f"{len(diffs)} token ids differ (target has {len(target_vocab)} tokens, draft {len(draft_vocab)}; "
            f"e.g. {example})"
        )
    for attr in SPECIAL_IDS:
        t, d = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if t != d:
            problems.append(f"{attr.removesuffix('_token_id').upper()} id differs (target {t}, draft {d})")
    if problems:
        raise IncompatibleDraftError(
            "the draft model's tokenizer does not match the target's: " + "; ".join(problems)
            + ". Pick a draft from the same model family (same tokenizer), or use the n-gram drafter."
        )
    return PairReport(tuple(ignored))
