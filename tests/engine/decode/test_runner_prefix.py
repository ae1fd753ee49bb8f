"""The longest common prefix the runner keeps (compared by slices, halving where they differ)."""
from __future__ import annotations

import random

from engine.decode.prefix import common_prefix_length


def naive(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_prefix_is_the_first_difference_wherever_it_is() -> None:
    rng = random.Random(5)
    for _ in range(300):
        a = [rng.randrange(4) for _ in range(rng.randrange(0, 60))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(4) for _ in range(rng.randrange(0, 20))]
        assert common_prefix_length(a, b) == naive(a, b) == common_prefix_length(tuple(b), a)
    assert common_prefix_length([], [1]) == 0 and common_prefix_length([1, 2], [1, 2]) == 2
