"""Draft/target tokenizer compatibility: same token -> id map and special ids, or a clear refusal."""
from __future__ import annotations

import pytest

from engine.model.compat import check_pair
from engine.errors import IncompatibleDraftError
from tests.tiny import CHAT_TEMPLATE, WORDS, make_tokenizer


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


def with_reserved(names: list[str], **kw: object) -> object:
    """The word-level tokenizer plus special tokens appended after the words (ids 64, 65, ...)."""
    tok = make_tokenizer(**kw)  # type: ignore[arg-type]
    tok.add_special_tokens({"additional_special_tokens": names})
    return tok


RESERVED = [f"<|reserved_special_token_{i}|>" for i in range(6)]


def test_differences_confined_to_reserved_special_tokens_are_counted_not_refused() -> None:
    # The draft names slot 65 differently (as Llama 3.2 may beside 3.1) and lacks the last two.
    target = with_reserved(RESERVED)
    draft = with_reserved([RESERVED[0], "<|step_id|>", *RESERVED[2:4]])
    report = check_pair(target, draft)
    assert report.ignored == (
        ("<|reserved_special_token_1|>", 65, None),
        ("<|reserved_special_token_4|>", 68, None),
        ("<|reserved_special_token_5|>", 69, None),
        ("<|step_id|>", None, 65),
    )
    note = report.summary or ""
    assert note.startswith("tokenizers match except 4 reserved or unused special token(s)")
    assert "'<|reserved_special_token_1|>' is id 65 in the target but missing in the draft" in note
    assert check_pair(target, with_reserved(RESERVED)).summary is None  # identical: nothing to say


def test_a_special_token_the_chat_template_uses_must_match() -> None:
    target, draft = with_reserved(["<|eot|>", *RESERVED]), with_reserved(["<|eot_id|>", *RESERVED])
    target.chat_template = draft.chat_template = CHAT_TEMPLATE.replace("</s>", "<|eot_id|>")
    # '<|eot|>' (the target's, used by no template) would be let through; '<|eot_id|>' is not.
    with pytest.raises(IncompatibleDraftError, match=r"1 token ids differ .*'<\|eot_id\|>' \(id 64\) exists only in the draft"):
        check_pair(target, draft)


def test_ordinary_tokens_still_count_beside_reserved_ones() -> None:
    target = with_reserved(RESERVED)
    draft = with_reserved(RESERVED[:3], words=WORDS[:-1] + ("other",))
    with pytest.raises(IncompatibleDraftError) as err:
        check_pair(target, draft)
    # w60/other, and every reserved token shifted by one id, which alone would be allowed:
    # only the two ordinary words are counted.
    assert "2 token ids differ" in str(err.value) and "'w60' is id 63" in str(err.value)


def test_a_reserved_name_on_a_stop_id_is_not_ignored() -> None:
    target = with_reserved(RESERVED)
    draft = with_reserved(["<|end|>", *RESERVED[1:]])
    draft.eos_token, draft.pad_token = "<|end|>", "<|end|>"  # the draft stops on id 64
    target.eos_token, target.pad_token = RESERVED[0], RESERVED[0]  # and so does the target
    with pytest.raises(IncompatibleDraftError, match="2 token ids differ"):
        check_pair(target, draft)


def test_an_engine_pairs_models_that_differ_only_in_reserved_tokens_and_says_so(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import torch

    from engine.model.device import Device
    from engine.load.loader import load_engine
    from engine.config.profiles import ModelProfile, ModelSpec
    from tests.tiny import save_tiny

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    target = save_tiny(tmp_path / "target", seed=1, tokenizer=with_reserved(RESERVED))  # type: ignore[arg-type]
    draft = save_tiny(tmp_path / "draft", seed=2, tokenizer=with_reserved([RESERVED[0], "<|step_id|>", *RESERVED[2:]]))  # type: ignore[arg-type]
    profile = ModelProfile(name="r", target=ModelSpec(str(target)), drafter="model", draft=ModelSpec(str(draft)),
                           context_length=64)
    engine = load_engine(profile, device=Device(torch.device("cpu")))
    assert engine.info.mode == "spec" and engine.info.fallback_reason is None
    assert (engine.info.compat_note or "").startswith("tokenizers match except 2 reserved or unused special token(s)")
    engine.close()
