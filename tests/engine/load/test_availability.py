"""Whether a profile can run here: a CUDA-only profile without a card, nf4/int8 without bitsandbytes."""
from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest
import torch

from engine.config.profiles import ModelProfile, ModelSpec
from engine.load import availability
from engine.load.availability import cuda_present, unavailable_reason

NO_CUDA = "needs a CUDA GPU (device = \"cuda\" in its profile) and none was found on this machine"


def profile(device: str = "any", target: str = "none", draft: str | None = None) -> ModelProfile:
    return ModelProfile(name="p", target=ModelSpec("org/target", quantization=target),  # type: ignore[arg-type]
                        drafter="model" if draft else "ngram",
                        draft=ModelSpec("org/draft", quantization=draft) if draft else None,  # type: ignore[arg-type]
                        device=device)


@pytest.fixture
def no_bitsandbytes(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "bitsandbytes" else real(name, *args)

    monkeypatch.setattr(availability.importlib.util, "find_spec", find_spec)


def test_a_cuda_profile_needs_a_card() -> None:
    assert unavailable_reason(profile(device="cuda"), cuda=False) == NO_CUDA
    assert unavailable_reason(profile(device="cuda"), cuda=True) is None
    assert unavailable_reason(profile(device="any"), cuda=False) is None


@pytest.mark.parametrize("target, draft, named", [("nf4", None, "nf4"), ("int8", None, "int8"),
                                                  ("int4", "int8", "int8"), ("nf4", "int8", "nf4")])
def test_bitsandbytes_quantization_needs_the_package(no_bitsandbytes: None, target: str, draft: str | None,
                                                     named: str) -> None:
    assert unavailable_reason(profile(target=target, draft=draft), cuda=True) == (
        f"{named} quantization needs the bitsandbytes package, which is not installed")


@pytest.mark.parametrize("target", ["none", "int4"])
def test_other_quantizations_need_no_bitsandbytes(no_bitsandbytes: None, target: str) -> None:
    assert unavailable_reason(profile(target=target, draft=target), cuda=False) is None


def test_with_bitsandbytes_installed_nf4_is_available() -> None:
    if importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("bitsandbytes is not installed here")
    assert unavailable_reason(profile(target="nf4", draft="int8"), cuda=True) is None


def test_the_missing_card_is_said_before_the_missing_package(no_bitsandbytes: None) -> None:
    assert unavailable_reason(profile(device="cuda", target="nf4"), cuda=False) == NO_CUDA


def test_cuda_present_follows_specchat_device_then_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_present() is False  # the variable wins over the card
    monkeypatch.setenv("SPECCHAT_DEVICE", "cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_present() is True
    monkeypatch.delenv("SPECCHAT_DEVICE")
    assert cuda_present() is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_present() is True


def test_torch_build_is_read_from_its_version_file_without_importing_it() -> None:
    from engine.load.availability import torch_built_for_gpu

    assert torch_built_for_gpu("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n")
    assert torch_built_for_gpu("cuda: Optional[str] = None\nhip: Optional[str] = '6.2.4'\n")
    assert torch_built_for_gpu("cuda = '11.8'\n")
    assert not torch_built_for_gpu("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n")
    assert torch_built_for_gpu() is (torch.version.cuda is not None or torch.version.hip is not None)  # this install


def test_without_torch_imported_a_gpu_needs_a_gpu_build_and_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.load.availability as availability

    monkeypatch.delenv("SPECCHAT_DEVICE", raising=False)
    monkeypatch.delitem(sys.modules, "torch")  # as in the app's UI process
    for build, driver, expected in [(True, True, True), (True, False, False), (False, True, False)]:
        monkeypatch.setattr(availability, "torch_built_for_gpu", lambda build=build: build)
        monkeypatch.setattr(availability.os.path, "exists",
                            lambda path, driver=driver: driver and path in availability.GPU_DRIVER_PATHS)
        assert cuda_present() is expected
    assert "torch" not in sys.modules  # answered without importing it
