"""The SPECCHAT_* variables: each bad value is refused with its name and what it takes."""
from __future__ import annotations

import pytest

from app.cli import main
from engine import environment
from engine.errors import SettingError
from engine.model.device import choose_device


@pytest.mark.parametrize("value, expected", [("", None), ("1", True), (" Yes ", True), ("on", True),
                                             ("0", False), ("OFF", False), ("no", False)])
def test_a_switch_reads_on_off_or_unset(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool | None) -> None:
    monkeypatch.setenv("SPECCHAT_STATIC_CACHE", value)
    assert environment.switch("SPECCHAT_STATIC_CACHE") is expected


@pytest.mark.parametrize("name, value, words", [
    ("SPECCHAT_STATIC_CACHE", "abc", "SPECCHAT_STATIC_CACHE='abc': use 1 or 0"),
    ("SPECCHAT_CUDA_GRAPHS", "2", "SPECCHAT_CUDA_GRAPHS='2': use 1 or 0"),
    ("SPECCHAT_THREADS", "abc", "SPECCHAT_THREADS='abc': give a whole number from 1 to 1024"),
    ("SPECCHAT_THREADS", "0", "SPECCHAT_THREADS='0'"),
    # the app's load failed with "can't start new thread", or its engine died saying nothing
    ("SPECCHAT_THREADS", "100000", "SPECCHAT_THREADS='100000': give a whole number from 1 to 1024"),
    ("SPECCHAT_THREADS", "99999999999999999999", "SPECCHAT_THREADS='99999999999999999999': give a whole number "
                                                 "from 1 to 1024"),
    ("SPECCHAT_UI_NICE", "abc", "SPECCHAT_UI_NICE='abc': give a whole number from 0 to 19"),
    ("SPECCHAT_UI_NICE", "20", "from 0 to 19"),
    ("SPECCHAT_CHAIN", "-1", "SPECCHAT_CHAIN='-1'"),
    ("SPECCHAT_DEVICE", "gpu", "SPECCHAT_DEVICE='gpu': use cpu, cuda or cuda:N"),
    ("SPECCHAT_CPU_KERNEL", "avx5l2", "SPECCHAT_CPU_KERNEL='avx5l2': use auto, torch or one of avx512-vnni"),
])
def test_a_bad_value_names_the_variable_and_what_it_takes(monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                                          words: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError, match=words.replace("(", r"\(").replace(")", r"\)")):
        environment.check()


def test_good_values_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in [("SPECCHAT_STATIC_CACHE", "1"), ("SPECCHAT_THREADS", "2"), ("SPECCHAT_UI_NICE", "10"),
                        ("SPECCHAT_CHAIN", "0"), ("SPECCHAT_DEVICE", "CUDA:1"),
                        ("SPECCHAT_CPU_KERNEL", "AVX512")]:
        monkeypatch.setenv(name, value)
    environment.check()
    assert environment.threads() == 2 and environment.device_override() == "cuda:1"
    assert environment.cpu_kernel() == "avx512-vnni"


def test_a_card_asked_for_where_there_is_none_is_refused_with_the_way_out() -> None:
    with pytest.raises(SettingError, match="SPECCHAT_DEVICE=cuda, but .*; unset it to run on the CPU"):
        choose_device("any", cuda_found=False, override="cuda")
    assert choose_device("cpu", cuda_found=False, override="cuda") == ("cpu", None)  # the profile's own word wins
    assert choose_device("any", cuda_found=False, override="cpu") == ("cpu", "SPECCHAT_DEVICE=cpu")


def test_every_command_refuses_a_bad_value_before_it_starts(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECCHAT_UI_NICE", "abc")  # it ended the app with a traceback once its model was ready
    assert main(["profiles"]) == 2
    assert "specchat: error: SPECCHAT_UI_NICE='abc'" in capsys.readouterr().err
    monkeypatch.delenv("SPECCHAT_UI_NICE")
    monkeypatch.setenv("SPECCHAT_THREADS", "100000")  # capped as --threads is
    assert main(["profiles"]) == 2
    assert "specchat: error: SPECCHAT_THREADS='100000': give a whole number from 1 to 1024" in capsys.readouterr().err


def test_the_threads_variable_is_capped_as_the_threads_option_is() -> None:
    from app.models_cli import MAX_THREADS

    assert MAX_THREADS == environment.MAX_THREADS


def test_the_kernel_variants_named_here_are_the_ones_the_kernel_builds() -> None:
    """engine.environment keeps its own copy of the names (importing engine.quant would import torch
    at every command's start): it must stay the kernel's, in its order."""
    from engine.quant.cpu_isa import VARIANTS

    assert environment.KERNEL_VARIANTS == tuple(VARIANTS)
