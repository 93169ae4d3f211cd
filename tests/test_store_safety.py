"""The store is a security boundary: loading a cached .so runs its code.

One test (or one parametrized group) per finding of the store-safety review:
a co-user planting code, umask-dependent folders, symlinked lock files, a
slow-drip remote, in-place edits, hard-linked builder output, the lost-race
path, states that never recovered, remote memory before trust, verify beside
gc, and the small ones. The hostile co-user tests run as a real second user
(`nobody`, through setpriv) and skip with the reason where that cannot be done.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Iterator

import pytest

import hostile
from abicache import Cache, cc
from abicache.errors import AbicacheError, AbicacheWarning, BuildError, ConfigError, UntrustedRootError
from abicache.store.verify import verify_store
from conftest import SRC, read_only, run_py, tmpfs, writer
from remote_fixtures import Raw, redis_srv, remote, s3_endpoint  # noqa: F401  (fixtures)

INPUTS = {"sources": {"x.txt": "payload"}}


@pytest.fixture(autouse=True)
def _remove_public_folders():  # type: ignore[no-untyped-def]
    yield
    hostile.cleanup()


@pytest.fixture
def quick_stamps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stamps trust a ctime older than this many seconds (2 s in production)."""
    try:
        from abicache.store import stamps
    except ImportError:  # the code before stamps existed (to show these tests failing on it)
        return
    monkeypatch.setattr(stamps, "RACY_SECONDS", 0.05)


# ---- 1. a shared root owned by another user -----------------------------------------------


def _planted_store(tmp_path: Path, evil: bytes) -> Path:
    """A store whose cc library 'answer' holds the planted code, copied by the
    attacker into a root of its own; returns that root (owned by nobody)."""
    legit = tmp_path / "legit"
    art = cc.build_library("answer", [hostile.GOOD_C], cache=Cache(legit, remote=False))
    plant = hostile.copy_tree(legit)
    rel = art.path.relative_to(legit)
    hostile.forge(plant / rel, plant / "v3" / "blobs", evil)
    pub = hostile.public_dir()
    dest = pub / "store"
    hostile.as_attacker("sh", "-c", f"cp -a '{plant}' '{dest}' && chmod -R go-w '{dest}'")
    return dest


@pytest.mark.skipif(hostile.why_not() is not None, reason=str(hostile.why_not()))
def test_a_shared_root_owned_by_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    evil = hostile.evil_library(tmp_path)
    root = _planted_store(tmp_path, evil)
    assert root.stat().st_uid == hostile.ATTACKER
    mark = tmp_path / "PLANTED-CODE-RAN"
    monkeypatch.setenv("ABICACHE_PLANTED_MARK", str(mark))
    monkeypatch.setenv("ABICACHE_SHARED", "users")  # a group the attacker is not in
    with pytest.raises(UntrustedRootError, match="owned by uid 65534"):
        cc.load_library("answer", [hostile.GOOD_C], cache=Cache(root, remote=False))
    assert not mark.exists()


def test_shared_mode_needs_a_named_group(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.setenv("ABICACHE_SHARED", "1")
    with pytest.raises(ConfigError, match="name the group"):
        Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    monkeypatch.setenv("ABICACHE_SHARED", "no-such-group-abicache")
    with pytest.raises(ConfigError, match="no-such-group-abicache.*not a group"):
        Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "x"}))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_a_shared_store_is_setgid_to_its_group(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import grp

    monkeypatch.setenv("ABICACHE_SHARED", "users")
    gid = grp.getgrnam("users").gr_gid
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"sub/f": "x"}))
    for folder in (root, root / "v3", root / "v3" / "entries", art.path, art.path / "sub"):
        st = folder.lstat()
        assert st.st_gid == gid and st.st_mode & stat.S_ISGID, folder
        assert not st.st_mode & stat.S_IWOTH, folder
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({"sub/f": "y"})).hit


# ---- 2. only the root was checked --------------------------------------------------------------


def test_store_folders_are_private_whatever_the_umask(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    root.chmod(0o755)  # traversable by others: allowed, it is not writable
    old = os.umask(0)
    try:
        art = Cache(root).get_or_build("t", "x", INPUTS, writer({"sub/deeper/f": "x"}))
        stage_mode = None
        with Cache(root).store.stage() as stage:
            stage_mode = stat.S_IMODE(stage.lstat().st_mode)
    finally:
        os.umask(old)
    open_to_others = []
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if mode & 0o022 and not stat.S_ISLNK(mode):  # a symlink's mode is always 777, and unused
                open_to_others.append(f"{os.path.join(folder, name)} {stat.S_IMODE(mode):o}")
    assert not open_to_others
    assert stage_mode is not None and not stage_mode & 0o077
    assert art.hit is False


def _plant_into(root: Path, rel: Path, plant_vdir: Path, evil: Path) -> subprocess.CompletedProcess[str]:
    return hostile.as_attacker("sh", "-c", hostile.plant_command(root, rel, plant_vdir, evil), check=False)


@pytest.mark.skipif(hostile.why_not() is not None, reason=str(hostile.why_not()))
@pytest.mark.parametrize("legacy", [False, True], ids=["fresh-store", "store-left-open-by-an-old-version"])
def test_a_co_user_cannot_plant_the_next_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               legacy: bool) -> None:
    pub = hostile.public_dir()
    root = pub / "store"
    root.mkdir()
    root.chmod(0o755)
    old = os.umask(0)
    try:
        Cache(root, remote=False).get_or_build("t", "first", INPUTS, writer({"f": "x"}))
    finally:
        os.umask(old)
    if legacy:  # what the old code left under umask 000: every folder 0777
        for folder, dirs, _ in os.walk(root / "v3"):
            os.chmod(folder, 0o777)
    # The attacker computes the victim's next key (it is deterministic) and plants it.
    evil_file = hostile.evil_file(tmp_path)
    legit = tmp_path / "legit"
    art = cc.build_library("answer", [hostile.GOOD_C], cache=Cache(legit, remote=False))
    rel = art.path.relative_to(legit)
    plant = hostile.copy_tree(art.path)
    hostile.forge(plant, tmp_path / "unused-blobs", evil_file.read_bytes())
    planted = _plant_into(root, rel, plant, evil_file)
    assert (planted.returncode == 0) == legacy, planted.stderr
    if legacy:  # verify must not call a planted entry clean
        report = verify_store(Cache(root, remote=False).store, full=True)
        assert not report.clean and any("uid 65534" in p.reason for p in report.problems)
        _plant_into(root, rel, plant, evil_file)  # verify moved it aside: plant it again
    mark = tmp_path / "PLANTED-CODE-RAN"
    monkeypatch.setenv("ABICACHE_PLANTED_MARK", str(mark))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib = cc.load_library("answer", [hostile.GOOD_C], cache=Cache(root, remote=False))
    assert lib.answer() == 42
    assert not mark.exists()


# ---- 3. lock files followed symlinks ---------------------------------------------------------------


@pytest.mark.parametrize("which", [".holder", ".lock"])
def test_lock_files_never_follow_a_planted_symlink(cache: Cache, tmp_path: Path, which: str) -> None:
    secret = tmp_path / "secret"
    secret.write_text("precious")
    secret.chmod(0o600)
    cache.store.ensure()
    key, _ = cache.key_for("t", "x", __import__("abicache").Inputs.make(**INPUTS))
    lock = cache.store.layout.lock_file(key)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.with_suffix(which).symlink_to(secret)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cache.get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    assert secret.read_text() == "precious"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


# ---- 4. a slow-drip Redis ----------------------------------------------------------------------------


SLOW_CLIENT = textwrap.dedent("""
    import json, sys, time, warnings
    from abicache import Cache
    warnings.simplefilter("ignore")
    start = time.monotonic()
    art = Cache(sys.argv[1], remote=sys.argv[2]).get_or_build(
        "t", "drip", {}, lambda out: (out / "f").write_bytes(b"local"))
    print(json.dumps([time.monotonic() - start, art.origin]))
""")


def test_a_slow_drip_redis_is_bounded_per_call(tmp_path: Path) -> None:
    import servers

    why = servers.redis_available()
    if why:
        pytest.skip(why)
    with servers.redis_server(tls=False) as server, servers.drip_proxy(server.port, 1.0) as port:
        url = server.base.replace(f":{server.port}", f":{port}") + "/0?prefix=drip"
        try:
            done = run_py(SLOW_CLIENT.replace("sys.argv[1]", repr(str(tmp_path / "s")))
                          .replace("sys.argv[2]", repr(url)),
                          env={"ABICACHE_REMOTE_TIMEOUT": "2"}, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("a lookup against a one-byte-per-second Redis ran for over 60 s")
    assert done.returncode == 0, done.stderr
    seconds, origin = json.loads(done.stdout)
    assert origin == "built" and seconds < 15


# ---- 5. a changed byte ran for up to 7 days -------------------------------------------------------


@pytest.mark.parametrize("how", ["owner-restores-the-mode", "root-writes-in-place"])
def test_an_in_place_edit_never_runs(root: Path, how: str, quick_stamps: None) -> None:
    if how == "root-writes-in-place" and os.geteuid() != 0:
        pytest.skip("needs root to write a 0444 file without chmod")
    data = os.urandom(8192)
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": data}))
    time.sleep(0.1)
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"never"})).hit  # stamps it
    path = art.path / "lib.so"
    if how == "owner-restores-the-mode":
        path.chmod(0o644)
    with open(path, "r+b") as fh:  # same size, same inode
        fh.seek(4000)
        fh.write(bytes([data[4000] ^ 0x20]))
    if how == "owner-restores-the-mode":
        path.chmod(0o444)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": data}))  # the default policy
    assert got.file().read_bytes() == data and not got.hit


def test_a_stamped_hit_does_not_rehash(root: Path, quick_stamps: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from abicache.store import blobs

    Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 4096}))
    time.sleep(0.1)
    Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"never"}))  # first hit: hash, stamp
    hashed = []
    real = blobs.hash_file
    monkeypatch.setattr(blobs, "hash_file", lambda p: hashed.append(p) or real(p))
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"never"})).hit
    assert hashed == []


# ---- 6. a builder hard-linking its output from elsewhere --------------------------------------------


def test_hard_linked_builder_output_is_copied(cache: Cache, root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "build" / "lib.so"
    outside.parent.mkdir()
    outside.write_bytes(b"version 1")
    outside.chmod(0o644)
    art = cache.get_or_build("t", "x", INPUTS, lambda out: os.link(outside, out / "lib.so"))
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644  # never touched
    outside.write_bytes(b"version 2")  # the user's build folder is rewritten
    assert art.file().read_bytes() == b"version 1"
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": "never"})).file().read_bytes() == b"version 1"


# ---- 7. the lost-race path ---------------------------------------------------------------------------------


def test_the_lost_race_path_verifies_the_winner(root: Path, tmp_path: Path) -> None:
    other_root = tmp_path / "other"
    other = Cache(other_root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"good"}))
    rel = other.path.relative_to(other_root)

    def build(out: Path) -> None:
        # While we build, a damaged "winner" of the very same variant appears.
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(other.path, dest)
        (dest / "lib.so").chmod(0o644)
        (dest / "lib.so").write_bytes(b"evil")
        (dest / "lib.so").chmod(0o444)
        (out / "lib.so").write_bytes(b"good")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        art = Cache(root).get_or_build("t", "x", INPUTS, build)
    assert art.file().read_bytes() == b"good"
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"no"})).file().read_bytes() == b"good"


# ---- 8. states that never recovered ---------------------------------------------------------------------


def test_a_variant_without_manifest_is_rebuilt(root: Path) -> None:
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    hostile.remove_manifest(art.path)
    with pytest.warns(Warning, match="no manifest"):
        again = Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    assert not again.hit and again.file().read_text() == "x"
    assert Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "y"})).hit


def test_verify_reports_a_variant_without_manifest(root: Path) -> None:
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "x"}))
    hostile.remove_manifest(art.path)
    report = verify_store(Cache(root).store)
    assert not report.clean and "no manifest" in report.problems[0].reason
    assert not art.path.exists()


def test_a_manifest_over_the_read_limit_is_refused_at_publish(cache: Cache) -> None:
    deep = "/".join(["d" * 250] * 13)  # long names: few files make a large manifest

    def build(out: Path) -> None:
        (out / deep).mkdir(parents=True)
        for i in range(1300):
            (out / deep / f"f{i:05}").write_bytes(b"x")

    with pytest.raises(BuildError, match=r"manifest .* over the .*limit"):
        cache.get_or_build("t", "many", INPUTS, build)
    assert list(cache.store.iter_variant_dirs()) == []


def test_a_blob_at_the_hard_link_limit_gets_a_fresh_copy(cache: Cache, tmp_path: Path) -> None:
    first = cache.get_or_build("t", "a", INPUTS, writer({"f": b"same bytes"}))
    blob = cache.store.layout.blob(first.manifest.files[0].sha256, False)
    links = tmp_path / "links"
    links.mkdir()
    try:
        for i in range(70_000):
            os.link(blob, links / str(i))
        pytest.skip("this filesystem has no hard-link limit below 70,000")
    except OSError as exc:
        if exc.errno != errno.EMLINK:
            raise
    second = cache.get_or_build("t", "b", INPUTS, writer({"f": b"same bytes"}))
    assert second.file().read_bytes() == b"same bytes"
    assert Cache(cache.root).get_or_build("t", "b", INPUTS, writer({"f": "no"})).hit
    assert Cache(cache.root).get_or_build("t", "a", INPUTS, writer({"f": "no"})).hit
    shutil.rmtree(links)


@pytest.mark.parametrize("folder", ["tmp", "blobs", "locks", "quarantine", "trash", "entries"])
def test_a_deleted_store_folder_is_recreated(root: Path, folder: str) -> None:
    cache = Cache(root)
    cache.get_or_build("t", "a", INPUTS, writer({"f": "a"}))
    shutil.rmtree(root / "v3" / folder)
    assert cache.get_or_build("t", "b", INPUTS, writer({"f": "b"})).file().read_text() == "b"
    shutil.rmtree(root / "v3" / folder, ignore_errors=True)  # not every folder is made again at once
    assert Cache(root).get_or_build("t", "c", INPUTS, writer({"f": "c"})).file().read_text() == "c"


# ---- 9. remote memory before any trust check ------------------------------------------------------------

BIG = 64 << 20
MEMORY_CLIENT = textwrap.dedent("""
    import json, re, sys, warnings
    from abicache import Cache
    warnings.simplefilter("ignore")
    art = Cache(sys.argv[1], remote=sys.argv[2]).get_or_build(
        "t", "mem", {}, lambda out: (out / "f").write_bytes(b"local bytes"))
    # VmHWM: this process's own peak (ru_maxrss would include the parent's at fork)
    peak = int(re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
    print(json.dumps([peak, art.origin]))
""")


def _peak(tmp_path: Path, url: str, tag: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", MEMORY_CLIENT, str(tmp_path / tag), url], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)
    assert done.returncode == 0, done.stderr
    peak, origin = json.loads(done.stdout)
    return peak, origin


def test_a_huge_blob_behind_a_small_manifest_is_not_read(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    """A frame of a few KiB that inflates to 64 MiB (a bomb) behind a manifest of 11 bytes."""
    remote_url, raw = remote
    art = Cache(tmp_path / "A", remote=remote_url).get_or_build(
        "t", "mem", {}, lambda out: (out / "f").write_bytes(b"local bytes"))
    baseline, origin = _peak(tmp_path, remote_url, "B0")
    assert origin == "remote"
    raw.delete_blob(art.manifest.files[0].sha256)
    raw.put_blob(art.manifest.files[0].sha256, b"\0" * BIG)
    peak, origin = _peak(tmp_path, remote_url, "B1")
    assert origin == "built"
    assert peak - baseline < 24 << 20, f"peak grew by {(peak - baseline) >> 20} MiB for a {BIG >> 20} MiB blob"


def test_a_huge_manifest_is_not_read(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    remote_url, raw = remote
    art = Cache(tmp_path / "A", remote=remote_url).get_or_build(
        "t", "mem", {}, lambda out: (out / "f").write_bytes(b"local bytes"))
    baseline, _ = _peak(tmp_path, remote_url, "B0")
    raw.put_manifest("t", art.key, "0123456789abcdef", b"{" * BIG)
    peak, _ = _peak(tmp_path, remote_url, "B1")
    assert peak - baseline < 24 << 20, f"peak grew by {(peak - baseline) >> 20} MiB for a {BIG >> 20} MiB manifest"


# ---- 10. verify --full beside gc ------------------------------------------------------------------------------

GC_LOOP = textwrap.dedent("""
    import sys, time
    from abicache import Cache
    from abicache.store.gc import collect_garbage
    cache = Cache(sys.argv[1], remote=False)
    end = time.monotonic() + float(sys.argv[2])
    n = 0
    while time.monotonic() < end:
        for i in range(15):
            cache._memo.clear()
            cache.get_or_build("t", f"k{i % 7}-{n % 3}", {"extra": {"i": i}},
                               lambda out, i=i: (out / "lib.so").write_bytes(bytes([i]) * 50000))
        collect_garbage(cache.store, max_size=0, tmp_age=0)
        n += 1
    print(n)
""")


def test_verify_beside_gc_reports_nothing_and_never_raises(root: Path) -> None:
    Cache(root).store.ensure()
    proc = subprocess.Popen([sys.executable, "-c", GC_LOOP, str(root), "8"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    errors, problems, rounds = [], [], 0
    while proc.poll() is None:
        try:
            report = verify_store(Cache(root).store, full=True)
        except Exception as exc:  # noqa: BLE001  any exception is the finding
            errors.append(repr(exc))
            continue
        problems += [f"{p.where}: {p.reason}" for p in report.problems]
        rounds += 1
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert rounds > 3
    assert errors == [] and problems == []


# ---- 11. the small ones ------------------------------------------------------------------------------------


def test_a_local_manifest_with_edited_requirements_is_refused(root: Path) -> None:
    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "x"}), requires=["platform.system == linux"])
    doc = hostile.manifest_doc(art.path)
    doc["requirements"] = []
    hostile.rewrite_manifest(art.path, json.dumps(doc).encode())
    with pytest.warns(Warning, match="variant id"):
        again = Cache(root).get_or_build("t", "x", INPUTS, writer({"f": "x"}), requires=["platform.system == linux"])
    assert not again.hit


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "-1", "soon"])
def test_config_seconds_must_be_finite(monkeypatch: pytest.MonkeyPatch, root: Path, value: str) -> None:
    monkeypatch.setenv("ABICACHE_VERIFY_AGE", value)
    with pytest.raises(ConfigError, match="ABICACHE_VERIFY_AGE"):
        Cache(root).store  # noqa: B018  a Cache reads its settings at its first use


@pytest.mark.parametrize("returned", [(3, "x"), ("platform.system == Linux", 3), {"a": 1}, 7, b"x"])
def test_any_other_builder_return_value_is_ignored(cache: Cache, returned: object) -> None:
    def build(out: Path) -> object:
        (out / "f").write_text("x")
        return returned

    art = cache.get_or_build("t", "x", INPUTS, build)
    assert art.manifest.declared.to_list() == []


def test_a_file_next_to_one_named_like_a_link_temp(cache: Cache, root: Path) -> None:
    files = {"x": b"one", "x.abicache-link": b"two"}
    cache.get_or_build("t", "a", INPUTS, writer({"x": b"one"}))  # its blob exists: x gets linked
    art = cache.get_or_build("t", "b", INPUTS, writer(files))
    assert {f: art.file(f).read_bytes() for f in art.files} == files


@pytest.mark.parametrize("bad", ["new\nline", "tab\there", "esc\x1b[31m", "bell\x07"])
def test_control_characters_in_file_names_are_refused(cache: Cache, bad: str) -> None:
    with pytest.raises(BuildError, match="control character"):
        cache.get_or_build("t", "x", INPUTS, writer({bad: "x"}))


@pytest.mark.parametrize("bad", ["new\nline", "lone \udcff surrogate", "", "nul\0"])
def test_unusable_artifact_names_are_a_clear_error(cache: Cache, bad: str) -> None:
    with pytest.raises(AbicacheError, match="artifact name"):
        cache.get_or_build("t", bad, INPUTS, writer({"f": "x"}))


def test_undecodable_file_names_from_a_builder_are_refused(cache: Cache) -> None:
    def build(out: Path) -> None:
        (out / "f").write_text("x")
        with open(os.path.join(os.fsencode(out), b"bad\xff"), "wb") as fh:
            fh.write(b"x")

    with pytest.raises(BuildError, match="not valid UTF-8"):
        cache.get_or_build("t", "x", INPUTS, build)


def test_file_names_a_manifest_may_list_are_the_same_whichever_way_they_are_checked() -> None:
    """safe_relpath's fast path for plain names (no pattern) and its long way agree with the
    rule, for 60,000 random names of separators, dots, drive colons, backslashes, blanks,
    non-ASCII letters and control characters: relative, inside the folder, no empty, '.' or
    '..' part, no part named like abicache's own files, printable."""
    import random

    from abicache.errors import ManifestError
    from abicache.store.manifest import RESERVED, RESERVED_PREFIX, safe_relpath

    def allowed(name: str) -> bool:
        parts = name.split("/")
        drive = name[1:2] == ":" and name[:1].isascii() and name[:1].isalpha()  # C:...
        return (bool(name) and not name.startswith("/") and "\\" not in name and not drive
                and all(p not in ("", ".", "..") and not p.startswith(RESERVED_PREFIX) for p in parts)
                and name not in RESERVED and not any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in name))

    rng, alphabet = random.Random(7), ["a", "Z", "0", "-", "+", "_", ".", "/", ":", "\\", " ", "é", "\n", "\x85",
                                       ".abicache-", "manifest.json"]
    for _ in range(60000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
        try:
            kept = safe_relpath(name) == name
        except ManifestError:
            kept = False
        assert kept == allowed(name), repr(name)


def test_kinds_digests_and_control_characters_are_checked_as_their_patterns_check_them() -> None:
    """The hit checks kinds, hex digests and text without compiling a pattern (layout.is_kind,
    is_hex, manifest.has_control); 60,000 random strings give the patterns' answers."""
    import random
    import re

    from abicache.store.layout import is_hex, is_kind
    from abicache.store.manifest import has_control

    kind, digest, control = (re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}"), re.compile(r"[0-9a-f]{16,64}"),
                             re.compile(r"[\x00-\x1f\x7f-\x9f]"))
    rng = random.Random(11)
    alphabet = ["a", "f", "g", "z", "0", "9", "A", "F", "_", ".", "-", " ", "/", "\n", "\x00", "\x7f", "\x85",
                "\x9f", "\xa0", "é", "٣", "\u2028", "\ud800", "0123456789abcdef"]
    for _ in range(60000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        text = text * rng.choice([1, 1, 1, 4, 5])  # lengths around 16 and 64
        assert is_kind(text) == bool(kind.fullmatch(text)), repr(text)
        assert is_hex(text) == bool(digest.fullmatch(text)), repr(text)
        assert has_control(text) == bool(control.search(text)), repr(text)


def test_a_fresh_entry_is_stamped_at_publish_but_not_an_unhashed_blob(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first hit need not hash what publish just hashed; a file that became
    a link to a blob already in the store (not hashed by this publish) is not
    stamped, so a damaged blob is still found."""
    from abicache.store import blobs, publishing, stamps

    monkeypatch.setattr(publishing, "_WAIT_BYTES", 0)  # stamp whatever the size (small entries skip the wait)
    data = os.urandom(4096)
    first = Cache(root).get_or_build("t", "a", INPUTS, writer({"lib.so": data}))
    assert stamps.read(first.path, lambda st: True).files  # stamped at publish
    hashed = []
    real = blobs.hash_file
    monkeypatch.setattr(blobs, "hash_file", lambda p: hashed.append(p) or real(p))
    assert Cache(root).get_or_build("t", "a", INPUTS, writer({"lib.so": b"x"})).hit
    assert hashed == []
    monkeypatch.setattr(blobs, "hash_file", real)
    blob = first.path / "lib.so"  # damage the shared blob in place, then publish the same bytes elsewhere
    blob.chmod(0o644)
    with open(blob, "r+b") as fh:
        fh.write(b"\xff")
    blob.chmod(0o444)
    second = Cache(root).get_or_build("t", "b", INPUTS, writer({"lib.so": data}))  # links to the damaged blob
    assert not stamps.read(second.path, lambda st: True).files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = Cache(root).get_or_build("t", "b", INPUTS, writer({"lib.so": data}))
    assert again.file().read_bytes() == data


def test_a_small_entry_is_not_held_back_to_be_stamped(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Publish waits (up to stamps.FINE_SECONDS) to stamp only what is worth it: a small
    entry is published at once and its first hit hashes it, a large one is stamped."""
    from abicache.store import publishing, stamps

    slept = []
    monkeypatch.setattr(publishing.time, "sleep", lambda s: slept.append(s))
    small = Cache(root).get_or_build("t", "small", INPUTS, writer({"lib.so": os.urandom(4096)}))
    assert not slept and not stamps.read(small.path, lambda st: True).files
    monkeypatch.setattr(publishing, "_WAIT_BYTES", 1024)
    Cache(root).get_or_build("t", "large", INPUTS, writer({"lib.so": os.urandom(4096)}))
    assert slept and 0 < slept[0] <= stamps.FINE_SECONDS + 0.002



SMALL_BUILDS = """
import os, sys
from abicache import Cache
cache = Cache(sys.argv[1])
for name in ("a", "b", "c"):
    cache.get_or_build("t", name, {"sources": {"x.txt": name}},
                       lambda out, name=name: (out / "lib.so").write_bytes(name.encode() * 64))
"""


def test_small_entries_are_stamped_by_their_builder_before_it_exits(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small entry is not held back at publish to be stamped; its builder checks and stamps
    it later (its next publish, or its exit), so the first hit in the next process hashes
    nothing and writes nothing (a thousand Triton kernels' first hits: 0.75 ms each)."""
    from abicache.store import blobs, stamps

    done = subprocess.run([sys.executable, "-c", SMALL_BUILDS, str(root)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    hashed: list[Path] = []
    real = blobs.hash_file
    monkeypatch.setattr(blobs, "hash_file", lambda p: hashed.append(p) or real(p))
    before = {p: p.lstat().st_mtime_ns for p in root.rglob("*")}
    cache = Cache(root)
    for name in ("a", "b", "c"):
        got = cache.lookup("t", name, {"sources": {"x.txt": name}})
        assert got is not None and got.file().read_bytes() == name.encode() * 64
        assert stamps.read(got.path, lambda st: True).files
    assert hashed == []
    assert {p: p.lstat().st_mtime_ns for p in root.rglob("*")} == before


def test_a_small_entry_changed_before_its_deferred_stamp_is_not_vouched_for(root: Path) -> None:
    """The builder's later check hashes the files again: a byte changed between the publish
    and that check (same size, mode put back) is not stamped, and the first hit moves it aside."""
    from abicache.store import publishing, stamps

    art = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 64}))
    blob = art.file()
    blob.chmod(0o644)
    blob.write_bytes(b"B" * 64)
    blob.chmod(0o444)
    publishing._deferred.flush(wait=True)
    assert not stamps.read(art.path, lambda st: True).files
    with pytest.warns(AbicacheWarning, match="sha256"):
        again = Cache(root).get_or_build("t", "x", INPUTS, writer({"lib.so": b"A" * 64}))
    assert not again.hit and again.file().read_bytes() == b"A" * 64


FORKED = textwrap.dedent("""
    import os, sys, time
    from abicache import Cache
    from abicache.store import publishing
    def build(out):
        (out / "lib.so").write_bytes(b"F" * 64)
    cache = Cache(sys.argv[1])
    art = cache.get_or_build("t", "forked", {"sources": {"s": "f"}}, build)
    if not publishing._deferred._entries:  # a loaded machine: published after its times had settled
        publishing._deferred.add(cache.store, art.path, cache.store.read_manifest(art.path), time.time_ns() + 10**8)
    pending = len(publishing._deferred._entries)
    with publishing._deferred._lock:  # held at the fork
        pid = os.fork()
        if pid == 0:
            ok = publishing._deferred._entries == [] and publishing._deferred._lock.acquire(timeout=1)
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    kept = len(publishing._deferred._entries)
    publishing._deferred.flush(wait=True)
    print(pending, os.waitstatus_to_exitcode(status), kept, len(publishing._deferred._entries))
""")


def test_a_forked_child_does_not_check_its_parent_s_deferred_entries(root: Path) -> None:
    """A child forked while the parent holds entries to check starts with none, and with the
    list's lock free though the parent held it at the fork; the parent still checks its own."""
    done = subprocess.run([sys.executable, "-c", FORKED, str(root)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "0", "1", "0"], done.stdout


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (mounting needs root: skipped with the reason otherwise)."""
    with tmpfs(tmp_path / "small", "2m") as mount:
        yield mount


def test_a_full_disk_or_a_read_only_store_is_one_line_and_hits_still_load(small_disk: Path) -> None:
    """ENOSPC while publishing and EROFS on a miss: StoreUnwritableError naming the store,
    the error and the fix (the CLI: one line, exit 2); hits still load; nothing partial."""
    from abicache.errors import StoreUnwritableError
    from abicache.store.verify import verify_store

    cache = Cache(small_disk / "store", remote=False)
    kept = cache.get_or_build("t", "small", {"extra": {}}, lambda out: (out / "f").write_bytes(b"x" * 1000))
    with pytest.raises(StoreUnwritableError, match="disk is full") as full:
        cache.get_or_build("t", "big", {"extra": {}}, lambda out: (out / "f").write_bytes(os.urandom(3 << 20)))
    assert str(small_disk / "store") in str(full.value) and full.value.__cause__ is None
    assert verify_store(cache.store, full=True).clean
    orphans = [b.path for b in cache.store.iter_blobs() if os.stat(b.path).st_nlink < 2]
    assert orphans == [], orphans  # a blob no entry links to, left by the failed publish
    read_only(small_disk)
    fresh = Cache(small_disk / "store", remote=False)
    assert fresh.get_or_build("t", "small", {"extra": {}}, _never).file().read_bytes() == b"x" * 1000
    done = subprocess.run([sys.executable, "-m", "abicache", "gc", "--max-size", "0", "--root",
                           str(small_disk / "store")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "read-only" in done.stderr, done.stderr
    assert kept.file().read_bytes() == b"x" * 1000


#: three 1 MiB tables: an object and a library of about 3 MiB, over the 2 MiB disk
THREE_MIB = """const char a[1 << 20] = {1};
const char b[1 << 20] = {2};
const char c[1 << 20] = {3};
int f(void) { return a[5] + b[3] + c[1]; }
"""


def test_a_disk_that_fills_during_the_compile_is_the_same_one_line(small_disk: Path) -> None:
    """The assembler or the linker failing for want of space printed its own lines ("can't
    fill 256 bytes in section .rodata", "final link failed", BFD's assertions) as a build
    failure of the source; now it is the store's one line, as a full disk at publish is,
    for a unit's object and for the link; the store is left whole."""
    from abicache.errors import StoreUnwritableError

    cache = Cache(small_disk / "store", remote=False)
    for sources in ([THREE_MIB], [THREE_MIB.replace("int f", "int g"), "int h(void) { return 2; }\n"]):
        with pytest.raises(StoreUnwritableError, match="disk is full") as full:
            cc.build_library("big", sources, lang="c", cache=cache)
        text = str(full.value)
        assert str(small_disk / "store") in text and "\n" not in text and "section" not in text, text
        assert "No space left on device (" in text and "None" not in text, text
        assert full.value.__cause__ is None
    assert verify_store(cache.store, full=True).clean
    small = cc.load_library("small", ["int f(void) { return 7; }\n"], lang="c", cache=cache)
    assert small.f() == 7


def test_a_read_only_store_serves_hits_and_builds_misses_into_the_users_own(
        small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store on a read-only mount: hits load from it; a miss builds into the per-user
    fallback store and says where, once; a later process finds it there (lookup and
    get_or_build) without building; the engine's own entries (unit objects) follow."""
    from abicache import cc
    from abicache.errors import AbicacheWarning

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    store = small_disk / "store"
    inputs = {"extra": {"n": "1"}}
    kept = Cache(store, remote=False).get_or_build("t", "kept", inputs, lambda out: (out / "f").write_bytes(b"k"))
    read_only(small_disk)
    cache = Cache(store, remote=False)
    assert cache.get_or_build("t", "kept", inputs, _never).path == kept.path
    with pytest.warns(AbicacheWarning, match="misses build into .*xdg/abicache") as said:
        new = cache.get_or_build("t", "new", inputs, lambda out: (out / "f").write_bytes(b"n"))
        lib = cc.load_library("adder", 'extern "C" int add(int a, int b) { return a + b; }', cache=cache)
    assert len([w for w in said if "misses build into" in str(w.message)]) == 1
    assert lib.add(2, 40) == 42
    fallback_root = tmp_path / "xdg" / "abicache"
    assert new.origin == "built" and str(new.path).startswith(str(fallback_root)), new.path
    later = Cache(store, remote=False)
    assert later.lookup("t", "new", inputs).path == new.path
    assert later.get_or_build("t", "new", inputs, _never).file().read_bytes() == b"n"
    assert cc.build_library("adder", 'extern "C" int add(int a, int b) { return a + b; }', cache=later).hit
    assert not any(os.scandir(store / "v3" / "tmp"))  # nothing staged in the read-only store
    # a view for another machine, made after the fallback exists, falls back with its own facts
    target = cache.for_target({"python.abi": "cp399"})
    other = target.get_or_build("t", "elsewhere", inputs, lambda out: (out / "f").write_bytes(b"e"),
                                ["python.abi == cp399"])
    assert str(other.path).startswith(str(fallback_root)) and other.requirements.to_list() == ["python.abi == cp399"]


def _never(out: Path) -> None:
    raise AssertionError("built, where the store had the entry")
