"""Can this draft model draft for this target? Only if they speak the same token ids.

Speculative decoding compares draft and target token by token, so both must
map every token string to the same id and agree on the special ids. Vocabulary
*sizes* may differ (Qwen2.5-7B pads its embedding to 152064 rows, 0.5B to
151936, with identical tokenizers), so the token -> id maps are compared.
"""
from __future__ import annotations

from typing import Any

from engine.errors import IncompatibleDraftError

SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")

# Used only when a target tokenizer has no chat template of its own.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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


def check_pair(target_tok: Any, draft_tok: Any) -> None:
    """Raise :class:`IncompatibleDraftError` saying what differs between the two tokenizers."""
    problems: list[str] = []
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    diffs = vocab_differences(target_vocab, draft_vocab)
    if diffs:
        token, tid, did = diffs[0]
        example = (
            f"{token!r} is id {tid} in the target but {'missing' if did is None else f'id {did}'} in the draft"
            if tid is not None else f"{token!r} (id {did}) exists only in the draft"
        )
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


def chat_template(target_tok: Any) -> str:
    """The target's chat template (the draft's is never used), or a plain ChatML fallback."""
    template = getattr(target_tok, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default") or next(iter(template.values()), None)
    return template or FALLBACK_CHAT_TEMPLATE
