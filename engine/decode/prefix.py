"""Token-id sequences as the runners compare them."""
from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences.

    Compared by slices (C loops), halving the range where they differ: each round calls this on
    the whole context, so a Python loop over it would cost a long chat ~0.1 ms a round."""
    a, b = (x if isinstance(x, list) else list(x) for x in (a, b))
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    same, differs = 0, n  # a[:same] == b[:same]; a[:differs] != b[:differs]
    while differs - same > 1:
        mid = (same + differs) // 2
        if a[same:mid] == b[same:mid]:
            same = mid
        else:
            differs = mid
    return same
