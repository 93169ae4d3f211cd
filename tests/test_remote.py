"""The remote tier against real servers on 127.0.0.1: SeaweedFS's S3 gateway and
redis-server with an ACL user over TLS (tests/servers.py). Two cache roots play
machine A and machine B."""

from __future__ import annotations

import ctypes
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

import pytest
import zstandard

import servers
from abicache import Cache, cc, remote as remote_mod
from abicache.errors import AbicacheWarning, ConfigError
from abicache.remote import keys
from abicache.store.verify import verify_store
from conftest import SRC, fixed_facts, need, writer
from remote_fixtures import Raw, redis_srv, remote, s3_endpoint  # noqa: F401  (fixtures)

ADD = 'extern "C" int add(int a, int b) { return a + b; }'
FILES = {"lib/kernel.bin": os.urandom(3000), "meta.json": '{"n": 1}', "empty": b""}


@pytest.fixture(autouse=True)
def _fresh_tier_state() -> None:
    remote_mod.reset()


def never(out: Path) -> None:
    raise AssertionError("machine B built although the remote had the entry")


def machines(tmp_path: Path, url: str, **kw: object) -> tuple[Cache, Cache]:
    return Cache(tmp_path / "A", remote=url, **kw), Cache(tmp_path / "B", remote=url, **kw)  # type: ignore[arg-type]


def quiet(fn: Callable[[], object]) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught if issubclass(w.category, AbicacheWarning)]


def entries(cache: Cache) -> list[Path]:
    return list(cache.store.iter_variant_dirs())


# ---- sharing -------------------------------------------------------------------


def test_b_loads_the_library_a_built_without_building(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    need("c++")
    url, raw = remote
    a, b = machines(tmp_path, url)
    built = cc.build_library("adder", [ADD], cache=a)
    assert built.origin == "built"
    assert raw.count_manifests() == 1
    got = cc.build_library("adder", [ADD], cache=b)
    assert got.origin == "remote" and got.hit
    assert got.key == built.key and got.manifest.created == built.manifest.created
    assert got.file().read_bytes() == built.file().read_bytes()
    assert ctypes.CDLL(str(got.file())).add(40, 2) == 42
    assert cc.build_library("adder", [ADD], cache=Cache(tmp_path / "B", remote=url)).origin == "local"


def test_a_multi_file_artifact_arrives_whole_with_modes(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, _ = remote
    a, b = machines(tmp_path, url)

    def build(out: Path) -> None:
        writer(FILES)(out)
        tool = out / "bin" / "tool"
        tool.parent.mkdir()
        tool.write_text("#!/bin/sh\necho hi\n")
        tool.chmod(0o755)

    built = a.get_or_build("test.multi", "multi", {"extra": {"v": 1}}, build)
    got = b.get_or_build("test.multi", "multi", {"extra": {"v": 1}}, never)
    assert got.origin == "remote"
    assert sorted(got.files) == sorted(built.files) == ["bin/tool", "empty", "lib/kernel.bin", "meta.json"]
    for name in got.files:
        assert (got.path / name).read_bytes() == (built.path / name).read_bytes()
    assert stat.S_IMODE((got.path / "bin/tool").stat().st_mode) == 0o555
    assert stat.S_IMODE((got.path / "meta.json").stat().st_mode) == 0o444
    assert subprocess.run([got.path / "bin/tool"], capture_output=True, text=True).stdout == "hi\n"
    assert verify_store(b.store, full=True).clean


def test_lookup_reads_through_and_identical_blobs_are_not_downloaded_twice(
        tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, _ = remote
    a, b = machines(tmp_path, url)
    a.get_or_build("test", "one", {"extra": {"v": 1}}, writer({"x.bin": b"same" * 1000}))
    a.get_or_build("test", "two", {"extra": {"v": 2}}, writer({"y.bin": b"same" * 1000}))
    assert b.lookup("test", "one", {"extra": {"v": 1}}).origin == "remote"
    before = b.remote.stats["bytes_down"]
    second = b.lookup("test", "two", {"extra": {"v": 2}})
    assert second.origin == "remote"
    assert b.remote.stats["bytes_down"] == before  # the blob was already in B's store: linked
    assert b.lookup("test", "three", {"extra": {"v": 3}}) is None


def test_the_variant_whose_requirements_hold_is_chosen(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, raw = remote
    inputs = {"extra": {"v": 1}}
    old = Cache(tmp_path / "A", remote=url, facts=fixed_facts(torch__version="2.9.0"))
    new = Cache(tmp_path / "B", remote=url, facts=fixed_facts(torch__version="2.10.0"))
    old.get_or_build("test", "op", inputs, writer({"op.so": b"for 2.9"}), ["torch.version==2.9.0"])
    built = new.get_or_build("test", "op", inputs, lambda out: (out / "op.so").write_bytes(b"for 2.10")
                             and ["torch.version==2.10.0"])
    assert built.origin == "built"  # 2.9's variant does not hold on B: nothing incompatible is loaded
    assert raw.count_manifests() == 2
    third = Cache(tmp_path / "C", remote=url, facts=fixed_facts(torch__version="2.10.0"))
    assert third.get_or_build("test", "op", inputs, never).file().read_bytes() == b"for 2.10"


def test_a_lost_publish_race_adopts_the_winners_files(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, raw = remote
    a, b = machines(tmp_path, url)
    inputs = {"extra": {"v": 1}}

    def b_build(out: Path) -> None:
        # While B builds, A builds and publishes the same key with different bytes.
        a.get_or_build("test", "racy", inputs, writer({"out.bin": b"A's bytes"}))
        (out / "out.bin").write_bytes(b"B's bytes")

    got = b.get_or_build("test", "racy", inputs, b_build)
    assert got.file().read_bytes() == b"A's bytes"
    assert b.remote.stats["lost_races"] == 1
    assert raw.count_manifests() == 1
    assert [json.loads(m)["files"]["out.bin"]["size"] for m in raw.manifests("test", got.key).values()] == [9]


# ---- failure policy --------------------------------------------------------------


WITHOUT_EXTRA = """
import sys, warnings
class _Missing:  # as a plain `pip install abicache`: the remote extra's clients are absent
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("redis", "obstore", "cryptography"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Missing())
from abicache import Cache
warnings.simplefilter("always")
c = Cache(sys.argv[1])
for n in range(3):
    art = c.get_or_build("test", f"k{n}", {"extra": {"n": n}}, lambda out: (out / "f").write_text("x"))
    assert art.origin == "built", art.origin
print("built 3")
"""


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "s3://bucket/p?endpoint=http://127.0.0.1:1",
                                 "redis://127.0.0.1:1/0?sign"])
def test_a_remote_without_its_client_library_warns_once_and_builds_locally(tmp_path: Path, url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_REMOTE": url.replace("?sign", "")}
    if url.endswith("?sign"):
        env["ABICACHE_TRUSTED_KEYS"] = "ed25519:" + "A" * 43 + "="
    done = subprocess.run([sys.executable, "-c", WITHOUT_EXTRA, str(tmp_path / "c")], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 0 and "built 3" in done.stdout, done.stderr
    assert done.stderr.count("pip install 'abicache[remote]'") == 1, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("scheme", ["s3", "redis"])
@pytest.mark.parametrize("fault", ["refused", "silent"])
def test_an_unreachable_remote_costs_one_bounded_wait_then_builds_locally(
        tmp_path: Path, scheme: str, fault: str) -> None:
    with servers.silent_server() as silent:
        port = silent if fault == "silent" else servers.refused_port()
        url = (f"s3://abicache-test/p?endpoint=http://127.0.0.1:{port}" if scheme == "s3"
               else f"redis://127.0.0.1:{port}/0")
        if scheme == "s3":
            pytest.importorskip("obstore")
        else:
            pytest.importorskip("redis")
        os.environ.update(servers.CREDENTIALS)
        cache = Cache(tmp_path / "A", remote=url)
        start = time.monotonic()
        art, said = quiet(lambda: cache.get_or_build("test", "x", {"extra": {"v": 1}}, writer({"f": b"1"})))
        first = time.monotonic() - start
        start = time.monotonic()
        again, said_again = quiet(lambda: cache.get_or_build("test", "y", {"extra": {"v": 2}}, writer({"f": b"2"})))
        second = time.monotonic() - start
    assert art.origin == "built" and again.origin == "built"
    assert first < 8.0, f"{fault} remote held the build for {first:.1f} s"
    assert second < 1.0, "a remote known to be down was tried again"
    assert len(said) == 1 and "skipping it for the rest of this process" in said[0], said
    assert said_again == []
    assert cache.remote.stats["errors"] == 1


def test_read_only_machines_never_upload(tmp_path: Path, remote: tuple[str, Raw], monkeypatch: pytest.MonkeyPatch) -> None:
    url, raw = remote
    monkeypatch.setenv("ABICACHE_REMOTE_MODE", "read")
    reader = Cache(tmp_path / "R", remote=url)
    assert reader.get_or_build("test", "x", {"extra": {}}, writer({"f": b"1"})).origin == "built"
    assert raw.count_manifests() == 0
    monkeypatch.delenv("ABICACHE_REMOTE_MODE")
    Cache(tmp_path / "W", remote=url).get_or_build("test", "x", {"extra": {}}, writer({"f": b"1"}))
    assert reader.get_or_build("test", "x", {"extra": {}}, never).origin == "local"
    assert Cache(tmp_path / "R2", remote=url).get_or_build("test", "x", {"extra": {}}, never).origin == "remote"


def test_bad_settings_are_clear_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown scheme"):
        Cache(tmp_path, remote="ftp://host/x")
    with pytest.raises(ConfigError, match="unknown option colour"):
        Cache(tmp_path, remote="s3://abicache-test/p?colour=blue")
    with pytest.raises(ConfigError, match="database number"):
        Cache(tmp_path, remote="redis://localhost:6379/cache")
    monkeypatch.setenv("ABICACHE_REMOTE_MODE", "sometimes")
    with pytest.raises(ConfigError, match="read-write"):
        Cache(tmp_path, remote="redis://localhost:6379/0")
    monkeypatch.delenv("ABICACHE_REMOTE_MODE")
    monkeypatch.setenv("ABICACHE_TRUSTED_KEYS", str(tmp_path / "missing.pub"))
    with pytest.raises(ConfigError, match="neither a key"):
        Cache(tmp_path, remote="redis://localhost:6379/0")
    monkeypatch.delenv("ABICACHE_TRUSTED_KEYS")
    assert "secret" not in str(remote_mod.RemoteSettings.from_env("redis://u:secret@h:1/0").url)


# ---- Redis as fleets run it ------------------------------------------------------


def _remote_warning(tmp_path: Path, url: str) -> tuple[object, list[str]]:
    cache = Cache(tmp_path / "W", remote=url)
    return quiet(lambda: cache.get_or_build("test", "w", {"extra": {"v": 1}}, writer({"f": b"local"})))


@pytest.mark.usefixtures("redis_srv")
def test_redis_acl_user_over_tls_shares_between_machines(tmp_path: Path, redis_srv: servers.RedisServer) -> None:
    url = redis_srv.url()
    assert url.startswith("rediss://abicache:") and "ca=" in url
    a, b = machines(tmp_path, url)
    built = a.get_or_build("test", "x", {"extra": {"v": 1}}, writer({"f": b"payload"}))
    got = b.get_or_build("test", "x", {"extra": {"v": 1}}, never)
    assert (built.origin, got.origin, got.file().read_bytes()) == ("built", "remote", b"payload")


@pytest.mark.parametrize("mistake, said", [
    ("wrong password", "check the user and password"),
    ("no CA file", "certificate verify failed"),
    ("plain text to a TLS port", "failed"),
])
def test_redis_credentials_and_tls_mistakes_are_named(tmp_path: Path, redis_srv: servers.RedisServer,
                                                      mistake: str, said: str) -> None:
    url = redis_srv.url("m")
    if mistake == "wrong password":
        url = url.replace(servers.REDIS_PASSWORD, "not-the-password")
    elif mistake == "no CA file":
        url = url.split("&ca=")[0]
    else:
        url = url.replace("rediss://", "redis://").split("&ca=")[0]
    start = time.monotonic()
    art, warned = _remote_warning(tmp_path, url)
    assert art.origin == "built" and time.monotonic() - start < 10  # fails open, bounded
    assert len(warned) == 1 and said in warned[0], warned
    assert servers.REDIS_PASSWORD not in warned[0] and "not-the-password" not in warned[0]


def test_an_acl_user_confined_to_its_prefix(tmp_path: Path) -> None:
    """Two fleets on one server, each user allowed only its own keys: each works
    under its prefix, and a user pointed at the other's prefix is refused by name."""
    why = servers.redis_available()
    if why:
        pytest.skip(why)
    acl = ["--user", "fleet-a", "on", ">pass-a", "~fleet-a:*", "+@all", "-@dangerous", "--user", "fleet-b", "on",
           ">pass-b", "~fleet-b:*", "+@all", "-@dangerous"]
    with servers.redis_server(auth=True, tls=False, extra=acl) as server:
        host = f"127.0.0.1:{server.port}"
        ok = f"redis://fleet-a:pass-a@{host}/0?prefix=fleet-a"
        a, b = machines(tmp_path, ok)
        a.get_or_build("test", "x", {"extra": {"v": 1}}, writer({"f": b"a"}))
        assert b.get_or_build("test", "x", {"extra": {"v": 1}}, never).origin == "remote"
        art, warned = _remote_warning(tmp_path, f"redis://fleet-a:pass-a@{host}/0?prefix=fleet-b")
        assert art.origin == "built"
        assert len(warned) == 1 and "ACL user may not" in warned[0] and "~fleet-b:*" in warned[0], warned


def _cluster_of_two() -> tuple[list[subprocess.Popen[bytes]], list[int], list[int], list[str]]:
    """Two cluster nodes (not yet joined): processes, client ports, bus ports, folders. The bus
    ports are chosen too: the default, port + 10000, may pass 65535."""
    ports = [servers.free_port(), servers.free_port()]
    buses = [servers.free_port(), servers.free_port()]
    folders = [tempfile.mkdtemp(prefix="abicache-cluster-") for _ in ports]
    procs = [subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                               "--appendonly", "no", "--dir", folder, "--cluster-enabled", "yes",
                               "--cluster-port", str(bus)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for port, bus, folder in zip(ports, buses, folders)]
    return procs, ports, buses, folders


def test_a_redis_cluster_is_refused_with_the_reason(tmp_path: Path) -> None:
    why = servers.redis_available()
    if why:
        pytest.skip(why)
    import shutil

    import redis

    procs, ports, buses, folders = _cluster_of_two()
    try:
        nodes = []
        for proc, port in zip(procs, ports):
            servers._wait_for(port, proc, "redis-server (cluster node)")
            nodes.append(redis.Redis(host="127.0.0.1", port=port))
        nodes[0].execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 8191)
        nodes[1].execute_command("CLUSTER", "ADDSLOTSRANGE", 8192, 16383)
        nodes[0].execute_command("CLUSTER", "MEET", "127.0.0.1", ports[1], buses[1])
        deadline = time.monotonic() + 20
        while any(n.execute_command("CLUSTER", "INFO").decode().find("cluster_state:ok") < 0 for n in nodes):
            assert time.monotonic() < deadline, "the two-node cluster did not form"
            time.sleep(0.1)
        warned: list[str] = []
        for i in range(12):  # keys hash to either node: some land on the other one
            remote_mod.reset()
            _, said = quiet(lambda: Cache(tmp_path / f"c{i}", remote=f"redis://127.0.0.1:{ports[0]}/0?prefix=p{i}")
                            .get_or_build("test", f"k{i}", {"extra": {"v": i}}, writer({"f": b"x"})))
            warned += said
        assert any("Redis Cluster" in w and "standalone" in w for w in warned), warned
    finally:
        for proc in procs:
            servers._stop(proc)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


# ---- untrusted content -------------------------------------------------------------


def _published(tmp_path: Path, url: str, **kw: object) -> tuple[Cache, object]:
    a = Cache(tmp_path / "A", remote=url, **kw)  # type: ignore[arg-type]
    art = a.get_or_build("test", "victim", {"extra": {"v": 1}}, writer({"lib.so": b"genuine" * 100}))
    return a, art


def _refused(tmp_path: Path, url: str, match: str, **kw: object) -> Cache:
    b = Cache(tmp_path / "B", remote=url, **kw)  # type: ignore[arg-type]
    start = time.monotonic()
    art, said = quiet(lambda: b.get_or_build("test", "victim", {"extra": {"v": 1}}, writer({"lib.so": b"local"})))
    assert time.monotonic() - start < 8.0
    assert art.origin == "built" and art.file().read_bytes() == b"local"
    assert any(match in s for s in said), said
    assert b.remote.stats["refused"] >= 1
    logged = (b.store.layout.log / "remote-refused.jsonl").read_text()
    assert match in logged
    assert verify_store(b.store, full=True).clean
    assert [m.read_bytes() for m in b.store.layout.blobs.rglob("*") if m.is_file()] == [b"local"]
    return b


@pytest.mark.parametrize("damage", ["altered", "truncated", "extended", "missing", "not a frame", "a bomb",
                                    "a file where the frame belongs"])
def test_a_damaged_blob_never_enters_the_store(tmp_path: Path, remote: tuple[str, Raw], damage: str) -> None:
    """The blob is a zstd frame (remote/packed.py): of other bytes, of too few or too many, no
    frame at all, a few KiB that inflate to 64 MiB for a file of 700 bytes (a bomb: cut at byte
    701, never inflated whole), or the file itself stored where its frame belongs: each refused."""
    url, raw = remote
    _, art = _published(tmp_path, url)
    sha = art.manifest.files[0].sha256
    good = art.file().read_bytes()
    raw.delete_blob(sha)
    if damage == "not a frame":
        raw.put_blob(sha, good, frame=b"(\xb5/\xfd" + good)  # zstd's magic, then no frame
    elif damage == "a file where the frame belongs":
        raw.put_blob(sha, good, frame=good)
    elif damage != "missing":
        raw.put_blob(sha, {"altered": b"X" + good[1:], "truncated": good[:-10], "extended": good + b"!",
                           "a bomb": bytes(64 << 20)}[damage])
    match = {"altered": "altered", "truncated": "got 690 of 700", "extended": "longer than",
             "missing": "missing on the remote", "not a frame": "not a zstd frame", "a bomb": "longer than",
             "a file where the frame belongs": "not a zstd frame"}[damage]
    _refused(tmp_path, url, match)


def test_blobs_move_packed(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    """A published blob is stored as a zstd frame under <sha256>.zst, the layout v2's only name
    (an abicache of v1 never meets it); a fetch moves the frame and verifies the file's bytes;
    random bytes, which do not pack, are a frame too and arrive whole."""
    url, raw = remote
    data = b"".join(b"%08d: a library's bytes repeat a lot\n" % i for i in range(20_000))
    a = Cache(tmp_path / "A", remote=url)
    art = a.get_or_build("test", "packed", {"extra": {}}, writer({"lib.so": data}))
    sha = art.manifest.files[0].sha256
    assert raw.blob_names() == [sha + ".zst"]
    b = Cache(tmp_path / "B", remote=url)
    stats = b.remote.stats  # the process's, for this remote: A's upload counted too
    assert 0 < stats["bytes_up"] < len(data) // 4
    got = b.get_or_build("test", "packed", {"extra": {}}, never)
    assert got.origin == "remote" and got.file().read_bytes() == data
    assert stats["bytes_down"] == stats["bytes_up"]  # the frame moved, not the file

    noise = os.urandom(50_000)
    Cache(tmp_path / "A", remote=url).get_or_build("test", "noise", {"extra": {}}, writer({"lib.so": noise}))
    got = Cache(tmp_path / "C", remote=url).get_or_build("test", "noise", {"extra": {}}, never)
    assert got.origin == "remote" and got.file().read_bytes() == noise
    assert len(raw.blob_names()) == 2 and all(n.endswith(".zst") for n in raw.blob_names())


def test_a_manifest_with_altered_requirements_is_refused(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, raw = remote
    _, art = _published(tmp_path, url)
    doc = json.loads(raw.manifests("test", art.key)[art.variant])
    doc["requirements"] = ["platform.os==linux"]  # widen where it may load
    raw.put_manifest("test", art.key, art.variant, json.dumps(doc).encode())
    _refused(tmp_path, url, "requirements were altered")


def test_a_manifest_naming_parent_paths_is_refused(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, raw = remote
    _, art = _published(tmp_path, url)
    doc = json.loads(raw.manifests("test", art.key)[art.variant])
    doc["files"] = {"../../../escape.so": doc["files"]["lib.so"]}
    raw.put_manifest("test", art.key, art.variant, json.dumps(doc).encode())
    _refused(tmp_path, url, "'..' part")
    assert not (tmp_path / "escape.so").exists() and not list(tmp_path.rglob("escape.so"))


def test_a_manifest_that_is_not_json_is_refused(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, raw = remote
    _, art = _published(tmp_path, url)
    raw.put_manifest("test", art.key, art.variant, b"\x00garbage{")
    _refused(tmp_path, url, "not valid JSON")


# ---- signing -----------------------------------------------------------------------


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path]:
    key = tmp_path / "keys" / "ci.key"
    key.parent.mkdir()
    keys.write_pair(key)
    return key, key.with_name("ci.key.pub")


def _publish_signed_then_trust(tmp_path: Path, url: str, keypair: tuple[Path, Path],
                               monkeypatch: pytest.MonkeyPatch) -> object:
    """Machine A (CI) publishes with the private key; later caches are the fleet, trusting its public key."""
    monkeypatch.setenv("ABICACHE_SIGNING_KEY", str(keypair[0]))
    _, art = _published(tmp_path, url)
    monkeypatch.delenv("ABICACHE_SIGNING_KEY")
    monkeypatch.setenv("ABICACHE_TRUSTED_KEYS", str(keypair[1]))
    return art


def test_signed_manifests_are_accepted_by_trusting_machines(
        tmp_path: Path, remote: tuple[str, Raw], keypair: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, raw = remote
    art = _publish_signed_then_trust(tmp_path, url, keypair, monkeypatch)
    got = Cache(tmp_path / "B", remote=url).get_or_build("test", "victim", {"extra": {"v": 1}}, never)
    assert got.origin == "remote" and got.manifest.signature.startswith("ed25519:")
    stored = json.loads(raw.manifests("test", art.key)[art.variant])
    assert stored["signature"] == got.manifest.signature


def test_a_recorded_path_with_a_backslash_is_signed_and_fetched(
        tmp_path: Path, remote: tuple[str, Raw], keypair: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A backslash is an ordinary file name character on POSIX: a header named so is recorded,
    signed, published and checked on the other machine (signing raised on it)."""
    import hashlib

    from abicache.core.cache import BuildResult
    from abicache.store.manifest import Dependency

    url, _ = remote
    header = tmp_path / "inc" / "odd\\name.h"
    header.parent.mkdir()
    header.write_text("#define X 1\n")
    dep = Dependency("abs", str(header), hashlib.sha256(header.read_bytes()).hexdigest())

    def build(out: Path) -> BuildResult:
        (out / "lib.so").write_bytes(b"genuine")
        return BuildResult(deps=[dep])

    monkeypatch.setenv("ABICACHE_SIGNING_KEY", str(keypair[0]))
    monkeypatch.setenv("ABICACHE_TRUSTED_KEYS", str(keypair[1]))
    a = Cache(tmp_path / "A", remote=url)
    assert a.get_or_build("test", "odd", {"extra": {}}, build).manifest.deps == (dep,)
    got = Cache(tmp_path / "B", remote=url).get_or_build("test", "odd", {"extra": {}}, never)
    assert got.origin == "remote" and got.manifest.deps == (dep,)


def test_unsigned_manifests_are_refused_where_keys_are_trusted(
        tmp_path: Path, remote: tuple[str, Raw], keypair: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, raw = remote
    _published(tmp_path, url)
    monkeypatch.setenv("ABICACHE_TRUSTED_KEYS", str(keypair[1]))
    b = _refused(tmp_path, url, "unsigned")
    assert not b.remote.writable  # it cannot sign, so it does not upload what others would refuse
    assert raw.count_manifests() == 1


def test_a_tampered_signed_manifest_is_refused(
        tmp_path: Path, remote: tuple[str, Raw], keypair: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, raw = remote
    art = _publish_signed_then_trust(tmp_path, url, keypair, monkeypatch)
    a2 = Cache(tmp_path / "A2", remote=False)
    evil = a2.get_or_build("test", "evil", {}, writer({"lib.so": b"evil code"}))
    raw.put_blob(evil.manifest.files[0].sha256, b"evil code")
    doc = json.loads(raw.manifests("test", art.key)[art.variant])
    doc["files"]["lib.so"].update(sha256=evil.manifest.files[0].sha256, size=9)  # hashes match: only the signature can tell
    raw.put_manifest("test", art.key, art.variant, json.dumps(doc).encode())
    _refused(tmp_path, url, "tampered")


def test_a_signature_by_an_untrusted_key_is_refused(
        tmp_path: Path, remote: tuple[str, Raw], keypair: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = remote
    monkeypatch.setenv("ABICACHE_SIGNING_KEY", str(keypair[0]))
    _published(tmp_path, url)
    other = tmp_path / "other.key"
    public = keys.write_pair(other)
    monkeypatch.setenv("ABICACHE_TRUSTED_KEYS", str(public))  # inline form
    _refused(tmp_path, url, "not in ABICACHE_TRUSTED_KEYS")


def test_signatures_survive_a_json_round_trip() -> None:
    pem, public = keys.generate()
    path = Path(os.environ["ABICACHE_DIR"]).parent / "k.pem"
    path.write_bytes(pem)
    signer = keys.load_signer(path)
    from abicache.values.requirements import Requirements
    from abicache.store.manifest import FileRecord, Manifest, parse, variant_id

    reqs = Requirements.of(["python.abi==cp311"])
    m = Manifest(key="a" * 64, variant=variant_id(reqs), kind="k", name="n",
                 files=(FileRecord("f", "b" * 64, 1, 0o444),), requirements=reqs,
                 inputs={"z": [1, 2], "a": {"b": 1.5}}, created=1, build_seconds=0)
    signed = signer.sign(m)
    assert keys.check(parse(signed.dumps()), (public,)) is None
    assert "tampered" in keys.check(parse(signed._replace(name="m").dumps()), (public,))
    assert "unsigned" in keys.check(m, (public,))


# ---- concurrency -------------------------------------------------------------------

RACER = r"""
import hashlib, os, sys, time, json
from pathlib import Path
import abicache
root, url, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
time.sleep(max(0.0, start - time.time()))
def build(out: Path) -> None:
    time.sleep(0.2)
    (out / "lib.so").write_bytes(os.urandom(50_000))  # every build differs: only one may win
    (out / "sub").mkdir()
    (out / "sub" / "pid.txt").write_text(str(os.getpid()))
art = abicache.Cache(root, remote=url).get_or_build("test.race", "race", {"extra": {"v": 1}}, build)
print(json.dumps({f: hashlib.sha256((art.path / f).read_bytes()).hexdigest() for f in art.files}))
"""


def test_eight_processes_on_two_roots_agree_on_one_published_entry(
        tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, raw = remote
    env = {**os.environ, "PYTHONPATH": str(SRC), **servers.CREDENTIALS}
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path / ("A" if i % 2 else "B")), url,
                               str(start)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(8)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    results = {out.strip() for out, _ in outs}
    assert len(results) == 1, results  # identical files everywhere
    assert raw.count_manifests() == 1
    (vdir,) = Cache(tmp_path / "A", remote=False).store.iter_variant_dirs()
    (published,) = raw.manifests("test.race", vdir.name.partition(".")[0]).values()
    files = json.loads(published)["files"]
    assert {name: f["sha256"] for name, f in files.items()} == json.loads(results.pop())


# ---- large transfers, import weight, CLI -----------------------------------------------


def test_a_large_artifact_shows_progress_and_arrives_intact(
        tmp_path: Path, remote: tuple[str, Raw], monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    url, _ = remote
    big = os.urandom(40 << 20)
    a, b = machines(tmp_path, url)
    monkeypatch.setenv("ABICACHE_PROGRESS", "1")
    a.get_or_build("test", "big", {}, writer({"big.bin": big}))
    got = b.get_or_build("test", "big", {}, never)
    err = capfd.readouterr().err
    assert "uploading big.bin" in err and "downloading big.bin" in err and "100%" in err
    assert got.file().read_bytes() == big


def test_remote_clients_load_only_on_a_miss(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, _ = remote
    Cache(tmp_path / "A", remote=url).get_or_build("test", "x", {}, writer({"f": b"1"}))
    code = (
        "import sys, abicache\n"
        "heavy = ('obstore', 'redis', 'cryptography', 'boto3')\n"
        "assert not [m for m in heavy if m in sys.modules], 'import'\n"
        f"c = abicache.Cache({str(tmp_path / 'A')!r})\n"
        "c.get_or_build('test', 'x', {}, lambda out: 1/0)\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_REMOTE": url, **servers.CREDENTIALS}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"  # a local hit with a remote configured touches no client


def test_cli_push_pull_remote_keys(tmp_path: Path, remote: tuple[str, Raw],
                                   monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from abicache.cli.program import main

    url, raw = remote

    def run(*argv: str) -> tuple[int, object]:
        code = main(list(argv))
        out = capsys.readouterr().out
        return code, (json.loads(out) if "--json" in argv else out)

    key = tmp_path / "ci.key"
    code, doc = run("keys", "generate", str(key), "--json")
    assert code == 0 and key.stat().st_mode & 0o077 == 0 and doc["public_key"].startswith("ed25519:")
    assert main(["keys", "generate", str(key)]) == 2  # never overwrites a key
    monkeypatch.setenv("ABICACHE_SIGNING_KEY", str(key))
    monkeypatch.setenv("ABICACHE_TRUSTED_KEYS", doc["public_key"])
    code, shown = run("keys", "show", "--json")
    assert shown["signing_key_id"] == doc["key_id"] == shown["trusted"][0]["key_id"]

    ci = Cache(tmp_path / "CI", remote=False)
    for n in range(3):
        ci.get_or_build("test", f"k{n}", {"extra": {"n": n}}, writer({"f.bin": os.urandom(100)}))
    code, pushed = run("push", "--root", str(tmp_path / "CI"), "--remote", url, "--json")
    assert code == 0 and [e["result"] for e in pushed["entries"]] == ["uploaded"] * 3
    assert raw.count_manifests() == 3
    code, again = run("push", "--root", str(tmp_path / "CI"), "--remote", url, "--json")
    assert [e["result"] for e in again["entries"]] == ["present"] * 3

    code, pulled = run("pull", "--root", str(tmp_path / "node"), "--remote", url, "--kind", "test", "--json")
    assert code == 0 and sorted(e["name"] for e in pulled["entries"] if e["result"] == "fetched") == ["k0", "k1", "k2"]
    node = Cache(tmp_path / "node", remote=False)
    assert node.get_or_build("test", "k1", {"extra": {"n": 1}}, never).origin == "local"
    code, pulled = run("pull", "--root", str(tmp_path / "node"), "--remote", url, "--json")
    assert pulled["entries"] == []  # everything usable is already here

    code, status = run("remote", "--remote", url, "--root", str(tmp_path / "node"), "--json")
    assert code == 0 and status["reachable"] and status["writable"]
    with pytest.warns(AbicacheWarning, match="skipping it"):
        code, text = run("remote", "--remote", f"redis://127.0.0.1:{servers.refused_port()}/0",
                         "--root", str(tmp_path / "node"))
    assert code == 1 and "reachable" in text


def test_pull_reports_refusals_once_per_kind_in_its_own_words(tmp_path: Path, remote: tuple[str, Raw],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Unsigned entries pulled where keys are trusted: each row says why, one summary line per
    kind of refusal, and no warning in Python's file:line format (it printed 13, named '?')."""
    from abicache.cli.program import main

    url, _ = remote
    ci = Cache(tmp_path / "CI", remote=False)
    for n in range(3):
        ci.get_or_build("test", f"u{n}", {"extra": {"n": n}}, writer({"f.bin": os.urandom(64)}))
    assert main(["push", "--root", str(tmp_path / "CI"), "--remote", url]) == 0
    capsys.readouterr()
    key = tmp_path / "node.key"
    assert main(["keys", "generate", str(key), "--json"]) == 0
    monkeypatch.setenv("ABICACHE_TRUSTED_KEYS", json.loads(capsys.readouterr().out)["public_key"])
    assert main(["pull", "--root", str(tmp_path / "node"), "--remote", url, "--kind", "test"]) == 1
    said = capsys.readouterr()
    assert "AbicacheWarning" not in said.err and " ? " not in said.out
    summary = [line for line in said.out.splitlines() if line.startswith("refused ")]
    assert len(summary) == 1 and summary[0].startswith("refused 3 entries: remote manifest ")
    assert main(["pull", "--root", str(tmp_path / "node"), "--remote", url, "--kind", "test", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)["entries"]
    assert [r["result"] for r in rows] == ["refused"] * 3 and all("signature" in r["why"] or "sign" in r["why"]
                                                                for r in rows)


# ---- fleet maintenance: parallel transfers, stats, prune ------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    from abicache.cli.program import main

    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_parallel_push_and_pull_move_every_entry_once(tmp_path: Path, remote: tuple[str, Raw],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    url, raw = remote
    ci = Cache(tmp_path / "CI", remote=False)
    payloads = {n: os.urandom(5000 + n) for n in range(24)}
    for n, data in payloads.items():
        ci.get_or_build("test", f"k{n}", {"extra": {"n": n}}, writer({"f.bin": data, "shared.txt": b"same"}))
    code, pushed = _cli(capsys, "push", "--root", str(tmp_path / "CI"), "--remote", url, "--jobs", "6")
    assert code == 0 and sorted(e["result"] for e in pushed["entries"]) == ["uploaded"] * 24
    assert raw.count_manifests() == 24
    code, pulled = _cli(capsys, "pull", "--root", str(tmp_path / "node"), "--remote", url, "-j", "6")
    assert code == 0 and sorted(e["name"] for e in pulled["entries"]) == sorted(f"k{n}" for n in payloads)
    node = Cache(tmp_path / "node", remote=False)
    for n, data in payloads.items():
        got = node.get_or_build("test", f"k{n}", {"extra": {"n": n}}, never)
        assert got.file("f.bin").read_bytes() == data
    assert verify_store(node.store, full=True).clean
    from abicache.cli.program import main

    with pytest.raises(SystemExit):  # argparse's usage error
        main(["push", "--jobs", "0"])


def test_remote_stats_and_prune_by_age_size_and_broken_entries(tmp_path: Path, remote: tuple[str, Raw],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    url, raw = remote
    a = Cache(tmp_path / "A", remote=url)
    arts = [a.get_or_build("test", f"k{n}", {"extra": {"n": n}}, writer({"f.bin": os.urandom(1000 * (n + 1))}))
            for n in range(4)]
    root = ["--root", str(tmp_path / "A"), "--remote", url]
    code, stats = _cli(capsys, "remote", "stats", *root)
    assert code == 0 and (stats["entries"], stats["variants"], stats["blobs"]) == (4, 4, 4)
    assert 10000 < stats["blob_bytes"] < 10000 + 4 * 64  # random bytes: each frame a little longer than its file
    assert stats["unreferenced_blobs"] == 0 and stats["broken_entries"] == 0

    raw.delete_blob(arts[0].manifest.files[0].sha256)  # k0 is now broken: a fetch of it fails
    raw.put_blob("ab" * 32, b"orphan")  # a blob no manifest names (an interrupted publish)
    code, plan = _cli(capsys, "remote", "prune", "--dry-run", "--max-size", "6999", *root)
    assert code == 0 and plan["dry_run"]
    assert sorted((e["name"], e["why"].split()[0]) for e in plan["deleted_entries"]) == \
        [("k0", "names"), ("k1", "oldest"), ("k2", "oldest")]
    assert _cli(capsys, "remote", "stats", *root)[1]["variants"] == 4  # a dry run changes nothing

    code, done = _cli(capsys, "remote", "prune", "--max-age", "365d", *root)  # only the broken one goes
    assert [e["name"] for e in done["deleted_entries"]] == ["k0"] and done["deleted_blobs"] == 0
    assert done["marked_blobs"] == 1  # the orphan: marked now, deleted after the grace period
    code, done = _cli(capsys, "remote", "prune", *root)  # within the grace: kept
    assert done["deleted_blobs"] == 0
    code, done = _cli(capsys, "remote", "prune", "--grace", "0s", "--max-size", "6999", *root)
    assert sorted(e["name"] for e in done["deleted_entries"]) == ["k1", "k2"]  # oldest first until at most 6999
    assert done["deleted_blobs"] == 1 and done["freed_bytes"] == len(zstandard.ZstdCompressor(level=3).compress(b"orphan"))
    code, stats = _cli(capsys, "remote", "stats", *root)
    assert (stats["variants"], stats["marked_blobs"]) == (1, 2)  # k1's and k2's blobs wait out their grace
    code, done = _cli(capsys, "remote", "prune", "--grace", "0s", *root)
    assert done["deleted_blobs"] == 2
    code, stats = _cli(capsys, "remote", "stats", *root)
    assert (stats["variants"], stats["blobs"], stats["unreferenced_blobs"], stats["marked_blobs"]) == (1, 1, 0, 0)
    b = Cache(tmp_path / "B", remote=url)  # what is left still serves
    assert b.get_or_build("test", "k3", {"extra": {"n": 3}}, never).origin == "remote"


def test_the_layout_is_v2_and_an_abicache_of_v1_neither_reads_nor_prunes_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A v1 tree (raw blobs, as abicache wrote before) beside the v2 one: this abicache
    publishes, reads and prunes only v2/, and leaves v1/ as it was (an older abicache's prune
    of v1 would have deleted every entry whose blob it found missing: packed ones)."""
    folder = tmp_path / "remote"
    url = f"file://{folder}"
    old = folder / "v1" / "entries" / "test" / ("ab" * 32)
    old.mkdir(parents=True)
    (old / ("cd" * 8)).write_bytes(b"{}")
    (folder / "v1" / "blobs" / "ef").mkdir(parents=True)
    (folder / "v1" / "blobs" / "ef" / ("ef" * 32)).write_bytes(b"old")
    before = sorted(p.relative_to(folder) for p in (folder / "v1").rglob("*"))
    a = Cache(tmp_path / "A", remote=url)
    a.get_or_build("test", "new", {"extra": {}}, writer({"f.bin": b"new bytes " * 100}))
    assert sorted(p.name for p in folder.iterdir()) == ["v1", "v2"]
    assert list((folder / "v2" / "blobs").rglob("*.zst"))
    root = ["--root", str(tmp_path / "A"), "--remote", url]
    code, stats = _cli(capsys, "remote", "stats", *root)
    assert (stats["entries"], stats["blobs"]) == (1, 1)  # v2's only
    assert _cli(capsys, "remote", "prune", "--grace", "0s", *root)[0] == 0
    assert sorted(p.relative_to(folder) for p in (folder / "v1").rglob("*")) == before


def test_a_blob_named_again_loses_its_mark(tmp_path: Path, remote: tuple[str, Raw],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A prune marks a blob that a publish in flight has uploaded but not yet named; the
    manifest lands; the next prune, past the grace, keeps the blob and clears its mark."""
    url, raw = remote
    data = os.urandom(3000)
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    raw.put_blob(sha, data)  # the publisher's blob, its manifest not yet written
    root = ["--root", str(tmp_path / "A"), "--remote", url]
    assert _cli(capsys, "remote", "prune", *root)[1]["marked_blobs"] == 1
    Cache(tmp_path / "A", remote=url).get_or_build("test", "late", {"extra": {}}, writer({"f.bin": data}))
    code, done = _cli(capsys, "remote", "prune", "--grace", "0s", *root)
    assert (done["deleted_blobs"], done["unmarked_blobs"]) == (0, 1)
    assert Cache(tmp_path / "B", remote=url).get_or_build("test", "late", {"extra": {}}, never).origin == "remote"


def test_a_key_flooded_with_variants_costs_one_bounded_lookup(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    """Anyone who can write the remote can file junk variants under a key: a lookup reads
    at most ABICACHE_REMOTE_LOOKUP_BYTES of them, one at a time, and says so once."""
    from abicache.shipping.replicate import refusal_count

    url, raw = remote
    genuine = Cache(tmp_path / "A", remote=url).get_or_build("test", "victim", {"extra": {"v": 1}},
                                                            writer({"lib.so": b"genuine"}))
    junk = b"{" + b" " * 200_000 + b"}"
    for i in range(300):
        raw.put_manifest("test", genuine.key, f"{i:016x}", junk)  # variant names as the store makes them
    b = Cache(tmp_path / "B", remote=url)
    backend = b.remote.backend()
    real, read = backend.read_manifest, []

    def counting(kind: str, key: str, variant: str, limit: int) -> bytes | None:
        got = real(kind, key, variant, limit)
        read.append(len(got or b""))
        return got

    backend.read_manifest = counting  # type: ignore[method-assign]
    built = []
    art, said = quiet(lambda: b.get_or_build("test", "victim", {"extra": {"v": 1}},
                                             lambda out: built.append(writer({"lib.so": b"genuine"})(out))))
    assert art.file("lib.so").read_bytes() == b"genuine" and len(built) <= 1
    assert sum(read) <= b.remote.settings.lookup_bytes + 4096  # and the winner's manifest, if B published
    assert len(read) <= b.remote.settings.max_variants + 1
    assert len([w for w in said if "refused" in w]) == 1, said
    assert refusal_count(b.store) >= len(read) - 1  # one log line counts them all
    assert len(b.store.read_events("remote-refused")) == 1


def _prune_planned(url: str, root: Path) -> tuple[object, object, object]:
    """A prune stopped between its listing and its deletions (grace 0: marked blobs go)."""
    from abicache.remote import prune

    backend = Cache(root, remote=url).remote.backend()
    inv = prune.inventory(backend)
    return backend, inv, prune.plan(inv, now=time.time(), grace=0.0)


@pytest.mark.parametrize("when", ["after-the-manifest", "before-the-recheck"])
def test_a_prune_during_a_publish_never_leaves_a_broken_entry(tmp_path: Path, remote: tuple[str, Raw],
                                                              capsys: pytest.CaptureFixture[str],
                                                              when: str) -> None:
    """A blob left unnamed (its entry pruned) and marked; a prune lists, then a machine
    publishes an entry reusing that blob, then the prune deletes it: the entry must end
    whole or absent, never named but broken for the read-only machines."""
    from abicache.remote import prune

    url, raw = remote
    data = os.urandom(3000)
    first = Cache(tmp_path / "A", remote=url).get_or_build("test", "old", {"extra": {}}, writer({"f.bin": data}))
    raw_backend = Cache(tmp_path / "A", remote=url).remote.backend()
    raw_backend.delete_manifest("test", first.key, first.variant)  # its entry pruned: the blob is unnamed
    root = ["--root", str(tmp_path / "P"), "--remote", url]
    assert _cli(capsys, "remote", "prune", *root)[1]["marked_blobs"] == 1
    backend, inv, todo = _prune_planned(url, tmp_path / "P")
    assert len(todo.delete_blobs) == 1  # the prune will delete it
    publisher = Cache(tmp_path / "C", remote=url)
    if when == "after-the-manifest":  # the prune deletes between the publisher's manifest and its re-check
        real = publisher.remote.backend().put_manifest

        def put_then_prune(*args: object) -> bool:
            done = real(*args)
            prune.apply(backend, todo, inv)
            return done

        publisher.remote.backend().put_manifest = put_then_prune  # type: ignore[method-assign]
        publisher.get_or_build("test", "new", {"extra": {}}, writer({"f.bin": data}))
    else:  # the publish ends whole before the prune deletes
        publisher.get_or_build("test", "new", {"extra": {}}, writer({"f.bin": data}))
        prune.apply(backend, todo, inv)
    stats = _cli(capsys, "remote", "stats", *root)[1]
    assert stats["broken_entries"] == 0, stats
    reader = Cache(tmp_path / "R", remote=url, )
    got = reader.get_or_build("test", "new", {"extra": {}}, writer({"f.bin": data}))
    assert got.file("f.bin").read_bytes() == data and got.origin in ("remote", "built")


def test_odd_names_on_the_remote_do_not_break_stats_or_prune(tmp_path: Path, remote: tuple[str, Raw],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    url, raw = remote
    Cache(tmp_path / "A", remote=url).get_or_build("test", "k", {"extra": {}}, writer({"f.bin": b"x" * 100}))
    raw.put_odd_manifest_name()
    root = ["--root", str(tmp_path / "A"), "--remote", url]
    code, stats = _cli(capsys, "remote", "stats", *root)
    assert code == 0 and stats["unreadable_manifests"] >= 1 and stats["entries"] >= 1
    code, done = _cli(capsys, "remote", "prune", "--grace", "0s", *root)
    assert code == 0
    code, pulled = _cli(capsys, "pull", "--root", str(tmp_path / "C"), "--remote", url)
    assert code in (0, 1) and [e["name"] for e in pulled["entries"] if e["result"] == "fetched"] == ["k"], pulled
    assert Cache(tmp_path / "B", remote=url).get_or_build("test", "k", {"extra": {}}, never).origin == "remote"


def test_prune_options_belong_to_prune(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    from abicache.cli.program import main

    url, _ = remote
    assert main(["remote", "--max-age", "1d", "--remote", url, "--root", str(tmp_path)]) == 2


def test_a_blob_two_entries_share_is_freed_with_the_last() -> None:
    """--max-size counts a shared blob once: deleting the older entry frees only its own blob."""
    from abicache.remote import prune
    from abicache.store.manifest import FileRecord

    def variant(name: str, created: float, shas: list[str]) -> prune.Variant:
        files = tuple(FileRecord(f"f{i}", sha, 10, 0o444) for i, sha in enumerate(shas))
        manifest = type("M", (), {"files": files, "created": created, "name": name})()
        return prune.Variant("test", name, "v", 0, None, manifest)  # type: ignore[arg-type]

    inv = prune.Inventory([variant("old", 1.0, ["a", "shared"]), variant("new", 2.0, ["b", "shared"])],
                          {"a": 100, "b": 100, "shared": 1000}, {})
    todo = prune.plan(inv, now=10.0, max_size=1100)
    assert [v.key for v, _ in todo.delete] == ["old"]  # 1200 -> 1100: "shared" still named by "new"
    assert sorted(todo.mark) == ["a"]


def test_a_machine_without_the_compiler_or_reading_only_finds_what_was_asked_for(
        tmp_path: Path, remote: tuple[str, Raw], monkeypatch: pytest.MonkeyPatch) -> None:
    """The key holds the compiler's identity. A fleet machine with another compiler builds its
    own (as its local store would); one without a compiler, or one that only reads the remote
    (prebuilt entries shipped through it), gets the entry of what was asked for, by the
    remote's name index, whatever compiler built it."""
    from abicache.env import Facts

    url, _ = remote
    inputs = {"tools": ["compiler.cxx"], "flags": ["-O2"], "sources": {"k.cpp": "int k;"}}

    def cache(folder: str, compiler: str | None) -> Cache:
        return Cache(tmp_path / folder, remote=url, facts=Facts().with_overrides({"compiler.cxx": compiler}))

    made = cache("builder", "g++ 12.2 x86_64-linux-gnu").get_or_build("t", "k", inputs, writer({"f": b"12"}))
    assert made.origin == "built"
    other = cache("fleet", "g++ 13.1 x86_64-linux-gnu").get_or_build("t", "k", inputs, writer({"f": b"13"}))
    assert other.origin == "built" and other.file("f").read_bytes() == b"13"
    bare = cache("bare", None).get_or_build("t", "k", inputs, writer({"f": b"never"}))
    assert bare.origin == "remote" and bare.file("f").read_bytes() in (b"12", b"13")
    changed = {**inputs, "flags": ["-O3"]}
    with pytest.raises(AssertionError, match="built"):  # other flags: not what was asked for
        cache("bare2", None).get_or_build("t", "k", changed, lambda out: (_ for _ in ()).throw(AssertionError("built")))
    monkeypatch.setenv("ABICACHE_REMOTE_MODE", "read")
    reader = cache("reader", "clang 18").get_or_build("t", "k", inputs, writer({"f": b"never"}))
    assert reader.origin == "remote"


def test_bundle_from_the_remote_serves_a_machine_without_the_remote(tmp_path: Path, remote: tuple[str, Raw],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`abicache bundle --remote` from every engine (file:// included): the entries CI pushed,
    packed into a read-only store that serves a machine with no remote and no builder."""
    from abicache.shipping import tiers
    from abicache.cli.program import main

    url, _ = remote
    Cache(tmp_path / "CI", remote=url).get_or_build("test", "shipped", {"extra": {}}, writer({"f.bin": b"ci's"}))
    out = tmp_path / "bundled store"
    assert main(["bundle", "--root", str(tmp_path / "bundler"), "--remote", url, "--out", str(out), "--json",
                 "shipped"]) == 0, capsys.readouterr().err
    os.environ["ABICACHE_READ_STORES"] = str(out)
    try:
        tiers.forget()
        got = Cache(tmp_path / "user", remote=False).get_or_build("test", "shipped", {"extra": {}}, never)
    finally:
        del os.environ["ABICACHE_READ_STORES"]
        tiers.forget()
    assert got.origin == "tier" and got.file("f.bin").read_bytes() == b"ci's"
