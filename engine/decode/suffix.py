"""Suffix drafting: continuations looked up in the conversation and in every earlier chat.

After SuffixDecoding (Oliaro et al., NeurIPS 2025). Two structures answer "what
followed the context's last tokens before?":

* the **conversation** itself (system prompt, earlier turns, the reply so far),
  indexed as :class:`~engine.decode.drafters.NgramDrafter` indexes it: the most
  recent occurrence of the longest matching suffix, updated as tokens are accepted;
* a **global** :class:`SuffixIndex` over earlier chats (prompts and replies from
  the history, and replies finished since the profile loaded): a suffix array over
  their tokens, built in one go (numpy prefix doubling) and swapped in whole.

A global proposal follows the tree of continuations by **evidence**: from the
longest suffix of the context that occurs earlier (``m`` tokens, at least
:data:`MIN_MATCH`), it takes the most frequent next token, then the most frequent
after that, and so on, multiplying each step's share of its siblings; it stops
when that product falls below :data:`MIN_SHARE`, when a step has fewer than
:data:`MIN_COUNT` occurrences behind it, or at ``m`` tokens (a draft is at most as
long as the match that supports it). No match, no draft. The longer of the two
matches proposes, an earlier chat's only when longer by :data:`LOCAL_MARGIN` tokens (the
conversation is the fresher evidence), and while the conversation copies a long run (a match
of ``MATCH_BUCKETS[-1]`` tokens) earlier chats are not consulted.

Drafts carry ``key`` = the match length's bucket (``engine.decode.drafters.MATCH_BUCKETS``),
plus :data:`GLOBAL_KEY` for global ones, so the decoder measures their acceptance
apart. Greedy and seeded output stay exactly plain decoding's: a draft is only
ever a guess that the target verifies.

Memory: the history index keeps the newest :data:`MAX_TOKENS` tokens of its
documents, 12 bytes each (int32 tokens, int64 suffix array), at most 12 MiB, and
the index of exchanges finished since it was built a quarter of that.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Literal

import numpy as np

from engine.decode.drafters import EMPTY_DRAFT, MATCH_BUCKETS, Draft, NgramDrafter, match_key
from engine.decode.sampling import Randomness
from engine.events import SamplingParams

MAX_TOKENS = 1 << 20
"""Tokens the global index keeps, newest documents first (older ones are dropped whole)."""

MIN_MATCH = 3
"""The shortest context suffix a global proposal may stand on (shorter ones match by chance
in a large history; the decoder measures acceptance by match length beyond that)."""

MIN_SHARE = 0.3
"""A global draft stops once the product of its steps' shares falls below this."""

MIN_COUNT = 1
"""Occurrences a global step needs behind it: one will do (the same ask in another chat
has exactly one earlier answer); the share rule still stops at a fork."""

LOCAL_MARGIN = 2
"""Tokens by which an earlier chat's match must be longer than this chat's to replace the copy this
chat proposes (none is needed where this chat proposes nothing). A match just longer in a large
history is often a common phrase whose continuation there is not this reply's: with no margin,
suffix drafting ran at 1.10-1.24x the n-gram drafter's speed on the bench's repeat-edit class
and 0.78-1.05x on multi-turn; with 2, 1.26-1.34x and 0.90-1.09x (alternating runs, docs/performance.md)."""

MAX_MATCH = 32
"""The longest context suffix looked up (longer matches support no longer drafts)."""

GLOBAL_KEY = 100
"""Added to a global draft's key: its acceptance is measured apart from the conversation's."""


class SuffixIndex:
    """A suffix array over documents of token ids, for "what followed this, how often".

    ``corpus`` ``[N]`` is the documents joined, each followed by its own negative
    separator (so no match crosses two documents); ``order`` ``[N]`` lists every
    position by the suffix starting there, in sorted order. Immutable once built.
    """

    def __init__(self, docs: Sequence[Sequence[int]], max_tokens: int = MAX_TOKENS) -> None:
        kept: list[Sequence[int]] = []
        total = 0
        for doc in reversed(docs):  # the newest documents are kept
            if not doc:
                continue
            if total + len(doc) + 1 > max_tokens:
                break
            kept.append(doc)
            total += len(doc) + 1
        kept.reverse()
        parts = []
        for i, doc in enumerate(kept):
            parts.append(np.asarray(doc, dtype=np.int64))
            parts.append(np.array([-(i + 1)], dtype=np.int64))
        self.corpus: np.ndarray = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)
        self.documents = len(kept)
        self.order: np.ndarray = _suffix_array(self.corpus)

    def __len__(self) -> int:
        return int(self.corpus.size)

    @property
    def nbytes(self) -> int:
        return int(self.corpus.nbytes + self.order.nbytes)

    def find(self, pattern: Sequence[int]) -> tuple[int, int]:
        """The range ``[lo, hi)`` of :attr:`order` whose suffixes start with ``pattern``."""
        corpus, order, m = self.corpus, self.order, len(pattern)
        want = list(pattern)

        def head(i: int) -> list[int]:
            start = int(order[i])
            return corpus[start:start + m].tolist()

        lo, hi = 0, len(order)
        while lo < hi:  # first suffix >= pattern
            mid = (lo + hi) // 2
            if head(mid) < want:
                lo = mid + 1
            else:
                hi = mid
        first, hi = lo, len(order)
        while lo < hi:  # first suffix that does not start with pattern
            mid = (lo + hi) // 2
            if head(mid) == want:
                lo = mid + 1
            else:
                hi = mid
        return first, lo

    def longest_match(self, context: Sequence[int], longest: int = MAX_MATCH) -> tuple[int, int, int]:
        """``(m, lo, hi)``: the longest suffix of ``context`` (``m`` tokens, at most ``longest``)
        that occurs in the index, and its range; ``m == 0`` when not even its last token does."""
        best = (0, 0, 0)
        low, high = 1, min(longest, len(context))
        while low <= high:  # occurring is monotone in m: the last m tokens occur, so do the last m-1
            m = (low + high) // 2
            lo, hi = self.find(context[len(context) - m:])
            if lo < hi:
                best, low = (m, lo, hi), m + 1
            else:
                high = m - 1
        return best

    def extend(self, m: int, lo: int, hi: int, token: int) -> tuple[int, int, int] | None:
        """The suffixes of ``order[lo:hi]`` (which share their first ``m`` tokens) that go on with
        ``token``: ``(m + 1, lo', hi')``, or None when none does. O(hi - lo) with numpy."""
        n = len(self.corpus)
        starts = self.order[lo:hi] + m
        nxt = np.where(starts < n, self.corpus[np.minimum(starts, n - 1)], -1)  # sorted: they share m tokens
        a, b = int(np.searchsorted(nxt, token, "left")), int(np.searchsorted(nxt, token, "right"))
        return (m + 1, lo + a, lo + b) if b > a else None

    def continuation(self, m: int, lo: int, hi: int, limit: int) -> list[int]:
        """The most supported path of up to ``limit`` tokens after the suffixes ``order[lo:hi]``
        (which share their first ``m`` tokens), by the rules in the module docstring."""
        out: list[int] = []
        share = 1.0
        n = len(self.corpus)
        while len(out) < limit:
            starts = self.order[lo:hi] + m + len(out)
            nxt = np.where(starts < n, self.corpus[np.minimum(starts, n - 1)], -1)
            real = nxt[nxt >= 0]
            if real.size < MIN_COUNT:
                break
            values, counts = np.unique(real, return_counts=True)
            best = int(counts.argmax())
            share *= counts[best] / real.size
            if share < MIN_SHARE or counts[best] < MIN_COUNT:
                break
            token = int(values[best])
            out.append(token)
            # Within [lo, hi) the suffixes are sorted by their next token: the ones
            # followed by ``token`` are a contiguous run.
            lo, hi = lo + int(np.searchsorted(nxt, token, "left")), lo + int(np.searchsorted(nxt, token, "right"))
        return out


def _suffix_array(corpus: np.ndarray) -> np.ndarray:
    """Positions ``[N]`` sorted by the suffix starting at each (prefix doubling, O(N log² N)).
    Separators are negative and distinct, so every suffix is unique and the ranks end distinct."""
    n = int(corpus.size)
    if n == 0:
        return np.zeros(0, np.int64)
    _, rank = np.unique(corpus, return_inverse=True)
    rank = rank.astype(np.int64) + 1  # 0 stands for "past the end"
    step = 1
    while True:
        second = np.zeros(n, np.int64)
        second[:n - step] = rank[step:] if step < n else second[:0]
        order = np.lexsort((second, rank))
        pair_rank, pair_second = rank[order], second[order]
        new = np.empty(n, np.int64)
        new[order] = np.cumsum(np.r_[True, (pair_rank[1:] != pair_rank[:-1]) | (pair_second[1:] != pair_second[:-1])])
        rank = new
        if rank.max() == n or step >= n:
            return order
        step *= 2


class SuffixDrafter:
    """Drafts from the conversation (an n-gram index) and from earlier chats (two :class:`SuffixIndex` structures).

    Earlier chats live in two indexes: ``history`` (what :meth:`learn` was given:
    the history as it is now, so a deleted chat is gone from what can be proposed)
    and ``recent`` (exchanges finished since, :meth:`remember`; small, so rebuilding
    it after each reply costs milliseconds). :meth:`learn` clears ``recent``: the
    history it is given holds those exchanges by then. Indexes are swapped in whole.
    """

    kind: Literal["ngram"] = "ngram"
    free_proposals = True

    def __init__(self, docs: Sequence[Sequence[int]] = (), max_tokens: int = MAX_TOKENS) -> None:
        self.name = "suffix lookup"
        self.local = NgramDrafter()
        self.max_tokens = max_tokens
        self.history = SuffixIndex(docs, max_tokens)
        self._recent_docs: list[tuple[int, ...]] = []
        self.recent = SuffixIndex([])
        self._matches: dict[int, tuple[SuffixIndex, int, tuple[int, ...], tuple[int, int, int]]] = {}
        """Per index (by id): the index, the context's length and last tokens, and the match
        ``(m, lo, hi)`` last found, carried forward as the context grows (:meth:`_match`)."""

    def learn(self, docs: Sequence[Sequence[int]]) -> None:
        """Rebuild the history index from ``docs`` (token ids ``[L_i]`` each, oldest first)."""
        self.history = SuffixIndex(docs, self.max_tokens)
        self._recent_docs, self.recent = [], SuffixIndex([])

    def remember(self, doc: Sequence[int]) -> None:
        """Add one document (a reply just finished) to the recent index."""
        self._recent_docs.append(tuple(doc))
        self.recent = SuffixIndex(self._recent_docs, self.max_tokens // 4)

    def _match(self, index: SuffixIndex, context: Sequence[int]) -> tuple[int, int, int]:
        """The longest match of ``context``'s end in ``index``. Within a reply the context only
        grows, so the last match is carried forward: each new token narrows its range (a
        longest match plus one token is the longest possible), and only when a token
        breaks it is the match searched for anew (:meth:`SuffixIndex.longest_match`)."""
        kept = self._matches.get(id(index))
        found: tuple[int, int, int] | None = None
        longest = MAX_MATCH
        if kept is not None and kept[0] is index and 0 < kept[1] <= len(context) \
                and tuple(context[max(0, kept[1] - 8):kept[1]]) == kept[2]:  # the same context, grown
            found = kept[3]
            # A match now is at most the last one plus the tokens added since: that bounds the search.
            longest = min(MAX_MATCH, found[0] + len(context) - kept[1])
            for token in context[kept[1]:]:
                found = index.extend(*found, token) if found[0] > 0 else None
                if found is None:
                    break
        if found is None:
            found = index.longest_match(context, longest)
        self._matches[id(index)] = (index, len(context), tuple(context[-8:]), found)
        return found

    @property
    def nbytes(self) -> int:
        """Bytes held by the two global indexes."""
        return self.history.nbytes + self.recent.nbytes

    def propose(self, context: Sequence[int], k: int, sampling: SamplingParams, generator: Randomness) -> Draft:
        """Up to ``k`` tokens to follow ``context`` (``[L]`` ids): the conversation's copy or an
        earlier chat's best-supported path, whichever stands on the longer match, the conversation's
        by :data:`LOCAL_MARGIN` (may be empty)."""
        if k <= 0:
            return EMPTY_DRAFT
        local = self.local.propose(context, k, sampling, generator)
        best, found = self.local.last_match, None
        if best >= MATCH_BUCKETS[-1]:
            return local  # a long copy from this chat is under way: it is the best evidence there is
        for index in (self.recent, self.history):  # the fresher index wins a tie
            m, lo, hi = self._match(index, context) if len(index) else (0, 0, 0)
            if m >= MIN_MATCH and m > best + (LOCAL_MARGIN if local.tokens else 0):
                tokens = index.continuation(m, lo, hi, min(k, m))
                if tokens:
                    best, found = m, Draft(tuple(tokens), key=GLOBAL_KEY + match_key(m), origin="history")
        return found if found is not None else local

    def prefill(self, context: Sequence[int], cancel: threading.Event | None = None) -> None:
        self.local.prefill(context)
        self._matches.clear()  # a new prompt: matches are searched for anew

    def commit(self, context: Sequence[int]) -> None:
        self.local.commit(context)

    def release(self) -> None:
        self.local.release()
        self.learn([])
