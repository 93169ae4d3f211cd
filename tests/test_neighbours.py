"""What a neighbour can steer (trust, third round): a store's own config file, the
background check, folder and HTTP remotes, the observer, read-only stores, names
that do not fit, logs. One test (or one parametrized group) per finding; those about
another user run as a real second user (`nobody`, through setpriv, tests/hostile.py)
and skip with the reason where that cannot be done.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import hostile
from abicache import Cache, cc
from abicache.settings import config, settings_file
from abicache.errors import ConfigError, UntrustedRootError
from conftest import SRC, plant as planted
from test_store_safety import _planted_store

HOSTILE = pytest.mark.skipif(hostile.why_not() is not None, reason=str(hostile.why_not()))


@pytest.fixture(autouse=True)
def _fresh_settings():  # type: ignore[no-untyped-def]
    settings_file.forget()
    yield
    settings_file.forget()
    hostile.cleanup()


def _cli(*argv: str) -> tuple[int, str, str]:
    """`abicache ARGV` in a fresh process, with this test's environment."""
    done = subprocess.run([sys.executable, "-m", "abicache", *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    return done.returncode, done.stdout, done.stderr


# ---- critical: the store's own config file chose whom the store trusts ----------------------------------------


@HOSTILE
def test_a_planted_store_file_cannot_name_the_attackers_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacker makes the victim's root first (under a sticky public folder), writes
    `shared = "<its own group>"` into its abicache.toml and plants the victim's next
    library: the victim's load must refuse the root, and the planted code never runs."""
    root = _planted_store(tmp_path, hostile.evil_library(tmp_path))
    hostile.as_attacker("sh", "-c", f"printf 'shared = \"nogroup\"\\n' > '{root}/abicache.toml'")
    mark = tmp_path / "PLANTED-CODE-RAN"
    monkeypatch.setenv("ABICACHE_TEST_PLANTED_MARK", str(mark))
    monkeypatch.setenv("ABICACHE_DIR", str(root))
    assert config.text("ABICACHE_SHARED") == ""  # the store's file may not say it
    with pytest.raises(UntrustedRootError, match="owned by uid 65534"):
        cc.load_library("answer", [hostile.GOOD_C], cache=Cache(remote=False))
    assert not mark.exists()


@HOSTILE
def test_a_store_file_written_by_another_user_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Inside the victim's own root, an abicache.toml that belongs to another user (or that
    others may write) is not read at all: not even its size cap."""
    root = tmp_path / "store"
    Cache(root, remote=False).store.ensure()
    planted = root / "abicache.toml"
    planted.write_text('max_size = "1M"\n')
    os.chown(planted, hostile.ATTACKER, hostile.ATTACKER)
    monkeypatch.setenv("ABICACHE_DIR", str(root))
    assert config.lookup("ABICACHE_MAX_SIZE") == (None, "default")
    assert "owned by uid 65534" in capsys.readouterr().err
    os.chown(planted, 0, 0)
    planted.chmod(0o666)
    settings_file.forget()
    assert config.lookup("ABICACHE_MAX_SIZE") == (None, "default")
    assert "writable by others" in capsys.readouterr().err


@pytest.mark.parametrize("key, value, variable", [
    ("shared", "users", "ABICACHE_SHARED"),
    ("dir", "/tmp/elsewhere", "ABICACHE_DIR"),
    ("remote", "file:///tmp/theirs", "ABICACHE_REMOTE"),
    ("read_stores", "/tmp/theirs", "ABICACHE_READ_STORES"),
    ("trusted_keys", "ed25519:AAAA", "ABICACHE_TRUSTED_KEYS"),
    ("signing_key", "/tmp/key.pem", "ABICACHE_SIGNING_KEY"),
    ("check", "1", "ABICACHE_CHECK"),
    ("observe", "0", "ABICACHE_OBSERVE"),
    ("sloppiness", "system_headers", "ABICACHE_SLOPPINESS"),
    ("verify_age", "99999999", "ABICACHE_VERIFY_AGE"),
    ("remote_mode", "read-write", "ABICACHE_REMOTE_MODE"),
    ("build", "never", "ABICACHE_BUILD"),
])
def test_a_store_file_may_not_widen_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str,
                                          variable: str) -> None:
    """Even a store file of the user's own is the store's, and a shared store's is every
    member's: it may not set whom the store trusts, nor loosen what a hit checks. The
    refused key is named by `abicache config list` (exit 1) and changes nothing."""
    root = tmp_path / "store"
    Cache(root, remote=False).store.ensure()
    (root / "abicache.toml").write_text(f"{key} = {json.dumps(value)}\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("ABICACHE_DIR", str(root))
    if variable == "ABICACHE_DIR":
        monkeypatch.delenv("ABICACHE_DIR")
        (tmp_path / "xdg" / "abicache").mkdir(parents=True)
        settings_file.user_file().write_text(f"dir = {json.dumps(str(root))}\n")
    if variable == "ABICACHE_REMOTE_MODE":  # the user's own remote, which it only reads from
        (tmp_path / "xdg" / "abicache").mkdir(parents=True)
        settings_file.user_file().write_text(f'remote = "file://{tmp_path}/remote"\nremote_mode = "read"\n')
    assert config.lookup(variable)[1] != str(root / "abicache.toml")
    rc, out, err = _cli("config", "list", "--json")
    assert rc == 1, err
    refused = json.loads(out)["refused"]
    assert f"{root / 'abicache.toml'}: {key}" in refused


def test_a_store_file_may_tighten_and_set_the_stores_own_settings(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    Cache(root, remote=False).store.ensure()
    (root / "abicache.toml").write_text('verify_age = 60\nmax_size = "2G"\nremote_mode = "read"\nobserve = 1\n')
    (tmp_path / "xdg" / "abicache").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    settings_file.user_file().write_text('verify_age = 3600\nmax_size = "10G"\nobserve = 0\n')
    monkeypatch.setenv("ABICACHE_DIR", str(root))
    store = str(root / "abicache.toml")
    assert config.lookup("ABICACHE_VERIFY_AGE") == ("60", store)
    assert config.lookup("ABICACHE_MAX_SIZE") == ("2G", store)  # the store's own size cap comes first
    assert config.lookup("ABICACHE_REMOTE_MODE") == ("read", store)
    assert config.lookup("ABICACHE_OBSERVE") == ("1", store)  # the user turned it off; the store turns it on
    assert Cache(root, remote=False).verify_age == 60


def test_config_set_refuses_a_widening_value_in_the_store_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    monkeypatch.setenv("ABICACHE_DIR", str(root))
    Cache(root, remote=False).store.ensure()
    rc, _, err = _cli("config", "set", "shared", "users", "--store")
    assert rc == 2 and "may not widen" in err and not (root / "abicache.toml").exists()
    rc, _, err = _cli("config", "set", "verify_age", "99999999", "--store")
    assert rc == 2 and "only tighten" in err
    assert _cli("config", "set", "verify_age", "60", "--store")[0] == 0


@pytest.mark.parametrize("how", ["writable-by-others", "symlink", "other-owner"])
def test_a_user_file_others_could_write_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The user's own file may set everything, so it must be the user's alone: ignoring it
    would drop its trusted keys (a loosening), so it is an error naming the fix."""
    if how == "other-owner" and os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    folder = tmp_path / "xdg" / "abicache"
    folder.mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    real = tmp_path / "real.toml"
    real.write_text('max_size = "1G"\n')
    target = folder / "config.toml"
    if how == "symlink":
        target.symlink_to(real)
    else:
        os.replace(real, target)
        if how == "writable-by-others":
            target.chmod(0o666)
        else:
            os.chown(target, 65534, 65534)
    with pytest.raises(ConfigError, match="config.toml") as caught:
        config.lookup("ABICACHE_MAX_SIZE")
    assert "Fix:" in str(caught.value)


def test_a_user_file_group_writable_by_a_private_group_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """umask 002 with a group per user (the common default): the file is the user's alone."""
    import grp
    import pwd

    me = pwd.getpwuid(os.geteuid())
    try:
        private = grp.getgrgid(me.pw_gid).gr_name == me.pw_name and not grp.getgrgid(me.pw_gid).gr_mem
    except KeyError:
        private = False
    if not private:
        pytest.skip(f"{me.pw_name}'s primary group is not a private group of its own")
    folder = tmp_path / "xdg" / "abicache"
    folder.mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (folder / "config.toml").write_text('max_size = "1G"\n')
    (folder / "config.toml").chmod(0o664)
    assert config.lookup("ABICACHE_MAX_SIZE")[0] == "1G"


def test_sloppiness_and_check_in_the_users_file_take_effect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`abicache config list` listed them, but they were read from the environment only."""
    from abicache.frontends import check_spawn
    from abicache.engine import roots

    (tmp_path / "xdg" / "abicache").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    settings_file.user_file().write_text('sloppiness = "system_headers"\ncheck = 7\n')
    assert roots.sloppy_system_headers()
    assert check_spawn.every() == 7


# ---- high: ABICACHE_CHECK ran `python -m abicache check` in the caller's folder, without a cap ----------------

PLANTED_ARGPARSE = """
import os
open(os.environ["ABICACHE_TEST_PLANTED_MARK"], "w").close()
raise SystemExit("planted argparse ran")
"""
CALLER = """
import sys
from abicache import Cache, cc
cache = Cache(sys.argv[1], remote=False)
for _ in range(int(sys.argv[2])):  # build_library: each call looks the entry up (load_library memoizes)
    cc.build_library("add", ['extern "C" int add(int a, int b) { return a + b; }'], cache=cache)
"""


def _wait_for_checks(root: Path, timeout: float = 120) -> None:
    """Until no background check of this store holds its slot."""
    import fcntl
    import time

    deadline = time.monotonic() + timeout
    for slot in (root / "v3" / "locks" / "checks").glob("check-slot-*.lock"):
        with open(slot, "rb") as handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    assert time.monotonic() < deadline, "a background check still runs"
                    time.sleep(0.1)


def _checked(root: Path) -> list[dict]:
    log = root / "v3" / "log" / "check.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_background_check_never_imports_from_the_callers_folder(tmp_path: Path) -> None:
    """A module planted in the folder the caller runs from (a shared working folder) is
    not imported by the check process: it runs isolated, in a private folder."""
    import time

    shared = tmp_path / "shared work folder"
    shared.mkdir()
    (shared / "argparse.py").write_text(PLANTED_ARGPARSE)
    (shared / "json.py").write_text(PLANTED_ARGPARSE)
    root, mark = tmp_path / "store", tmp_path / "PLANTED-CODE-RAN"
    env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_TEST_PLANTED_MARK": str(mark), "ABICACHE_CHECK": "1"}
    # -P: the caller itself does not put its folder on sys.path (it is not what is tested)
    subprocess.run([sys.executable, "-P", "-c", CALLER, str(root), "2"], cwd=shared, env=env, check=True, timeout=120)
    deadline = time.monotonic() + 120
    while not _checked(root) and not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not mark.exists(), "the background check imported a module from the caller's folder"
    assert [v["verdict"] for v in _checked(root)] == ["same"]


def test_background_checks_are_bounded_per_store(tmp_path: Path) -> None:
    """30 hits with ABICACHE_CHECK=1 start one check while it runs, not 30 rebuilds at once."""
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_CHECK": "1"}
    subprocess.run([sys.executable, "-c", CALLER, str(root), "31"], env=env, check=True, timeout=120)
    _wait_for_checks(root)
    assert len(_checked(root)) == 1


def test_no_second_check_of_an_entry_while_one_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from abicache.frontends import check_spawn

    monkeypatch.setattr(check_spawn, "SLOTS", 3)
    cache = Cache(tmp_path / "store", remote=False)
    lib = cc.build_library("add", ['extern "C" int add(int a, int b) { return a + b; }'], cache=cache)
    assert check_spawn.start(cache, lib.key)
    assert not check_spawn.start(cache, lib.key)  # the same entry: skipped, though slots are free
    _wait_for_checks(cache.root)
    assert check_spawn.start(cache, lib.key)  # once it has finished, it may be checked again
    _wait_for_checks(cache.root)
    assert [v["verdict"] for v in _checked(cache.root)] == ["same", "same"]


# ---- high / medium: folder and HTTP remotes --------------------------------------------------------------------

ENTRY = {"extra": {"what": "a folder remote's entry"}}
FETCH = """
import json, sys, time, warnings
from abicache import Cache
warnings.simplefilter("ignore")
start = time.monotonic()
art = Cache(sys.argv[1], remote=sys.argv[2]).get_or_build("test", "e", {"extra": {"what": "a folder remote's entry"}},
                                                          lambda out: (out / "f.bin").write_bytes(b"built here"))
print(json.dumps({"origin": art.origin, "data": art.file("f.bin").read_text(), "seconds": time.monotonic() - start}))
"""


def _published(tmp_path: Path) -> tuple[str, Path]:
    """An entry published to a fresh folder remote; (its URL, its blob's path)."""
    from conftest import writer

    folder = tmp_path / "remote folder"
    url = f"file://{folder}"
    Cache(tmp_path / "publisher", remote=url).get_or_build("test", "e", ENTRY, writer({"f.bin": b"published"}))
    (blob,) = [p for p in folder.glob("v2/blobs/*/*") if not p.name.startswith(".")]
    return url, blob


def _fetch(tmp_path: Path, url: str, timeout: float = 60) -> dict:
    done = subprocess.run([sys.executable, "-c", FETCH, str(tmp_path / "reader"), url], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_REMOTE_TIMEOUT": "2"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_prune_of_a_folder_remote_keeps_entries_whose_blobs_are_there(tmp_path: Path) -> None:
    """The folder backend listed blob folders, not blob files: every manifest "named a blob
    the remote lacks", and prune deleted every entry."""
    from abicache.cli.program import main

    url, _ = _published(tmp_path)
    assert main(["remote", "prune", "--grace", "0s", "--root", str(tmp_path / "pruner"), "--remote", url]) == 0
    got = _fetch(tmp_path, url)
    assert got["origin"] == "remote" and got["data"] == "published", got


def test_prune_never_writes_through_a_link_in_the_marks_folder(tmp_path: Path) -> None:
    """A folder named like a digest among the blobs, a blob no manifest names, and links named
    like both digests in v2/gc/: the pruning user (often root) must create nothing outside."""
    from abicache.cli.program import main

    url, blob = _published(tmp_path)
    folder = Path(url.removeprefix("file://"))
    fake, orphan = "ab" * 32, "cd" * 32
    (folder / "v2" / "blobs" / "ab" / f"{fake}.zst").mkdir(parents=True)  # named like a blob
    (folder / "v2" / "blobs" / "cd").mkdir()
    (folder / "v2" / "blobs" / "cd" / f"{orphan}.zst").write_bytes(b"unnamed")
    (folder / "v2" / "gc").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    for sha in (fake, orphan):
        (folder / "v2" / "gc" / sha).symlink_to(outside / f"written-through-{sha[:2]}")
    assert main(["remote", "prune", "--grace", "1h", "--root", str(tmp_path / "pruner"), "--remote", url]) == 0
    assert list(outside.iterdir()) == []
    assert (folder / "v2" / "gc" / orphan).is_file() and not (folder / "v2" / "gc" / orphan).is_symlink()


@pytest.mark.parametrize("plant", ["fifo", "link-to-dev-zero"])
def test_a_special_file_at_a_blob_path_is_refused_within_the_timeout(tmp_path: Path, plant: str) -> None:
    """A FIFO at a blob's path hung every reader for ever (a plain open() of a FIFO waits for a
    writer); a link to /dev/zero was stopped by size alone. Both are refused at once."""
    url, blob = _published(tmp_path)
    blob.unlink()
    if plant == "fifo":
        os.mkfifo(blob)
    else:
        blob.symlink_to("/dev/zero")
    got = _fetch(tmp_path, url, timeout=60)
    assert got["origin"] == "built" and got["data"] == "built here" and got["seconds"] < 15, got


def test_a_hung_folder_call_is_bounded(tmp_path: Path) -> None:
    """A call on a hung mount cannot be interrupted: the caller stops waiting for it."""
    import threading
    import time

    from abicache.errors import RemoteError
    from abicache.remote.folder import bounded

    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(RemoteError, match="no answer in 0.5 s"):
        bounded(lambda: release.wait(30), 0.5, "listing a hung mount")
    release.set()
    assert time.monotonic() - start < 5


def test_an_http_remote_that_drips_its_headers_is_cut_off_at_the_timeout(tmp_path: Path) -> None:
    """A server that sends a byte every half second, status line and headers included: the
    socket's timeout restarts with every byte; the request's deadline does not."""
    import time

    from servers import drip_proxy, static_server

    url, _ = _published(tmp_path)
    folder = Path(url.removeprefix("file://"))
    path = folder.name.replace(" ", "%20")
    with static_server(str(folder.parent), "python") as (base, _):
        upstream = int(base.rsplit(":", 1)[1])
        with drip_proxy(upstream, 0.0) as port:  # the same path through the proxy, at speed: a hit
            assert _fetch(tmp_path / "fast", f"http://127.0.0.1:{port}/{path}")["origin"] == "remote"
        with drip_proxy(upstream, 0.5) as port:
            start = time.monotonic()
            got = _fetch(tmp_path / "slow", f"http://127.0.0.1:{port}/{path}", timeout=90)
            took = time.monotonic() - start
    assert got["origin"] == "built" and took < 20, (got, took)


# ---- medium: the observer was silently off under umask 002 and for a store path LD_PRELOAD splits ---------------


@pytest.mark.parametrize("umask, store", [(0o002, "store"), (0o022, "a store: with a space")],
                         ids=["umask-002", "space-and-colon"])
def test_the_observer_runs_whatever_the_umask_and_the_store_path(tmp_path: Path, umask: int, store: str) -> None:
    """Without the observer a header created in front of the one used is not seen, and the
    stale library is served: with it, the next lookup misses and builds the new value."""
    from test_fidelity import UNIT, fresh, header, write

    proj = tmp_path / "proj"
    write(proj / "src" / "x.cpp", UNIT)
    (proj / "first").mkdir()
    write(proj / "second" / "v.h", header(1))
    root, flags = tmp_path / store, ["-Ifirst", "-Isecond"]
    old = os.umask(umask)
    try:
        first = fresh(root, ["src/x.cpp"], cwd=proj, cflags=flags)
        write(proj / "first" / "v.h", header(2))
        second = fresh(root, ["src/x.cpp"], cwd=proj, cflags=flags)
    finally:
        os.umask(old)
    assert first["value"] == 1 and first["warnings"] == [], first
    assert second["value"] == 2, second


def test_env_and_doctor_say_whether_the_observer_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABICACHE_DIR", str(tmp_path / "store"))
    rc, out, err = _cli("env", "--json")
    assert json.loads(out)["observer"].startswith("on ("), (out, err)
    monkeypatch.setenv("ABICACHE_OBSERVE", "0")
    rc, out, _ = _cli("env", "--json")
    assert json.loads(out)["observer"] == "off: ABICACHE_OBSERVE=0"
    monkeypatch.delenv("ABICACHE_OBSERVE")
    (tmp_path / "nothing-here").mkdir()  # an empty folder: a path that does not exist is an error
    rc, out, _ = _cli("doctor", str(tmp_path / "nothing-here"), "--json")
    assert json.loads(out)["observer"].startswith("on (")


def test_an_observer_that_cannot_be_built_is_said_once(tmp_path: Path) -> None:
    import warnings

    from abicache.engine import observe

    observe._built.clear()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert observe.library(tmp_path / "tools", compiler=("false",)) is None
        assert observe.library(tmp_path / "tools", compiler=("false",)) is None
    observe._built.clear()
    assert len([w for w in said if "the observer (observe.c)" in str(w.message)]) == 1
    assert "compiling it with false failed" in str(said[0].message)


# ---- medium: read-only stores installed under umask 002 were refused whole, or chmod-ed in place ----------------


def _as_pip_leaves_it(store: Path, group: int | None = None) -> dict[str, int]:
    """Every folder and file group-writable, as pip leaves them under umask 002 (and chgrp'd
    to `group`); returns each path's mode, to show nothing was changed afterwards."""
    modes = {}
    for folder, dirs, files in os.walk(store):
        for path in [folder, *(os.path.join(folder, f) for f in files)]:
            if os.path.islink(path):
                continue
            if group is not None:
                os.chown(path, -1, group)
            os.chmod(path, os.stat(path).st_mode | stat.S_IWGRP | stat.S_IRGRP)
            modes[path] = os.stat(path).st_mode
    return modes


def _own_private_group() -> int | None:
    import grp
    import pwd

    me = pwd.getpwuid(os.geteuid())
    group = grp.getgrgid(me.pw_gid)
    return me.pw_gid if group.gr_name == me.pw_name and set(group.gr_mem) <= {me.pw_name} else None


def test_a_read_only_store_pip_installed_under_umask_002_serves_and_is_never_written(tmp_path: Path) -> None:
    from test_tiers import _build_into, _load

    if _own_private_group() is None:
        pytest.skip("this user's primary group is not a private group of its own")
    built = _build_into(tmp_path / "wheel store")
    modes = _as_pip_leaves_it(tmp_path / "wheel store")
    got = _load(tmp_path / "local", tmp_path, ABICACHE_READ_STORES=str(tmp_path / "wheel store"),
                ABICACHE_BUILD="never")
    assert got.get("origin") == "tier" and got["value"] == 42 and got["path"] == built["path"], got
    assert {p: os.stat(p).st_mode for p in modes} == modes, "a read-only store was written"


def test_a_read_only_store_others_may_write_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """Group-writable by a group with other members (not the owner's, not ABICACHE_SHARED's): refused,
    and, being read-only, not "repaired" either (it was chmod-ed to 0700 in place)."""
    import grp

    from test_tiers import _build_into, _load

    try:
        other = grp.getgrnam("users").gr_gid
    except KeyError:
        pytest.skip("no group 'users' here")
    if os.geteuid() != 0:
        pytest.skip("needs root to give the store to another group")
    _build_into(tmp_path / "wheel store")
    modes = _as_pip_leaves_it(tmp_path / "wheel store", group=other)
    os.chmod(tmp_path / "wheel store", 0o755)  # its root closed, v3/ and below left open
    modes[str(tmp_path / "wheel store")] = os.stat(tmp_path / "wheel store").st_mode
    got = _load(tmp_path / "local", tmp_path, ABICACHE_READ_STORES=str(tmp_path / "wheel store"),
                ABICACHE_BUILD="never")
    assert "error" in got and any("writable by group" in s for s in got["said"]), got
    assert {p: os.stat(p).st_mode for p in modes} == modes, "a read-only store was written"


# ---- medium: manifests kept in 252-byte names had no fallback where names are shorter (eCryptfs: 143) ------------

SHORT_NAMES = """
import json, sys
from abicache import Cache, cc
arts = [cc.build_library("add", ['extern "C" int add(int a, int b) { return a + b; }']) for _ in range(2)]
import ctypes
print(json.dumps({"origins": [a.origin for a in arts], "value": ctypes.CDLL(str(arts[0].file())).add(2, 40)}))
"""


@pytest.mark.parametrize("pathconf_says", ["143", "255"], ids=["probed", "the-filesystem-hides-it"])
def test_manifests_fall_back_to_the_file_where_names_are_short(tmp_path: Path, pathconf_says: str) -> None:
    """A real stand-in for eCryptfs (tests/fsfault.c, preloaded): names over 143 bytes fail with
    ENAMETOOLONG. Builds go on (the manifest as a file), and the next process hits."""
    from sharedfs import compile_fault_layer

    layer = compile_fault_layer(tmp_path)
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(SRC), "LD_PRELOAD": str(layer), "ABICACHE_FAULT_NAME_MAX": "143",
           "ABICACHE_DIR": str(root)}
    if pathconf_says == "255":  # a filesystem whose pathconf claims more than it takes: the write finds out
        env["ABICACHE_FAULT_PATHCONF"] = "255"
    runs = [subprocess.run([sys.executable, "-c", SHORT_NAMES, str(root)], capture_output=True, text=True, env=env,
                           timeout=120) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    got = [json.loads(r.stdout.splitlines()[-1]) for r in runs]
    assert got[0]["origins"][0] == "built" and got[0]["value"] == 42, got
    assert got[1]["origins"][0] == "local" and got[1]["value"] == 42, got
    assert list(root.glob("v3/entries/cc.library/*/*/manifest.json")), "the manifest was not kept as a file"


# ---- low: logs were never rotated, and a FIFO or link in log/ hung every miss or redirected appends ---------------


@pytest.mark.parametrize("plant", ["fifo", "symlink"])
def test_a_fifo_or_link_in_the_log_folder_neither_hangs_nor_redirects(tmp_path: Path, plant: str) -> None:
    root = tmp_path / "store"
    cache = Cache(root, remote=False)
    cache.store.ensure(writing=True)
    log = root / "v3" / "log" / "stats.jsonl"  # every process appends its counts at exit
    outside = tmp_path / "outside.jsonl"
    planted(log, plant, outside)
    code = ("import sys; from abicache import Cache; c = Cache(sys.argv[1], remote=False)\n"
            "c.get_or_build('t', 'x', {'extra': {}}, lambda out: (out / 'f').write_text('x'))")
    done = subprocess.run([sys.executable, "-c", code, str(root)], env={**os.environ, "PYTHONPATH": str(SRC)},
                          capture_output=True, text=True, timeout=60)  # a FIFO opened plainly waits for ever
    assert done.returncode == 0, done.stderr[-2000:]
    assert not outside.exists() or outside.read_text() == ""
    assert log.is_file() and not log.is_symlink() and '"misses": 1' in log.read_text()


def test_logs_are_bounded_and_stats_survive_rotation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from abicache.store import counters, logs

    monkeypatch.setattr(logs, "MAX_BYTES", 4000)
    cache = Cache(tmp_path / "store", remote=False)
    for n in range(400):
        counters.count(cache.store, hits_local=1, seconds_saved=0.5)
        counters.flush(cache.store)
        cache.store.log_event("remote-refused", json.dumps({"n": n, "why": "x" * 80}))
    folder = tmp_path / "store" / "v3" / "log"
    assert all(p.stat().st_size <= 4000 + 200 for p in folder.glob("*.jsonl")), \
        {p.name: p.stat().st_size for p in folder.glob("*.jsonl")}
    assert counters.totals(cache.store)["hits_local"] == 400
    assert counters.totals(cache.store)["seconds_saved"] == 200.0
    assert json.loads(cache.store.read_events("remote-refused")[-1])["n"] == 399


def test_a_read_only_store_in_a_venv_shared_by_the_users_group_serves(tmp_path: Path) -> None:
    """A group-shared venv (setgid, group-writable by its group): trusted where that group is
    the one the user named (ABICACHE_SHARED), as a shared store is."""
    import grp

    from test_tiers import _build_into, _load

    try:
        group = grp.getgrnam("users")
    except KeyError:
        pytest.skip("no group 'users' here")
    if os.geteuid() != 0:
        pytest.skip("needs root to give the store to another group")
    built = _build_into(tmp_path / "venv store")
    modes = _as_pip_leaves_it(tmp_path / "venv store", group=group.gr_gid)
    got = _load(tmp_path / "local", tmp_path, ABICACHE_READ_STORES=str(tmp_path / "venv store"),
                ABICACHE_BUILD="never", ABICACHE_SHARED="users")
    assert got.get("origin") == "tier" and got["path"] == built["path"], got
    assert {p: os.stat(p).st_mode for p in modes} == modes


def test_every_setting_config_list_shows_takes_effect_from_a_file_or_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_jobs was listed but read from the environment alone; dropin is read as every
    interpreter starts, before any file: refused from a file, with that reason."""
    from abicache.engine import pool

    (tmp_path / "xdg" / "abicache").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("MAX_JOBS", raising=False)
    settings_file.user_file().write_text('max_jobs = 3\ndropin = "torch"\n')
    assert pool.max_jobs() == 3
    assert config.lookup("ABICACHE_DROPIN") == (None, "default")
    rc, out, _ = _cli("config", "list", "--json")
    assert rc == 1 and "environment alone" in json.loads(out)["refused"][f"{settings_file.user_file()}: dropin"]
    rc, _, err = _cli("config", "set", "dropin", "torch")
    assert rc == 2 and "environment alone" in err


@HOSTILE
def test_the_observers_private_copy_is_never_one_another_user_planted(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy made for a store path LD_PRELOAD would split lives in a folder of the user's
    own under $XDG_RUNTIME_DIR or /tmp: one another user made there first, with a library at
    the copy's very name, is passed over, and its code never runs in a compiler."""
    from abicache.engine import observe
    from test_fidelity import UNIT, fresh, header, write

    mine = tmp_path / "runtime"
    mine.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(mine))
    observe._built.clear()
    copy = observe.library(tmp_path / "a store: with a space" / "tools")
    observe._built.clear()
    assert copy is not None and copy.parent.parent == mine
    public = hostile.public_dir()
    evil = hostile.evil_file(tmp_path)
    hostile.as_attacker("sh", "-c", f"mkdir -m 755 '{public / copy.parent.name}' && "
                                    f"cp '{evil}' '{public / copy.parent.name / copy.name}'")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(public))
    assert observe.library(tmp_path / "another store: with a space" / "tools").parent.parent != public
    observe._built.clear()
    proj, mark = tmp_path / "proj", tmp_path / "PLANTED-CODE-RAN"
    write(proj / "src" / "x.cpp", UNIT)
    write(proj / "inc" / "v.h", header(7))
    got = fresh(tmp_path / "third store: with a space", ["src/x.cpp"], cwd=proj, cflags=["-Iinc"],
                env={"XDG_RUNTIME_DIR": str(public), "ABICACHE_TEST_PLANTED_MARK": str(mark)})
    assert got["value"] == 7 and got["warnings"] == [] and not mark.exists(), got


@HOSTILE
def test_a_size_record_another_user_wrote_does_not_stop_the_cap(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """log/size (the size the last eviction measured) planted by another user with 0 bytes,
    fresh: believed, it would keep every build from evicting for a minute."""
    import time as clock

    from abicache.store import gc
    from conftest import writer

    root = tmp_path / "store"
    monkeypatch.setenv("ABICACHE_MAX_SIZE", "50K")
    cache = Cache(root, remote=False)
    cache.get_or_build("t", "k0", {"extra": {"n": 0}}, writer({"f": os.urandom(20_000)}))
    planted = cache.store.layout.log / "size"
    for owner, mode in ((hostile.ATTACKER, 0o644), (os.getuid(), 0o666)):
        planted.unlink(missing_ok=True)
        planted.write_text(f"0 {clock.time()}")
        os.chown(planted, owner, owner)
        planted.chmod(mode)
        for n in range(1, 5):
            cache.get_or_build("t", f"k{owner}-{n}", {"extra": {"n": f"{owner}-{n}"}},
                               writer({"f": os.urandom(20_000)}))
            assert gc.disk_usage(cache.store)[0] <= 50 * 1024, (owner, n)
        assert planted.stat().st_uid == os.getuid() and planted.stat().st_mode & 0o022 == 0  # ours again
