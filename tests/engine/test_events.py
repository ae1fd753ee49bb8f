"""The boundary's plain data: request checks with their messages, stop cuts, a reply's settings, ReplyStats as JSON."""
from __future__ import annotations

import json
import math
from dataclasses import FrozenInstanceError
from typing import Any

import pytest

from engine.config.profiles import ModelProfile, ModelSpec
from engine.events import GenerationParams, SamplingParams, ReplyStats, generation_params

EOS = 2


@pytest.mark.parametrize("kw, message", [
    ({"temperature": -0.1}, "temperature must be >= 0 and finite, got -0.1"),
    ({"temperature": math.nan}, "temperature must be >= 0 and finite, got nan"),
    ({"temperature": math.inf}, "temperature must be >= 0 and finite, got inf"),
    ({"temperature": 1e-300}, "temperature must be 0 (greedy) or at least 0.001, got 1e-300"),
    ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ({"top_k": -1}, "top_k must be >= 0, got -1"),
])
def test_bad_sampling_is_refused_with_the_value(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        SamplingParams(**kw)
    assert str(err.value) == message


def test_greedy_is_temperature_zero() -> None:
    assert SamplingParams().greedy and SamplingParams(temperature=0.0, top_k=5).greedy
    assert not SamplingParams(temperature=0.01).greedy
    with pytest.raises(FrozenInstanceError):
        SamplingParams().temperature = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("kw, message", [
    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
    ({"k": -1}, "k must be from 0 to 32, got -1"),
    ({"k": 10**9}, "k must be from 0 to 32, got 1000000000"),  # the schedule's tables ran the machine out of memory
    ({"k_min": 3, "k_max": 2}, "need 0 <= k_min <= k_max <= 32, got 3, 2"),
    ({"k_min": -1}, "need 0 <= k_min <= k_max <= 32, got -1, 8"),
    ({"k_max": 33}, "need 0 <= k_min <= k_max <= 32, got 1, 33"),
])
def test_bad_generation_params_are_refused_with_the_values(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        GenerationParams(**kw)
    assert str(err.value) == message


def test_k_zero_and_equal_bounds_are_allowed() -> None:
    params = GenerationParams(k=0, k_min=0, k_max=0, max_new_tokens=1)
    assert (params.k, params.k_min, params.k_max) == (0, 0, 0)


@pytest.mark.parametrize("emitted, remaining, expected", [
    ([5, 6, 7], 10, ([5, 6, 7], None)),
    ([5, EOS, 7], 10, ([5, EOS], "eos")),  # the stop token is kept, what follows it dropped
    ([EOS], 1, ([EOS], "eos")),  # a stop on the last allowed token is an end of text, not of length
    ([5, 6, 7], 2, ([5, 6], "length")),
    ([5, 6], 2, ([5, 6], "length")),
    ([5, 6, EOS], 2, ([5, 6], "length")),  # a stop past the budget is never reached
    ([], 3, ([], None)),
])
def test_cut_at_the_first_stop_token_or_the_length(emitted: list[int], remaining: int,
                                                     expected: tuple[list[int], str | None]) -> None:
    params = GenerationParams(stop_token_ids=(EOS, 9))
    assert params.cut(emitted, remaining) == expected


def test_the_first_of_several_stop_tokens_ends_the_round() -> None:
    assert GenerationParams(stop_token_ids=(EOS, 9)).cut([4, 9, EOS], 10) == ([4, 9], "eos")


def profile(**kw: Any) -> ModelProfile:
    return ModelProfile(name="p", target=ModelSpec("org/m"), drafter="ngram", **kw)


def test_a_reply_takes_the_profiles_settings_unless_overridden() -> None:
    settings = profile(temperature=0.7, top_p=0.9, top_k=40, k=None, k_min=2, k_max=6)
    params = generation_params(settings, 64)
    assert params == GenerationParams(sampling=SamplingParams(0.7, 0.9, 40, None), max_new_tokens=64,
                                      k=None, k_min=2, k_max=6)
    override = generation_params(settings, 8, temperature=0.0, top_p=1.0, top_k=0, seed=3, k=4)
    assert override.sampling == SamplingParams(0.0, 1.0, 0, 3)
    assert (override.max_new_tokens, override.k, override.k_min, override.k_max) == (8, 4, 2, 6)


def test_a_profiles_fixed_k_is_kept_and_zero_overrides_count() -> None:
    assert generation_params(profile(k=3), 10).k == 3
    assert generation_params(profile(k=3), 10, k=0).k == 0  # 0 is an override (plain), not "use the profile's"
    assert generation_params(profile(temperature=0.5), 10, temperature=0.0).sampling.greedy


def test_a_bad_override_raises_before_anything_runs() -> None:
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 2.0"):
        generation_params(profile(), 10, top_p=2.0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
        generation_params(profile(), 0)


def test_stats_to_dict_is_plain_json() -> None:
    stats = ReplyStats(mode="spec", drafter="d", k=4, tokens=5, alpha=0.5, per_position=(0.75, 0.5),
                  mode_tokens=(("spec", 3), ("plain", 2)), truncated_turns=1)
    d = stats.to_dict()
    assert d["per_position"] == [0.75, 0.5] and d["mode_tokens"] == {"spec": 3, "plain": 2}
    assert (d["mode"], d["k"], d["tokens"], d["alpha"], d["speedup"], d["truncated_turns"]) == ("spec", 4, 5, 0.5, None, 1)
    assert json.loads(json.dumps(d)) == d
    assert set(d) == set(ReplyStats.__dataclass_fields__)
