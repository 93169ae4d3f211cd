"""The store's on-disk layout v3 (store/layout.py, store/stamps.py, store/manifest_names.py):
an entry is its folder "<key>.<variant>" in a prefix folder; its manifest and its stamp are names."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest

from abicache import Cache
from abicache.errors import AbicacheWarning
from abicache.store import blobs, manifest_names, stamps
from abicache.store.gc import collect_garbage
from abicache.store.layout import LAYOUT_VERSION, entry_name
from conftest import writer

INPUTS = {"sources": {"x.txt": "payload"}}


def _settle() -> None:
    time.sleep(stamps.FINE_SECONDS * 3)  # a ctime younger than this is not stamped


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    hashed: list[str] = []
    real = blobs.hash_file
    monkeypatch.setattr(blobs, "hash_file", lambda p: hashed.append(str(p)) or real(p))
    return hashed


def test_an_entry_is_its_folder(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No folder per key, a small manifest kept in names (manifest_names) and the stamp a
    later hit writes a name: beyond the artifact's own file, an entry is its folder's block."""
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": os.urandom(512)}))
    assert art.path.parent == root / LAYOUT_VERSION / "entries" / "t" / art.key[:2]
    assert entry_name(art.path.name) == (art.key, art.variant)
    _settle()
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({})).hit  # hashes once, stamps
    names = sorted(os.listdir(art.path))
    kept = [n for n in names if n != "lib.so"]
    assert "lib.so" in names and "manifest.json" not in names, names
    assert [n for n in kept if n.startswith(stamps.NAME_PREFIX)] and [n for n in kept if n.startswith(manifest_names.PREFIX)]
    assert all(os.lstat(art.path / n).st_blocks == 0 for n in kept)
    folder = os.lstat(art.path)
    assert folder.st_blocks * 512 <= max(folder.st_blksize, 4096)  # all its names in one block
    hashed = _count_hashes(monkeypatch)
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({})).hit
    assert hashed == []  # the name vouched for the file


def test_a_stamp_too_long_for_a_name_is_a_file(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {f"part{n:02}.bin": os.urandom(64) for n in range(20)}
    art = Cache(root).get_or_build("t", "many", INPUTS, writer(files))
    _settle()
    assert Cache(root).get_or_build("t", "many", INPUTS, writer({})).hit
    assert (art.path / stamps.FILENAME).is_file()
    assert not [n for n in os.listdir(art.path) if n.startswith(stamps.NAME_PREFIX)]
    hashed = _count_hashes(monkeypatch)
    assert Cache(root).get_or_build("t", "many", INPUTS, writer({})).hit
    assert hashed == []


def test_two_stamps_written_at_once_are_both_read_and_the_next_write_replaces_them(root: Path) -> None:
    art = Cache(root).get_or_build("t", "two", INPUTS, writer({"a.so": b"a" * 100, "b.so": b"b" * 100}))
    order = ["a.so", "b.so"]
    _settle()
    wa, wb = (stamps.witness(os.lstat(art.path / name)) for name in order)
    stamps.write(art.path, {}, {"a.so": wa}, 0.0, order=order)  # two writers, neither saw the other's
    stamps.write(art.path, {}, {"b.so": wb}, 0.0, ["f" * 32], order=order)
    both = stamps.read(art.path, lambda st: True, order)
    assert both.files == {"a.so": wa, "b.so": wb} and both.deps_ok == ("f" * 32,) and len(both.names) == 2
    stamps.write(art.path, both.files, {}, 1.0, both.deps_ok, force=True, order=order, old=both.names)
    (name,) = [n for n in os.listdir(art.path) if n.startswith(stamps.NAME_PREFIX)]
    again = stamps.read(art.path, lambda st: True)  # the order read from the manifest
    assert again.files == both.files and again.verified == 1.0 and again.names == (name,)


def test_a_stamp_never_vouches_for_a_changed_file(root: Path) -> None:
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 4096}))
    _settle()
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({})).hit  # stamped
    path = art.file()
    path.chmod(0o644)
    with open(path, "r+b") as fh:
        fh.write(b"Z")  # same size, same inode: only the ctime tells
    path.chmod(0o444)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 4096}))
    assert not again.hit and again.file().read_bytes() == b"A" * 4096


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_gc_removes_the_old_layout_and_what_no_entry_owns(root: Path, version: str) -> None:
    cache = Cache(root)
    cache.get_or_build("t", "x", INPUTS, writer({"lib.so": b"x"}))
    old = root / version / "entries" / "t" / "ab" / ("ab" * 32) / ("0" * 16)
    old.mkdir(parents=True, mode=0o700)
    (old / "lib.so").write_bytes(b"old")
    for folder in (root / version, *old.parents):
        if root / version in (folder, *folder.parents):
            folder.chmod(0o700)
    report = collect_garbage(cache.store)
    assert not (root / version).exists() and report.strays_removed >= 1
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({})).hit  # v3 untouched


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_read_only_store_of_the_old_layout_is_named_and_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   version: str) -> None:
    from abicache.shipping import tiers

    old = tmp_path / "shipped"
    (old / version / "entries").mkdir(parents=True)
    monkeypatch.setenv("ABICACHE_READ_STORES", str(old))
    tiers.forget()
    tiers._warned.clear()
    with pytest.warns(AbicacheWarning, match=f"older layout {version} .*bundle it again"):
        assert tiers.tiers() == []


def test_no_stamp_is_read_from_a_folder_others_may_write(root: Path) -> None:
    """A stamp's name is as trusted as its folder: in one that others may write (an
    older abicache under umask 000, or a planted folder), it vouches for nothing."""
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"x" * 100}))
    _settle()
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({})).hit
    assert stamps.read(art.path, Cache(root).store.trust.ok).files
    art.path.chmod(0o777)
    try:
        assert not stamps.read(art.path, Cache(root).store.trust.ok).files
    finally:
        art.path.chmod(0o700)


def test_a_hit_reads_the_keys_link_instead_of_listing_the_prefix_folder(root: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefix folder holds every key of its prefix (470 names at 10^5 entries: 0.5 ms
    to list): a hit reads the key's link, which names its variants, and lists nothing."""
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"x" * 100}))
    link = art.path.with_name(art.key)
    assert os.readlink(link) == art.variant and os.lstat(link).st_blocks == 0
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p=".": listed.append(str(p)) or real(p))
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({})).hit
    assert str(art.path.parent) not in listed, listed


def test_a_stale_link_only_costs_a_listing(root: Path) -> None:
    """The link is a hint: one naming a variant that is gone, or missing a variant, is
    made good by listing the folder; gc writes it again after an eviction and removes
    it with the key's last entry."""
    cache = Cache(root)
    art = cache.get_or_build("t", "x", INPUTS, writer({"lib.so": b"x" * 100}))
    link = art.path.with_name(art.key)
    link.unlink()
    os.symlink("f" * 16, link)  # names a variant that does not exist
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({})).hit
    link.unlink()  # no link at all
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({})).hit
    os.symlink(art.variant, link)
    report = collect_garbage(cache.store, max_size=0)
    assert report.entries_removed == 1 and not os.path.lexists(link)


# ---- a manifest kept in its folder's names (store/manifest_names.py) ---------------------------------------


def test_a_manifest_too_big_for_names_is_a_file_and_both_forms_hit(root: Path) -> None:
    small = Cache(root).get_or_build("t", "small", INPUTS, writer({"lib.so": b"s"}))
    many = {f"a-long-file-name-for-the-manifest-{n:03}.bin": os.urandom(8) for n in range(60)}
    big = Cache(root).get_or_build("t", "big", INPUTS, writer(many))
    assert not (small.path / "manifest.json").exists()
    assert (big.path / "manifest.json").is_file()
    assert not [n for n in os.listdir(big.path) if n.startswith(manifest_names.PREFIX)]
    for name, files in (("small", {"lib.so": b"s"}), ("big", many)):
        assert Cache(root).get_or_build("t", name, INPUTS, writer({})).hit
        assert Cache(root).get_or_build("t", name, INPUTS, writer({})).manifest.name == name


@pytest.mark.parametrize("damage", ["one name gone", "a name's text changed", "a name of another count"])
def test_damaged_manifest_names_are_quarantined_and_rebuilt(root: Path, damage: str) -> None:
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"good"}))
    names = sorted(n for n in os.listdir(art.path) if n.startswith(manifest_names.PREFIX))
    assert len(names) >= 2
    last = art.path / names[-1]
    if damage == "one name gone":
        last.unlink()
    elif damage == "a name's text changed":
        last.rename(art.path / (names[-1][:-2] + ("AA" if names[-1][-2:] != "AA" else "BB")))
    else:
        head, _, text = names[-1][len(manifest_names.PREFIX):].partition(".")
        last.rename(art.path / f"{manifest_names.PREFIX}{head}.f.{text.partition('.')[2]}")
    with pytest.warns(AbicacheWarning, match="quarantined"):
        again = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"rebuilt"}))
    assert not again.hit and again.file().read_bytes() == b"rebuilt"


def test_manifest_names_in_a_folder_others_may_write_are_not_read(root: Path) -> None:
    """Whoever may write the folder may make names: its entry is quarantined and rebuilt
    (a manifest file there is still judged by its own owner and mode)."""
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"good"}))
    art.path.chmod(0o777)
    with pytest.warns(AbicacheWarning, match="quarantined.*others"):
        again = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"rebuilt"}))
    assert not again.hit and again.file().read_bytes() == b"rebuilt"


def test_manifest_names_decode_only_whole(tmp_path: Path) -> None:
    from abicache.errors import ManifestError

    data = b'{"x": "' + os.urandom(900).hex().encode() + b'"}'
    names = manifest_names.encode(data)
    assert names and len(names) > 1 and all(len(n.encode()) <= 255 for n in names)
    assert manifest_names.decode([*reversed(names), "lib.so", ".abicache-s.x"], 1 << 20) == data
    assert manifest_names.decode(["lib.so"], 1 << 20) is None
    for bad in (names[1:], [*names, names[0]], [names[0].replace(".0.", ".z.", 1), *names[1:]],
                [names[0][:-4] + "!!!!", *names[1:]]):
        with pytest.raises(ManifestError):
            manifest_names.decode(bad, 1 << 20)
    with pytest.raises(ManifestError, match="more than 100 bytes"):
        manifest_names.decode(names, 100)
    assert manifest_names.encode(os.urandom(5000)) is None  # too many names: a file instead
    assert manifest_names.encode(b"{}", [f"file-{n}-" + "x" * 200 for n in range(16)]) is None  # no room beside
