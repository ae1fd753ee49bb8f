"""Text: chat templates, incremental detokenisation and stop strings.

The only module of the engine that handles text; the decoder sees token ids.
"""
from __future__ import annotations

import dataclasses
import logging

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from engine.errors import SpecChatError
from engine.events import ChatMessage, TextPiece


# Private-use characters that fence a message's text while the template is rendered, so its
# place in the prompt is known exactly (checked: neither may occur in the messages or the template).
_OPEN, _CLOSE = "\ue000", "\ue001"

log = logging.getLogger(__name__)


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[ChatMessage]) -> list[int]:
    """Token ids ``[L]`` of the conversation with the assistant's turn opened,
    through the tokenizer's own chat template.

    A message's text is read as text: a control token's spelling typed or pasted into a
    message (``<|im_end|>``, say) becomes the ordinary tokens that spell it, not the control
    token, so no message can close its own turn or open another speaker's. Only the template
    writes control tokens. A prompt none of whose messages spell one is tokenized exactly as
    the template's own ``tokenize=True`` does; one that does is tokenized piece by piece, split
    where such a message's text begins and ends.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise SpecChatError(
            "the target model's tokenizer has no chat template; use an instruct/chat model "
            "or set one in the tokenizer files"
        )
    convo = [{"role": m.role, "content": m.content} for m in messages]
    spellings = _control_spellings(tokenizer)
    if any(s in m.content for m in messages for s in spellings):
        ids = _render_as_text(tokenizer, convo, spellings)
        if ids is not None:
            return ids
    ids = tokenizer.apply_chat_template(convo, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _control_spellings(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The text of every special (control) token the tokenizer would read out of a string."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    found = {str(t.content) for t in added.values() if getattr(t, "special", False)}
    found.update(str(t) for t in getattr(tokenizer, "all_special_tokens", ()) or ())
    return tuple(sorted(s for s in found if s))


def _fenced(text: str) -> str:
    """``text`` with the fences inside its outer white space, so that a template that trims a
    message (Llama 3's ``| trim``) trims the same characters with the fences on."""
    core = text.strip()
    lead = text[: len(text) - len(text.lstrip())]
    return f"{lead}{_OPEN}{core}{_CLOSE}{text[len(lead) + len(core):]}"


def _render_as_text(
    tokenizer: PreTrainedTokenizerBase, convo: list[dict[str, str]], spellings: Sequence[str]
) -> list[int] | None:
    """The prompt's ids with the messages that spell a control token encoded as plain text,
    the template's own text as the template writes it; None (and a line in the log) where
    the template alters a message's text, so its place cannot be found exactly."""
    fenced = [{**m, "content": _fenced(m["content"])} if any(s in m["content"] for s in spellings) else m
              for m in convo]
    plain = tokenizer.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)
    marked = tokenizer.apply_chat_template(fenced, add_generation_prompt=True, tokenize=False)
    fences_free = not any(_OPEN in m["content"] or _CLOSE in m["content"] for m in convo) \
        and _OPEN not in plain and _CLOSE not in plain
    if not fences_free or marked.replace(_OPEN, "").replace(_CLOSE, "") != plain:
        log.warning("the chat template alters message text; control-token spellings in messages stay as typed")
        return None
    ids: list[int] = []
    for i, part in enumerate(marked.replace(_CLOSE, _OPEN).split(_OPEN)):
        if not part:
            continue
        encoded = tokenizer(part, add_special_tokens=False, split_special_tokens=i % 2 == 1)
        ids.extend(int(t) for t in encoded["input_ids"])
    return ids


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, generation_config: object | None = None) -> tuple[int, ...]:
    """The ids that end a reply: the tokenizer's EOS plus the model's generation-config EOS ids."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    extra = getattr(generation_config, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(t) for t in extra)
    return tuple(sorted(ids))


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text deltas.

    Decoding token by token breaks multi-byte characters (a UTF-8 character
    split over two byte-level tokens) and word boundaries (SentencePiece's
    leading-space marker). Like vLLM and TGI, this decodes a short window of
    recent tokens twice, with and without the new ones, emits the difference,
    and holds text back while it ends in an incomplete character (U+FFFD).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (maybe empty)."""
        self.ids.append(int(token_id))
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is held back at the end of the reply, but for a character the end cut in two
        (held back because it ended in U+FFFD: a reply cut by its token limit mid-character ended
        in a "�" the model never wrote; its bytes stay in the token ids)."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        delta = new_text[len(prefix_text) :].rstrip("\ufffd") if len(new_text) > len(prefix_text) else ""
        self.prefix_offset = self.read_offset = len(self.ids)
        self.text += delta
        return delta


def find_stop(text: str, stop_strings: Sequence[str], searched: int) -> int | None:
    """Index in ``text`` where the first stop string starts, looking only at
    text that may contain a match not seen before (``searched`` characters of
    ``text`` were checked already)."""
    best: int | None = None
    for stop in stop_strings:
        if not stop:
            continue
        at = text.find(stop, max(0, searched - len(stop) + 1))
        if at != -1 and (best is None or at < best):
            best = at
    return best


class StopStringFilter:
    """Releases streamed text only once it can no longer be part of a stop string.

    The last ``len(longest stop) - 1`` characters are held back between
    rounds, so a stop string split across two rounds never shows its first
    half on screen. Pieces keep their draft/target attribution when split.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self.stops = [s for s in stop_strings if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.released = 0
        self.pending: list[TextPiece] = []

    def feed(self, pieces: Sequence[TextPiece], final: bool) -> tuple[list[TextPiece], bool]:
        """Add a round's pieces; returns the pieces safe to show now and whether
        a stop string was found (the text then ends just before it)."""
        searched = len(self.text)
        self.pending.extend(p for p in pieces if p.text)
        self.text += "".join(p.text for p in pieces)
        stop_at = find_stop(self.text, self.stops, searched)
        if stop_at is not None:
            limit = stop_at
        elif final:
            limit = len(self.text)
        else:
            limit = max(self.released, len(self.text) - self.hold)
        return self._take(limit - self.released), stop_at is not None

    def _take(self, n: int) -> list[TextPiece]:
        out: list[TextPiece] = []
        while n > 0 and self.pending:
            piece = self.pending[0]
            if len(piece.text) <= n:
                out.append(self.pending.pop(0))
            else:
                out.append(dataclasses.replace(piece, text=piece.text[:n]))
                self.pending[0] = dataclasses.replace(piece, text=piece.text[n:])
            n -= len(out[-1].text)
            self.released += len(out[-1].text)
        return out
