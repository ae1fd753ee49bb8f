"""huggingface_hub's retry warnings as short progress stages while a load runs, its handlers back afterwards."""
from __future__ import annotations

import logging

import pytest

from engine.fetch.hublog import describe, hub_messages_as_progress, quiet_transformers


@pytest.mark.parametrize("message, stage", [
    ("Retrying in 4s [Retry 3/5].", "hub unreachable: retry 3 of 5 in 4 s"),
    ("HTTP Error 503 thrown while requesting GET https://x. Retrying in 1.5s [Retry 1/5].",
     "hub unreachable: retry 1 of 5 in 1.5 s"),
    ("Rate limited. Waiting 61.0s before retry [Retry 2/5].", "hub rate limit: retry 2 of 5 in 61 s"),
    ("'[Errno -3] Temporary failure in name resolution' thrown while requesting HEAD https://x",
     "hub request failed; retrying"),
    ("Some other hub warning", None),
    ("Retrying soon", None),
])
def test_describe(message: str, stage: str | None) -> None:
    assert describe(message) == stage


def test_inside_the_block_hub_warnings_reach_progress_only(capfd: pytest.CaptureFixture[str]) -> None:
    hub = logging.getLogger("huggingface_hub")
    before = (list(hub.handlers), hub.propagate)
    seen: list[tuple[str, float | None]] = []
    with hub_messages_as_progress(lambda stage, fraction: seen.append((stage, fraction))):
        child = logging.getLogger("huggingface_hub.utils._http")
        child.warning("Retrying in %ss [Retry %d/%d].", 2, 1, 5)
        child.warning("nothing worth showing")
        child.info("Retrying in 9s [Retry 9/9].")  # below WARNING: not shown
    assert seen == [("hub unreachable: retry 1 of 5 in 2 s", None)]
    assert capfd.readouterr().err == ""
    assert (hub.handlers, hub.propagate) == before


def test_the_handlers_come_back_when_the_load_fails() -> None:
    hub = logging.getLogger("huggingface_hub")
    marker = logging.NullHandler()
    hub.addHandler(marker)
    try:
        with pytest.raises(RuntimeError, match="load failed"):
            with hub_messages_as_progress(lambda stage, fraction: None):
                assert marker not in hub.handlers and hub.propagate is False
                raise RuntimeError("load failed")
        assert marker in hub.handlers
    finally:
        hub.removeHandler(marker)


def test_a_failing_progress_callback_does_not_break_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[logging.LogRecord] = []
    monkeypatch.setattr(logging.Handler, "handleError", lambda self, record: errors.append(record))

    def broken(stage: str, fraction: float | None) -> None:
        raise ValueError("the screen is gone")

    with hub_messages_as_progress(broken):
        logging.getLogger("huggingface_hub").warning("Retrying in 1s [Retry 1/5].")
    assert [r.getMessage() for r in errors] == ["Retrying in 1s [Retry 1/5]."]


def test_quiet_transformers_turns_off_bars_and_info_logs() -> None:
    from transformers.utils import logging as hf_logging

    was_enabled, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    try:
        hf_logging.enable_progress_bar()
        hf_logging.set_verbosity_info()
        quiet_transformers()
        assert not hf_logging.is_progress_bar_enabled()
        assert hf_logging.get_verbosity() == logging.ERROR
    finally:
        hf_logging.set_verbosity(level)
        (hf_logging.enable_progress_bar if was_enabled else hf_logging.disable_progress_bar)()


def test_quiet_transformers_silences_the_gguf_readers_own_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """`generate --target x.gguf --quiet` wrote 1.5 KB of "Converting and de-quantizing GGUF
    tensors..." frames to stderr: that reader draws tqdm itself, past disable_progress_bar."""
    import io

    import transformers.modeling_gguf_pytorch_utils as gguf_reader

    monkeypatch.setattr(gguf_reader, "tqdm", gguf_reader.tqdm)  # restored after the test
    quiet_transformers()
    out = io.StringIO()
    assert list(gguf_reader.tqdm(range(3), desc="Converting", file=out)) == [0, 1, 2]
    assert out.getvalue() == ""
