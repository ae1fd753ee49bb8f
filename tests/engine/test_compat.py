"""Draft/target tokenizer compatibility: same token -> id map and special ids, or a clear refusal."""
from __future__ import annotations

import pytest

from engine.compat import FALLBACK_CHAT_TEMPLATE, chat_template, check_pair
from engine.errors import IncompatibleDraftError
from tests.engine.tinymodels import CHAT_TEMPLATE, WORDS, make_tokenizer


def test_identical_tokenizers_pass() -> None:
    check_pair(make_tokenizer(), make_tokenizer())


def test_shuffled_ids_are_reported_with_count_and_example() -> None:
    with pytest.raises(IncompatibleDraftError) as err:
        check_pair(make_tokenizer(), make_tokenizer(shuffle_seed=3))
    msg = str(err.value)
    target, draft = make_tokenizer().get_vocab(), make_tokenizer(shuffle_seed=3).get_vocab()
    differing = sum(target[t] != draft[t] for t in target)
    assert f"{differing} token ids differ" in msg
    assert "is id" in msg and "in the draft" in msg
    assert "n-gram drafter" in msg


def test_same_size_different_tokens() -> None:
    other = make_tokenizer([w.upper() for w in WORDS])
    with pytest.raises(IncompatibleDraftError) as err:
        check_pair(make_tokenizer(), other)
    # every target word is missing from the draft and every draft word missing from the target
    assert f"{2 * len(WORDS)} token ids differ" in str(err.value)
    assert "'w0' is id 3 in the target but missing in the draft" in str(err.value)


def test_extra_draft_tokens_are_a_difference() -> None:
    with pytest.raises(IncompatibleDraftError, match=r"1 token ids differ .*exists only in the draft"):
        check_pair(make_tokenizer(), make_tokenizer(WORDS + ("extra",)))


def test_special_ids_must_agree() -> None:
    with pytest.raises(IncompatibleDraftError) as err:
        check_pair(make_tokenizer(), make_tokenizer(eos="<unk>"))
    msg = str(err.value)
    assert "EOS id differs (target 2, draft 0)" in msg and "PAD id differs" in msg
    assert "token ids differ" not in msg


def test_chat_template_comes_from_the_target() -> None:
    tok = make_tokenizer()
    assert chat_template(tok) == CHAT_TEMPLATE
    tok.chat_template = None
    assert chat_template(tok) == FALLBACK_CHAT_TEMPLATE
