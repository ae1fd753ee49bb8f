"""specchat's own GGUF index: the tensors ``gguf.GGUFReader`` finds, the same names, types,
shapes and bytes, without turning the metadata into objects (13 s a file for Qwen's)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from engine.errors import ModelSourceError
from engine.fetch.convert import DONE_MARKER
from engine.fetch.gguf_tensors import GgufTensors, read_index
from tests.gguf_tiny import write_tiny_gguf


def same_as_reader(path: Path) -> None:
    reader = GGUFReader(str(path))
    index = read_index(path)
    field = reader.get_field("general.architecture")
    assert index.architecture == bytes(field.parts[field.data[0]]).decode()
    assert [t.name for t in index.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(index.tensors, reader.tensors):
        assert mine.tensor_type == theirs.tensor_type
        assert mine.data.shape == theirs.data.shape and mine.data.dtype == theirs.data.dtype, mine.name
        assert np.array_equal(mine.data, theirs.data), mine.name


@pytest.mark.parametrize("kind, wide", [("Q4_0", "Q8_0"), ("Q4_1", "Q5_0")])
def test_a_tiny_gguf_indexes_as_the_reader_reads_it(tmp_path: Path, kind: str, wide: str) -> None:
    same_as_reader(write_tiny_gguf(tmp_path / "tiny.gguf", kind=kind, wide=wide))


def test_every_kind_of_metadata_is_skipped_and_a_set_alignment_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "meta.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_custom_alignment(64)
    writer.add_uint8("x.u8", 7)
    writer.add_int64("x.i64", -3)
    writer.add_float64("x.f64", 0.5)
    writer.add_bool("x.bool", True)
    writer.add_string("x.str", "héllo")
    writer.add_array("x.strings", ["a", "bc", ""])
    writer.add_array("x.ints", [1, 2, 3])
    writer.add_tensor("a.weight", np.arange(96, dtype=np.float32).reshape(3, 32))
    writer.add_tensor("b.weight", np.ones((2, 5), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    same_as_reader(path)


def test_the_real_pocket_gguf_indexes_as_the_reader_reads_it(pocket_dir: Path) -> None:
    same_as_reader(Path(json.loads((pocket_dir / DONE_MARKER).read_text())["gguf"]))


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ModelSourceError, match="not a little-endian GGUF") as err:
        read_index(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("keep", [0.3, 0.97])
def test_a_truncated_gguf_is_named_with_the_cause(tmp_path: Path, keep: float) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])  # in the tensors' data, or earlier
    with pytest.raises(ModelSourceError, match="truncated") as err:
        read_index(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_name_map_is_built_once_and_names_what_transformers_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str
) -> None:
    """transformers builds gguf's name table at every module (7 s for coder's target); the
    index asks for it once and maps every tensor to the same parameter."""
    import gguf
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    path = write_tiny_gguf(tmp_path / "tiny.gguf", arch=arch, tie=arch == "llama")
    config = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config)
    original = gguf.get_tensor_name_map
    built: list[tuple] = []

    def counted(*args: object) -> object:
        built.append(args)
        return original(*args)

    monkeypatch.setattr(gguf, "get_tensor_name_map", counted)
    mapped = {parameter: t.name for parameter, t in GgufTensors(path, model).by_parameter.items()}
    assert len(built) == 1 and gguf.get_tensor_name_map is counted
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=model.config.to_dict())
    theirs = get_gguf_hf_weights_map(model, processor)  # a table a module, as transformers does it
    assert len(built) > 2
    assert mapped == {theirs[t.name]: t.name for t in read_index(path).tensors if t.name in theirs}
    assert len(mapped) == len(read_index(path).tensors)
