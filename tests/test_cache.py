from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import hostile
from abicache import Cache, Requirements
from abicache.env import Facts
from abicache.errors import AbicacheWarning, BuildError, LockTimeout, UntrustedRootError
from abicache.store.gc import collect_garbage, disk_usage
from abicache.store.verify import verify_store
from conftest import SRC, run_py, writer

INPUTS = {"sources": {"x.txt": "payload"}}


def test_miss_builds_then_a_fresh_cache_hits(cache: Cache, root: Path) -> None:
    built = cache.get_or_build("t", "x", INPUTS, writer({"a.bin": b"\x00" * 10, "sub/b.txt": "b"}))
    assert not built.hit and built.files == ("a.bin", "sub/b.txt")
    again = Cache(root).get_or_build("t", "x", INPUTS, writer({"a.bin": b"never"}))
    assert again.hit and again.path == built.path
    assert (again.path / "sub/b.txt").read_text() == "b"
    assert stat.S_IMODE(os.stat(again.file("a.bin")).st_mode) == 0o444


def test_the_in_process_memo_returns_the_same_artifact(cache: Cache) -> None:
    calls = []

    def build(out: Path) -> None:
        calls.append(1)
        (out / "f").write_text("x")

    first = cache.get_or_build("t", "x", INPUTS, build)
    second = cache.get_or_build("t", "x", INPUTS, build)
    assert not first.hit and second.hit and second._replace(hit=False, origin="built") == first
    assert cache.get_or_build("t", "x", INPUTS, build) is second  # no work at all the third time
    assert calls == [1]


def test_a_builder_may_declare_what_it_learned(cache: Cache) -> None:
    def build(out: Path) -> list[str]:
        (out / "f").write_text("x")
        return ["platform.machine in " + __import__("os").uname().machine]

    art = cache.get_or_build("t", "learned", INPUTS, build)
    assert art.manifest.declared.to_list() == ["platform.machine in " + __import__("os").uname().machine]


def _auditor(requirement: str):
    return lambda stage, paths, declared, facts: (Requirements.of([requirement]), {"said": requirement})


def test_one_key_holds_a_variant_per_requirement_set(root: Path) -> None:
    env311 = Cache(root, facts=Facts.from_dict({"python.abi": "cp311"}), audit=_auditor("python.abi == cp311"))
    env312 = Cache(root, facts=Facts.from_dict({"python.abi": "cp312"}), audit=_auditor("python.abi == cp312"))
    a = env311.get_or_build("t", "m", INPUTS, writer({"m.so": "311"}))
    b = env312.get_or_build("t", "m", INPUTS, writer({"m.so": "312"}))
    assert a.key == b.key and a.variant != b.variant
    assert not b.hit
    fresh311 = Cache(root, facts=Facts.from_dict({"python.abi": "cp311"}))
    hit = fresh311.get_or_build("t", "m", INPUTS, writer({"m.so": "never"}))
    assert hit.hit and hit.file().read_text() == "311"
    assert hit.manifest.audit == {"said": "python.abi == cp311"}


def test_a_build_that_cannot_load_here_fails_and_publishes_nothing(cache: Cache) -> None:
    cache.audit = _auditor("python.abi == cp27")
    with pytest.raises(BuildError, match="cannot be loaded here: python.abi == cp27"):
        cache.get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    assert list(cache.store.iter_variant_dirs()) == []


def test_identical_outputs_of_two_keys_share_one_blob(cache: Cache) -> None:
    payload = os.urandom(1 << 20)
    a = cache.get_or_build("t", "one", INPUTS, writer({"lib.so": payload}))
    b = cache.get_or_build("t", "two", INPUTS, writer({"lib.so": payload}))
    assert a.key != b.key
    assert os.stat(a.file()).st_ino == os.stat(b.file()).st_ino
    assert os.stat(a.file()).st_nlink == 3  # the blob and two entries
    stored, blobs = disk_usage(cache.store)
    assert (stored, blobs) == (len(payload), 1)
    # Measured on disk too: the second entry added (almost) nothing.
    used = int(subprocess.run(["du", "-sk", str(cache.store.layout.base)], capture_output=True,
                              text=True).stdout.split()[0])
    assert used < 2 * len(payload) // 1024


def test_a_failing_builder_leaves_nothing(cache: Cache) -> None:
    def build(out: Path) -> None:
        (out / "half.so").write_text("partial")
        raise BuildError("compiler exploded")

    with pytest.raises(BuildError, match="exploded"):
        cache.get_or_build("t", "x", INPUTS, build)
    assert list(cache.store.iter_variant_dirs()) == []
    assert list(cache.store.layout.tmp.iterdir()) == []
    assert cache.get_or_build("t", "x", INPUTS, writer({"f": "ok"})).file().read_text() == "ok"


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda out: None, "wrote no files"),
        (lambda out: os.symlink("/etc/passwd", out / "link"), "symbolic link"),
        (lambda out: (out / "manifest.json").write_text("{}"), "reserved"),
    ],
)
def test_unusable_builder_output_is_refused(cache: Cache, build, message: str) -> None:
    with pytest.raises(BuildError, match=message):
        cache.get_or_build("t", "x", INPUTS, build)


def test_a_builder_that_replaces_its_output_folder_with_a_link_is_refused(cache: Cache, tmp_path: Path) -> None:
    """The folder outside (the link's target) is neither published nor chmod'ed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "lib.so").write_text("not the builder's")
    (outside / "lib.so").chmod(0o640)

    def swap(out: Path) -> None:
        out.rmdir()
        os.symlink(outside, out)

    with pytest.raises(BuildError, match="replaced its output directory"):
        cache.get_or_build("t", "x", INPUTS, swap)
    assert list(cache.store.iter_variant_dirs()) == []
    assert stat.S_IMODE((outside / "lib.so").stat().st_mode) == 0o640 and (outside / "lib.so").exists()


def _plant_manifest(path: Path, doc: object | bytes) -> None:
    hostile.rewrite_manifest(path, doc if isinstance(doc, bytes) else json.dumps(doc).encode())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: b"{not json",
        lambda d: {**d, "schema": 99},
        lambda d: {**d, "files": {"../../../../outside.so": next(iter(d["files"].values()))}},
        lambda d: {**d, "files": {"/etc/passwd": next(iter(d["files"].values()))}},
        lambda d: {**d, "requirements": "python.abi == cp311"},
        lambda d: {**d, "files": {"f": {"sha256": "zz", "size": -1, "mode": 511}}},
        lambda d: {**d, "key": "0" * 64},
        lambda d: [1, 2, 3],
        lambda d: {**d, "name": "x" * 100_000},
    ],
    ids=["bad-json", "unknown-schema", "dotdot", "absolute", "wrong-type", "bad-record",
         "other-key", "not-object", "oversize"],
)
def test_hostile_manifest_is_a_miss_with_a_warning(cache: Cache, root: Path, tmp_path: Path, mutate) -> None:
    first = cache.get_or_build("t", "x", INPUTS, writer({"f": "good"}))
    _plant_manifest(first.path, mutate(first.manifest.to_dict()))
    before = set(tmp_path.rglob("*"))
    with pytest.warns(AbicacheWarning, match="quarantined"):
        again = Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "rebuilt"}))
    assert not again.hit and again.file().read_text() == "rebuilt"
    created = {p for p in set(tmp_path.rglob("*")) - before}
    assert all(str(p).startswith(str(root)) for p in created), created


def test_a_flipped_byte_is_found_quarantined_and_rebuilt(cache: Cache, root: Path) -> None:
    art = cache.get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 4096}))
    blob = cache.store.layout.blob(art.manifest.files[0].sha256, False)
    blob.chmod(0o644)
    with open(blob, "r+b") as fh:
        fh.seek(100)
        fh.write(b"B")
    blob.chmod(0o444)
    # A full-verification lookup never returns it:
    with pytest.warns(AbicacheWarning, match="sha256"):
        fresh = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 4096}), verify="full")
    assert not fresh.hit and fresh.file().read_bytes() == b"A" * 4096


def test_verify_full_reports_and_quarantines_then_the_next_call_rebuilds(cache: Cache, root: Path) -> None:
    art = cache.get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 4096}))
    path = art.file()
    path.chmod(0o644)
    with open(path, "r+b") as fh:
        fh.write(b"Z")
    path.chmod(0o444)
    report = verify_store(cache.store, full=False)  # same size, same inode: its ctime tells
    assert not report.clean
    assert [p.where.split("/")[-1] for p in report.problems] == [f"{art.key}.{art.variant}"]
    assert "sha256" in report.problems[0].reason
    assert not any(cache.store.iter_variant_dirs())
    again = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 4096}))
    assert not again.hit and again.file().read_bytes() == b"A" * 4096
    assert verify_store(cache.store, full=True).clean


def test_old_stamps_are_verified_in_full(cache: Cache, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from abicache.store import blobs, stamps

    monkeypatch.setattr(stamps, "RACY_SECONDS", 0.05)
    cache.get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 64}))
    time.sleep(0.1)
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 64})).hit  # hashes, stamps
    hashed: list[Path] = []
    real = blobs.hash_file
    monkeypatch.setattr(blobs, "hash_file", lambda p: hashed.append(p) or real(p))
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 64})).hit
    assert hashed == []  # the stamp vouches
    assert Cache(root, verify_age=0).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 64})).hit
    assert len(hashed) == 1  # too old a stamp: hashed in full


@pytest.mark.parametrize("replacement,problem", [(None, "missing"), (0o644, "writable"), (0o444, None)])
def test_a_missing_or_replaced_file(cache: Cache, root: Path, replacement: int | None, problem: str | None) -> None:
    art = cache.get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 64}))
    art.path.chmod(0o700)
    art.file().unlink()
    if replacement is not None:
        art.file().write_bytes(b"A" * 64)  # a new inode with the same bytes
        art.file().chmod(replacement)
    if problem is None:  # the bytes are the manifest's: hashed, and used
        assert Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 64})).hit
        return
    with pytest.warns(AbicacheWarning, match=problem):
        assert not Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 64})).hit


def test_last_use_is_written_at_most_once_per_interval(root: Path) -> None:
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    from abicache.store.publishing import _deferred

    _deferred.flush(True)  # stamped now: a stamp written by the next hit (under load) would move the folder's time
    old = time.time() - 3600
    os.utime(art.path, (old, old))
    Cache(root, touch_interval=7200).get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    assert os.stat(art.path).st_mtime == pytest.approx(old)
    Cache(root, touch_interval=600).get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    assert os.stat(art.path).st_mtime > old + 3000


@pytest.mark.parametrize("mode,shared,ok", [(0o700, False, True), (0o777, False, False),
                                            (0o770, False, False), (0o770, True, True),
                                            (0o777, True, False)])
def test_root_permissions(root: Path, mode: int, shared: bool, ok: bool) -> None:
    import grp

    root.mkdir()
    root.chmod(mode)
    if shared:  # a shared root belongs to the named group
        os.chown(root, -1, os.getegid())
    cache = Cache(root, shared=grp.getgrgid(os.getegid()).gr_name if shared else False)
    if ok:
        cache.get_or_build("t", "x", INPUTS, writer({"f": "x"}))
        return
    with pytest.raises(UntrustedRootError, match=r"writable by .*chmod"):
        cache.get_or_build("t", "x", INPUTS, writer({"f": "x"}))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_root_owned_by_another_user_is_refused(root: Path) -> None:
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    with pytest.raises(UntrustedRootError, match="owned by uid 65534"):
        Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "x"}))


def test_unwritable_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UntrustedRootError, match="cannot use cache root"):
        Cache(Path("/proc/abicache-root")).get_or_build("t", "x", INPUTS, writer({"f": "x"}))


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from abicache.store.lock import key_lock
    with key_lock(Path(sys.argv[1]), "t x", 10):
        print("held", flush=True)
        time.sleep(30)
""")


def test_lock_timeout_names_the_holder(cache: Cache) -> None:
    cache.store.ensure()
    key, _ = cache.key_for("t", "x", __import__("abicache").Inputs.make(**INPUTS))
    lock = cache.store.layout.lock_file(key)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(SRC)})
    try:
        assert proc.stdout.readline().strip() == "held"
        cache.lock_timeout = 1.5
        with pytest.raises(LockTimeout, match=rf"pid {proc.pid} on .*ABICACHE_LOCK_TIMEOUT"):
            cache.get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    finally:
        proc.kill()
        proc.wait()
    # The kernel released the killed holder's lock: no stale lock remains.
    assert cache.get_or_build("t", "x", INPUTS, writer({"f": "x"})).file().read_text() == "x"


def test_gc_evicts_least_recently_used_down_to_the_cap(cache: Cache) -> None:
    arts = [cache.get_or_build("t", f"n{i}", INPUTS, writer({"f": os.urandom(1000)})) for i in range(5)]
    for i, art in enumerate(arts):
        os.utime(art.path, (1000 + i, 1000 + i))
    report = collect_garbage(cache.store, max_size=2500)
    assert report.entries_removed == 3 and report.blobs_removed == 3
    assert sorted(p.name for p in cache.store.iter_variant_dirs()) == sorted(f"{a.key}.{a.variant}" for a in arts[3:])
    assert disk_usage(cache.store)[0] <= 2500
    assert verify_store(cache.store, full=True).clean


def test_gc_by_age_and_leftovers(cache: Cache) -> None:
    old = cache.get_or_build("t", "old", INPUTS, writer({"f": "old"}))
    new = cache.get_or_build("t", "new", INPUTS, writer({"f": "new"}))
    os.utime(old.path, (time.time() - 86400 * 40,) * 2)
    stale = cache.store.layout.tmp / "123-stale"
    live = cache.store.layout.tmp / "456-live"
    stale.mkdir()
    live.mkdir()
    os.utime(stale, (time.time() - 86400,) * 2)
    report = collect_garbage(cache.store, max_age=30 * 86400)
    assert report.entries_removed == 1 and report.leftovers_removed == 1
    assert [p.name for p in cache.store.iter_variant_dirs()] == [f"{new.key}.{new.variant}"]
    assert live.exists() and not stale.exists()


LOADED = textwrap.dedent("""
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    print(lib.answer(), flush=True)
    sys.stdin.readline()
    print(lib.answer(), flush=True)
""")


def test_gc_with_a_tiny_cap_while_another_process_uses_a_library(cache: Cache) -> None:
    from abicache import cc

    art = cc.build_library("answer", ['extern "C" int answer() { return 42; }'], cache=cache)
    user = subprocess.Popen([sys.executable, "-c", LOADED, str(art.file())], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert user.stdout.readline().strip() == "42"
        report = collect_garbage(cache.store, max_size=1)
        assert report.entries_removed == 1 and not art.path.exists()
        assert disk_usage(cache.store)[0] <= 1
        user.stdin.write("\n")
        user.stdin.flush()
        assert user.stdout.readline().strip() == "42"  # still works: its mapping survived
    finally:
        user.kill()
        user.wait()
    # and the library is rebuilt on the next request
    assert not cc.build_library("answer", ['extern "C" int answer() { return 42; }'], cache=cache).hit


def test_explain_names_exactly_what_differed(cache: Cache, root: Path) -> None:
    base = {"sources": {"a.c": "int a;"}, "flags": ["-O2"], "tools": ["compiler.cxx"]}
    cache.get_or_build("t", "lib", base, writer({"f": "1"}))
    changed = {**base, "flags": ["-O3"]}
    why = cache.explain("t", "lib", changed)
    assert not why.hit
    assert [str(d) for d in why.candidates[0].differences] == ["flags: -O2 -> -O3"]
    other = Cache(root, facts=Facts().with_overrides({"compiler.cxx": "clang version 99"}))
    diffs = [str(d) for d in other.explain("t", "lib", base).candidates[0].differences]
    assert len(diffs) == 1 and diffs[0].startswith("tools.compiler.cxx: gcc") and diffs[0].endswith("-> clang version 99")
    assert cache.explain("t", "lib", base).hit


def test_abicache_explain_env_logs_the_reason(cache: Cache, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    cache.get_or_build("t", "lib", {"flags": ["-O2"]}, writer({"f": "1"}))
    monkeypatch.setenv("ABICACHE_EXPLAIN", "1")
    cache.get_or_build("t", "lib", {"flags": ["-O2", "-g"]}, writer({"f": "1"}))
    assert "flags: (none) -> -g" in caplog.text


def test_abicache_explain_prints_without_logging_setup(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        from abicache import Cache
        def build(out):
            (out / "f").write_text("x")
        c = Cache({str(tmp_path / 'r')!r})
        c.get_or_build("t", "lib", {{"flags": ["-O2"]}}, build)
        c.get_or_build("t", "lib", {{"flags": ["-O3"]}}, build)
    """)
    out = run_py(code, env={"ABICACHE_EXPLAIN": "1"})
    assert out.returncode == 0, out.stderr
    assert "flags: -O2 -> -O3" in out.stderr


@pytest.mark.parametrize("code", ["ENOLCK", "ENOSYS"])
def test_builds_proceed_where_the_filesystem_cannot_lock(cache: Cache, monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    """Some network filesystems refuse flock: build unlocked, warn once, stay correct."""
    import errno
    import fcntl

    import abicache.store.lock as lockmod

    def refuse(fd: int, op: int) -> None:
        raise OSError(getattr(errno, code), "flock not supported here")

    monkeypatch.setattr(fcntl, "flock", refuse)
    monkeypatch.setattr(lockmod, "_warned_unlocked", False)
    with pytest.warns(AbicacheWarning, match="building without a lock"):
        art = cache.get_or_build("t", "nolock", INPUTS, writer({"f": "x"}))
    assert art.file().read_text() == "x"
    assert verify_store(cache.store, full=True).clean


def test_a_declared_requirement_that_cannot_hold_here_builds_nothing(tmp_path: Path) -> None:
    """It rebuilt (and failed) on every call; now it says so at once, with the way to build for another machine."""
    from abicache import Cache, Facts
    from abicache.errors import BuildError

    calls = []

    def build(out: Path) -> None:
        calls.append(1)
        (out / "k.bin").write_bytes(b"x")

    inputs = {"sources": {"gemm.cu": "x"}, "flags": ["-O3"]}
    no_gpu = Cache(tmp_path / "s", facts=Facts().with_overrides({"gpu.arch": None}))
    for _ in range(2):
        with pytest.raises(BuildError, match=r"nothing was built.*for_target\(\{'gpu.arch': 'sm_90'\}\)"):
            no_gpu.get_or_build("my.kernel", "gemm", inputs, build, requires=["gpu.arch ~= sm_90a"])
    assert not calls and not list(no_gpu.store.iter_variant_dirs())
    target_named = Cache(tmp_path / "s", facts=Facts().with_overrides({"gpu.arch": "sm_90a"}))
    with pytest.raises(BuildError, match="does not name GPU devices .*'sm_90a' is not a device arch"):
        target_named.get_or_build("my.kernel", "gemm", inputs, build, requires=["gpu.arch ~= sm_90a"])
    art = Cache(tmp_path / "s").for_target({"gpu.arch": "sm_90"}).get_or_build(
        "my.kernel", "gemm", inputs, build, requires=["gpu.arch ~= sm_90a"])
    assert calls == [1] and art.requirements.to_list() == ["gpu.arch ~= sm_90a"]


def test_max_size_evicts_after_builds_and_gc_leaves_no_strays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ABICACHE_MAX_SIZE: after builds, the least recently used entries go down to the cap
    before the call returns; `gc --max-size 0` then leaves no lock file, index file or
    empty folder behind (it left ~20 MB for 2,000 entries)."""
    from abicache.store import gc

    monkeypatch.setattr(gc, "SETTLED", 0.0)
    monkeypatch.setenv("ABICACHE_MAX_SIZE", "100K")
    cache = Cache(tmp_path / "s", remote=False)
    for n in range(12):
        cache.get_or_build("t", f"k{n}", {"extra": {"n": n}}, writer({"f": os.urandom(30_000)}))
        assert gc.disk_usage(cache.store)[0] <= 100 * 1024
    used, _ = gc.disk_usage(cache.store)
    assert used <= 100 * 1024 and cache.find("t", cache.key_for("t", "k11", _as({"extra": {"n": 11}}))[0])
    from abicache.cli import main as cli

    assert cli(["ls", "--root", str(tmp_path / "s")]) == 0 and cache.store.layout.listing.is_dir()
    (cache.store.layout.listing / "t.rows.999.tmp").write_bytes(b"{")  # an `ls` killed while writing
    report = gc.collect_garbage(cache.store, max_size=0)
    assert report.entries_removed >= 1
    left = sorted(p.relative_to(cache.store.layout.base).as_posix() for p in cache.store.layout.base.rglob("*")
                  if (p.is_file() or p.is_symlink())
                  and not p.relative_to(cache.store.layout.base).as_posix().startswith(("log/", "tools/")))
    assert left == [], left
    folders = [p for p in cache.store.layout.entries.rglob("*") if p.is_dir()]
    assert folders == [], folders
    again = Cache(tmp_path / "s", remote=False).get_or_build("t", "k0", {"extra": {"n": 0}}, writer({"f": b"back"}))
    assert again.origin == "built" and again.file().read_bytes() == b"back"


def _as(doc: dict) -> object:
    from abicache.core.key import Inputs

    return Inputs.make(**doc)


def test_the_eviction_after_a_build_never_takes_the_entry_just_built(tmp_path: Path) -> None:
    """Its folder's mtime is not a safe clock: a stamp written into the entry built before it
    (at this build's publish) makes that one newer, and under load the tick is the same. The
    CI run that found it evicted the newest of twelve entries."""
    from abicache.store import gc

    cache = Cache(tmp_path / "s", remote=False)
    arts = [cache.get_or_build("t", f"k{n}", {"extra": {"n": n}}, writer({"f": "x" * 1000})) for n in range(3)]
    os.utime(arts[-1].path, (1, 1))  # the newest looks the oldest
    gc.collect_garbage(cache.store, max_size=0, spare=arts[-1].path)
    assert [a.path.exists() for a in arts] == [False, False, True]


def test_a_subclass_of_cache_opens_at_first_use_and_keeps_its_own_methods(root: Path) -> None:
    """Cache(root) opens at its first use into a class with the opened methods; a subclass
    stays itself: its overrides win, and isinstance holds before and after."""
    seen = []

    class Counted(Cache):
        def lookup(self, *args: object, **kwargs: object) -> object:
            seen.append(args[1])
            return super().lookup(*args, **kwargs)

    cache = Counted(root)
    assert isinstance(cache, Counted) and "store" not in cache.__dict__  # nothing opened yet
    cache.get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    assert cache.lookup("t", "x", INPUTS) is not None and seen == ["x"]
    assert isinstance(cache, Counted) and isinstance(cache, Cache) and type(cache).__name__ == "Counted"
    assert repr(cache) == f"Cache({str(root)!r})"
    pinned = cache.pinned_by_key(["platform.machine"])
    assert isinstance(pinned, Counted) and not pinned.as_opened() and cache.as_opened()
