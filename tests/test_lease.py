"""The fleet's single flight (remote/lease.py), on real servers: machines are
separate processes with their own cache roots (tests/lease_node.py), sharing
SeaweedFS or a TLS redis-server; a log each builder appends to counts builds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import servers
from abicache import Cache, remote as remote_mod
import remote_fixtures
from remote_fixtures import Raw, redis_srv, s3_endpoint  # noqa: F401  (fixtures)

NODE = str(Path(__file__).with_name("lease_node.py"))


@pytest.fixture(params=["s3", "redis"])
def remote(request: pytest.FixtureRequest) -> tuple[str, Raw]:
    """The engines that keep leases (a file:// remote keeps none: its lease setting is 0)."""
    return remote_fixtures.make_remote(request, request.param)


@pytest.fixture(autouse=True)
def _fresh_tier_state() -> None:
    remote_mod.reset()


@pytest.fixture
def signing(tmp_path: Path) -> tuple[str, str]:
    """(ABICACHE_SIGNING_KEY, ABICACHE_TRUSTED_KEYS) of a fleet that signs."""
    from abicache.remote import keys

    key = tmp_path / "keys" / "ci.key"
    key.parent.mkdir()
    keys.write_pair(key)
    return str(key), str(key.with_name("ci.key.pub"))


def node(tmp_path: Path, url: str, who: str, seconds: float, *, fail: bool = False, start_at: float = 0.0,
         **env: str) -> subprocess.Popen[str]:
    argv = [sys.executable, NODE, str(tmp_path / who), url, "thing", str(seconds), str(tmp_path / "builds.log"),
            "fail" if fail else "", str(start_at)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})


def result(proc: subprocess.Popen[str], timeout: float = 60) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    got = json.loads(out.strip().splitlines()[-1])
    got["said"] = err.strip()[-2000:]  # the node's notes (waits, take-overs, remote errors), for a failure's message
    return got


def shown(got: object) -> str:
    """A failure's message in full (pytest shortens a long object's repr, and with it which node did what)."""
    return json.dumps(got, indent=1)


def builds(tmp_path: Path) -> list[str]:
    log = tmp_path / "builds.log"
    return log.read_text().split() if log.exists() else []


def wait_for_builds(tmp_path: Path, n: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while len(builds(tmp_path)) < n:
        assert time.monotonic() < deadline, f"no builder started within {seconds} s"
        time.sleep(0.05)


def lease_of(url: str) -> tuple[bytes, object] | None:
    cache = Cache("/nonexistent-unused", remote=url)
    key = cache.key_for("test", "thing", _inputs())[0]
    return cache.remote.backend().read_lease("test", key)


def _mallory(tmp_path: Path, url: str) -> tuple[str, object]:
    """(the key lease_node builds, a client of the remote): what anyone who can write it has."""
    cache = Cache(tmp_path / "mallory", remote=url)
    return cache.key_for("test", "thing", _inputs())[0], cache.remote.backend()


def _inputs():  # type: ignore[no-untyped-def]
    from abicache.core.key import Inputs

    return Inputs.make(extra={"name": "thing"})


def test_a_fleet_starting_together_builds_a_key_once(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, raw = remote
    start_at = time.time() + 2.0  # after every interpreter has started
    procs = [node(tmp_path, url, f"m{i}", 1.0, start_at=start_at) for i in range(4)]
    got = [result(p) for p in procs]
    assert len(builds(tmp_path)) == 1, shown({"builders": builds(tmp_path), "nodes": got})
    assert sorted(g["origin"] for g in got) == ["built", "remote", "remote", "remote"], shown(got)
    assert len({g["text"] for g in got}) == 1
    assert raw.count_manifests() == 1
    assert lease_of(url) is None, "the lease was not released after the upload"


def test_without_leases_a_fleet_starting_together_builds_it_on_every_machine(
        tmp_path: Path, remote: tuple[str, Raw]) -> None:
    """What the lease saves (and proof the test above can fail)."""
    url, raw = remote
    start_at = time.time() + 2.0
    procs = [node(tmp_path, url, f"m{i}", 1.0, start_at=start_at, ABICACHE_REMOTE_LEASE="0") for i in range(4)]
    got = [result(p) for p in procs]
    assert len(builds(tmp_path)) >= 2, shown(got)
    assert len({g["text"] for g in got}) == 1, "every machine must still load the one published entry"
    assert raw.count_manifests() == 1


def test_a_long_build_keeps_its_lease_renewed(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, _ = remote
    holder = node(tmp_path, url, "A", 5.0, ABICACHE_REMOTE_LEASE="1.5")
    wait_for_builds(tmp_path, 1)
    waiter = node(tmp_path, url, "B", 0.1, ABICACHE_REMOTE_LEASE="1.5")
    got, held = result(waiter), result(holder)
    assert len(builds(tmp_path)) == 1, "a waiter took over a lease whose holder was alive and renewing it"
    assert (held["origin"], got["origin"]) == ("built", "remote")


def test_a_killed_holder_is_taken_over_after_the_lease_time(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, _ = remote
    holder = node(tmp_path, url, "A", 120.0, ABICACHE_REMOTE_LEASE="2")
    wait_for_builds(tmp_path, 1)
    waiter = node(tmp_path, url, "B", 0.1, ABICACHE_REMOTE_LEASE="2")
    time.sleep(1.0)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    got = result(waiter, timeout=30)
    assert got["origin"] == "built" and len(builds(tmp_path)) == 2
    assert got["seconds"] >= 2.0, "taken over before the lease time passed"


def test_a_failed_build_is_reported_to_the_waiters_not_built_again(tmp_path: Path,
                                                                    remote: tuple[str, Raw]) -> None:
    url, _ = remote
    holder = node(tmp_path, url, "A", 1.0, fail=True)  # the default lease time: 30 s
    wait_for_builds(tmp_path, 1)
    waiter = node(tmp_path, url, "B", 0.1)
    failed, got = result(holder), result(waiter)
    assert "fails on purpose" in failed["error"]
    assert "fails on purpose" in got["error"] and "ABICACHE_RETRY_FAILED" in got["error"], got
    assert got["seconds"] < 15 and len(builds(tmp_path)) == 1
    later = result(node(tmp_path, url, "C", 0.1))  # a machine that comes after: the same error, no build
    assert "fails on purpose" in later["error"] and len(builds(tmp_path)) == 1
    again = result(node(tmp_path, url, "A", 0.1, fail=True))  # the machine that failed tries again itself
    assert "fails on purpose" in again["error"] and "moments ago" not in again["error"]
    assert len(builds(tmp_path)) == 2
    retried = result(node(tmp_path, url, "D", 0.1, ABICACHE_RETRY_FAILED="1"))
    assert retried["origin"] == "built" and len(builds(tmp_path)) == 3


def test_a_fleet_whose_build_fails_fails_it_once(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    """Four machines, a 2 s failing build: one build, every error within about one build time."""
    url, _ = remote
    start_at = time.time() + 2.0
    procs = [node(tmp_path, url, f"m{i}", 2.0, fail=True, start_at=start_at) for i in range(4)]
    got = [result(p) for p in procs]
    assert len(builds(tmp_path)) == 1, shown(got)
    assert all("fails on purpose" in g["error"] for g in got), shown(got)
    assert max(g["seconds"] for g in got) < 2.0 + 8.0, shown(got)


_TAKER = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from abicache import Cache
from abicache.remote import lease

cache = Cache(sys.argv[2], remote=sys.argv[3])
tier, rounds, at = cache.remote, json.loads(sys.argv[4]), float(sys.argv[5])
tier.backend().read_lease("test", "warm-up")  # connected before the first round
got = []
for i, key in enumerate(rounds):
    time.sleep(max(0.0, at + 3.0 * i - time.time()))  # every machine writes at this instant
    data = lease.encode(tier, "test", key, "test thing", 0, 0.0, 0.0, time.time())
    got.append([lease.take(tier, "test", key, data, 30.0, None) is not None, tier.down])
print(json.dumps(got))
"""


def test_a_lease_write_answered_after_the_timeout_is_a_lost_race_not_a_failed_remote(
        tmp_path: Path, remote: tuple[str, Raw]) -> None:
    """Four machines write one lease at the same instant. SeaweedFS answers the losers of a
    contended create-only write a second or two late (measured: 1.01 s, 2.01 s): past
    ABICACHE_REMOTE_TIMEOUT that is still a lost race, settled by reading the lease back.
    Before, such a machine put the remote aside for the rest of its run and built the key
    itself, a second build of the fleet (CI's flake of the test above)."""
    import uuid

    url, _ = remote
    rounds = [uuid.uuid4().hex for _ in range(3)]
    at = time.time() + 3.0  # after every interpreter has started
    src = str(Path(__file__).resolve().parents[1] / "src")
    procs = [subprocess.Popen([sys.executable, "-c", _TAKER, src, str(tmp_path / f"m{i}"), url, json.dumps(rounds),
                               str(at)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "ABICACHE_REMOTE_TIMEOUT": "1"}) for i in range(4)]
    got = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        got.append(json.loads(out.strip().splitlines()[-1]))
    for n in range(len(rounds)):
        took = [g[n] for g in got]
        assert sum(t[0] for t in took) == 1 and not any(t[1] for t in took), shown({"round": n, "took, down": took})


def test_a_forged_failure_record_is_not_believed_in_a_signed_fleet(tmp_path: Path, remote: tuple[str, Raw],
                                                                   signing: tuple[str, str]) -> None:
    url, _ = remote
    private, public = signing
    key, backend = _mallory(tmp_path, url)
    forged = json.dumps({"kind": "test", "key": key, "what": "test thing", "host": "mallory", "pid": 1,
                         "type": "BuildError", "error": "planted", "seconds": 1}).encode()
    backend.put_failure("test", key, forged, 600)
    unsigned = result(node(tmp_path, url, "B", 0.1))  # without signatures the record is believed
    assert "planted" in unsigned.get("error", ""), unsigned
    got = result(node(tmp_path, url, "C", 0.1, ABICACHE_SIGNING_KEY=private, ABICACHE_TRUSTED_KEYS=public))
    assert got.get("origin") == "built", got


def test_a_hung_holder_does_not_stall_the_fleet(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    """The holder is alive and renews its lease, but its build is asleep (no CPU time):
    after ABICACHE_LEASE_STUCK the waiter builds it itself."""
    url, _ = remote
    fast = {"ABICACHE_REMOTE_LEASE": "1.5", "ABICACHE_LEASE_STUCK": "4"}
    holder = node(tmp_path, url, "A", 120.0, **fast)
    try:
        wait_for_builds(tmp_path, 1)
        got = result(node(tmp_path, url, "B", 0.1, **fast), timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert got["origin"] == "built" and 4.0 <= got["seconds"] < 15, got


def test_a_holder_that_burns_cpu_is_not_stuck(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    """Progress is CPU time in the build's processes: a compiler working for longer than
    ABICACHE_LEASE_STUCK is waited for."""
    url, _ = remote
    fast = {"ABICACHE_REMOTE_LEASE": "3", "ABICACHE_LEASE_STUCK": "4"}  # renewed each second: slack for a busy CI
    holder = node(tmp_path, url, "A", 10.0, LEASE_NODE_BURN="1", **fast)
    wait_for_builds(tmp_path, 1)
    got = result(node(tmp_path, url, "B", 0.1, **fast), timeout=60)
    assert result(holder)["origin"] == "built"
    assert got["origin"] == "remote" and len(builds(tmp_path)) == 1, got


def test_a_forged_lease_in_a_signed_fleet_is_ignored(tmp_path: Path, remote: tuple[str, Raw],
                                                     signing: tuple[str, str]) -> None:
    url, _ = remote
    private, public = signing
    key, backend = _mallory(tmp_path, url)
    forged = json.dumps({"kind": "test", "key": key, "owner": "mallory", "host": "elsewhere", "pid": 1,
                         "what": "test thing", "beat": 1, "progress": 1.0, "expect": 0, "ttl": 30}).encode()
    assert backend.put_lease("test", key, forged, 30.0, None) is not None
    got = result(node(tmp_path, url, "B", 0.1, ABICACHE_SIGNING_KEY=private, ABICACHE_TRUSTED_KEYS=public))
    assert got["origin"] == "built" and got["seconds"] < 10, got


def test_a_holder_with_a_clock_minutes_behind_is_waited_for(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, _ = remote
    holder = node(tmp_path, url, "A", 4.0, LEASE_NODE_SKEW="-180", LEASE_NODE_BURN="1")
    wait_for_builds(tmp_path, 1)
    waiter = node(tmp_path, url, "B", 0.1, LEASE_NODE_SKEW="180")
    got, held = result(waiter), result(holder)
    assert (held["origin"], got["origin"]) == ("built", "remote") and len(builds(tmp_path)) == 1, got


def test_waiting_for_the_fleet_holds_no_local_lock(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    """Two processes of one machine (one cache root) wait for another machine's long
    build: neither fails with LockTimeout, both end once their wait runs out."""
    url, _ = remote
    holder = node(tmp_path, url, "A", 60.0, LEASE_NODE_BURN="1")
    try:
        wait_for_builds(tmp_path, 1)
        argv = [sys.executable, NODE, str(tmp_path / "M"), url, "thing", "0.1", str(tmp_path / "builds.log")]
        env = {**os.environ, "ABICACHE_LOCK_TIMEOUT": "4"}
        procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for _ in range(2)]
        got = [result(p, timeout=30) for p in procs]
    finally:
        holder.kill()
        holder.wait()
    # One builds once its wait runs out; the other takes that build: from this machine's
    # store, or from the remote where it polled between the upload and the local commit
    # (a build is published to the remote first: making.py _share).
    origins = sorted(g.get("origin", g.get("error")) for g in got)
    assert origins in (["built", "local"], ["built", "remote"]), got
    assert len({g["text"] for g in got}) == 1 and len(builds(tmp_path)) == 2, got


@pytest.mark.parametrize("stale", [b"not json", json.dumps(
    {"owner": "gone", "host": "elsewhere", "pid": 1, "what": "x", "renewed": 1000.0, "ttl": 30.0}).encode()],
    ids=["junk", "another-version"])
def test_a_lease_that_is_not_a_believable_lease_is_taken_over_without_waiting(
        tmp_path: Path, remote: tuple[str, Raw], stale: bytes) -> None:
    url, _ = remote
    cache = Cache(tmp_path / "A", remote=url)
    key = cache.key_for("test", "thing", _inputs())[0]
    assert cache.remote.backend().put_lease("test", key, stale, 30.0, None) is not None
    start = time.monotonic()
    art = cache.get_or_build("test", "thing", _inputs(), lambda out: (out / "out.bin").write_text("x"))
    assert art.origin == "built" and time.monotonic() - start < 10


def test_remote_stats_counts_the_builds_in_flight(tmp_path: Path, remote: tuple[str, Raw],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from abicache.cli.program import main

    url, _ = remote
    holder = node(tmp_path, url, "A", 3.0)
    wait_for_builds(tmp_path, 1)
    code = main(["remote", "stats", "--root", str(tmp_path / "B"), "--remote", url, "--json"])
    during = json.loads(capsys.readouterr().out)["build_leases"]
    result(holder)
    main(["remote", "stats", "--root", str(tmp_path / "B"), "--remote", url, "--json"])
    after = json.loads(capsys.readouterr().out)["build_leases"]
    assert (code, during, after) == (0, 1, 0)


def test_a_dead_lease_that_cannot_be_taken_over_ends_in_a_bounded_wait(tmp_path: Path,
                                                                       remote: tuple[str, Raw]) -> None:
    """A server that refuses every takeover (an S3-compatible without ETags refuses If-Match):
    the waiter waits out the lock timeout and builds; it never spins on the takeover."""
    url, _ = remote
    cache = Cache(tmp_path / "A", remote=url, lock_timeout=2.0)
    key = cache.key_for("test", "thing", _inputs())[0]
    backend = cache.remote.backend()
    stale = json.dumps({"owner": "gone", "host": "elsewhere", "pid": 1, "what": "test thing", "renewed": 1000.0,
                        "ttl": 30.0, "beat": 7}).encode()
    assert backend.put_lease("test", key, stale, 30.0, None) is not None
    tries = []
    real = backend.put_lease

    def refusing(kind: str, key_: str, data: bytes, ttl: float, replacing: object) -> object:
        tries.append(replacing)
        return None if replacing is not None else real(kind, key_, data, ttl, replacing)

    backend.put_lease = refusing  # type: ignore[method-assign]
    got: list = []
    worker = threading.Thread(target=lambda: got.append(
        cache.get_or_build("test", "thing", _inputs(), lambda out: (out / "out.bin").write_text("x"))), daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), f"still waiting after 20 s ({len(tries)} takeover tries)"
    assert got[0].origin == "built" and len(tries) < 100, len(tries)


def test_a_read_only_machine_waits_for_the_builder_and_fetches(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, _ = remote
    holder = node(tmp_path, url, "A", 1.5)
    wait_for_builds(tmp_path, 1)
    reader = node(tmp_path, url, "B", 0.1, ABICACHE_REMOTE_MODE="read")
    assert result(reader)["origin"] == "remote" and result(holder)["origin"] == "built"
    assert len(builds(tmp_path)) == 1


def test_a_remote_that_stops_while_machines_wait_ends_in_local_builds(tmp_path: Path) -> None:
    why = servers.redis_available()
    if why:
        pytest.skip(why)
    with servers.redis_server() as server:
        url = server.url()
        holder = node(tmp_path, url, "A", 120.0, ABICACHE_REMOTE_TIMEOUT="1")
        wait_for_builds(tmp_path, 1)
        waiter = node(tmp_path, url, "B", 0.1, ABICACHE_REMOTE_TIMEOUT="1")
        time.sleep(1.0)
    start = time.monotonic()  # the server is stopped
    try:
        got = result(waiter, timeout=30)
    finally:
        holder.kill()
        holder.wait()
    assert got["origin"] == "built" and time.monotonic() - start < 15


def test_the_walk_down_the_children_sees_what_a_pass_over_all_processes_sees() -> None:
    """liveness reads each thread's list of children (a few reads: a renewal stays fast while
    a Python builder holds the interpreter lock); a grandchild's CPU time counts as a child's."""
    from abicache.remote import liveness

    if not liveness._CHILDREN_LISTED:
        pytest.skip("this kernel keeps no /proc/<pid>/task/<tid>/children lists")
    burn = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\ntime.sleep(5)"
    child = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"],
                             start_new_session=True)
    try:
        time.sleep(2.0)  # the grandchild has burnt its second and sleeps
        walked, scanned = liveness._walk_children(), liveness._scan_all()
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the grandchild too
        child.wait()
    assert walked >= 0.9 and abs(walked - scanned) < 0.1, (walked, scanned)


# ---- fresh records: a signed record saved and written back later is not believed --------------------------------


def _signed(tmp_path: Path, url: str, private: str, public: str, record: dict) -> bytes:
    """A record signed by the fleet's key, as a machine of the fleet wrote it (with its time)."""
    os.environ["ABICACHE_SIGNING_KEY"], os.environ["ABICACHE_TRUSTED_KEYS"] = private, public
    try:
        tier = Cache(tmp_path / "ci-machine", remote=url).remote
        return json.dumps(tier.sign_record(record), sort_keys=True).encode()
    finally:
        del os.environ["ABICACHE_SIGNING_KEY"], os.environ["ABICACHE_TRUSTED_KEYS"]


def test_a_signed_failure_record_written_back_later_is_not_believed(tmp_path: Path, remote: tuple[str, Raw],
                                                                    signing: tuple[str, str]) -> None:
    """A CI machine's signed failure record from 20 minutes ago, written back by someone
    without any key: the signed fleet builds the key (the cause was fixed since)."""
    url, _ = remote
    private, public = signing
    key, backend = _mallory(tmp_path, url)
    old = _signed(tmp_path, url, private, public, {
        "kind": "test", "key": key, "what": "test thing", "host": "ci", "pid": 1, "machine": "ci-1",
        "type": "BuildError", "error": "the old error", "seconds": 1, "at": time.time() - 1200})
    backend.put_failure("test", key, old, 600)
    got = result(node(tmp_path, url, "C", 0.1, ABICACHE_SIGNING_KEY=private, ABICACHE_TRUSTED_KEYS=public))
    assert got.get("origin") == "built", got


def test_a_failure_record_without_an_expiry_on_redis_is_ignored(tmp_path: Path, redis_srv: servers.RedisServer,
                                                                signing: tuple[str, str]) -> None:
    """abicache writes every failure record with an expiry; one without was written back by hand."""
    url, raw = remote_fixtures.make_remote_for(redis_srv)
    private, public = signing
    failed = result(node(tmp_path, url, "A", 0.1, fail=True, ABICACHE_SIGNING_KEY=private,
                         ABICACHE_TRUSTED_KEYS=public))
    assert "fails on purpose" in failed["error"]
    (name,) = list(raw.client.scan_iter(match=f"{raw.prefix}:*failed*"))
    raw.client.set(name, raw.client.get(name))  # saved and written back: no expiry
    got = result(node(tmp_path, url, "B", 0.1, ABICACHE_SIGNING_KEY=private, ABICACHE_TRUSTED_KEYS=public))
    assert got.get("origin") == "built", got


def test_a_successful_build_clears_the_fleets_failure_record(tmp_path: Path, remote: tuple[str, Raw]) -> None:
    url, _ = remote
    assert "fails on purpose" in result(node(tmp_path, url, "A", 0.1, fail=True))["error"]
    key, backend = _mallory(tmp_path, url)
    assert backend.read_failure("test", key) is not None
    assert result(node(tmp_path, url, "A", 0.1))["origin"] == "built"  # fixed, and built again by that machine
    assert backend.read_failure("test", key) is None


def test_old_signed_leases_written_back_in_turn_do_not_stall_the_fleet(tmp_path: Path, remote: tuple[str, Raw],
                                                                       signing: tuple[str, str]) -> None:
    """Saved leases of a holder long gone, written back one after another: their bytes change
    and their CPU seconds grow, as a live holder's do, but their own signed time is old."""
    url, _ = remote
    private, public = signing
    key, backend = _mallory(tmp_path, url)
    saved = [_signed(tmp_path, url, private, public, {
        "kind": "test", "key": key, "owner": "gone", "host": "ci", "pid": 1, "what": "test thing", "beat": beat,
        "progress": float(beat), "expect": 0, "ttl": 2, "at": time.time() - 3600 + beat}) for beat in range(40)]
    stop = threading.Event()

    def replay() -> None:
        tag = backend.put_lease("test", key, saved[0], 30.0, None)
        for data in saved[1:]:
            if stop.wait(0.5) or tag is None:
                return
            tag = backend.put_lease("test", key, data, 30.0, tag) or tag

    thread = threading.Thread(target=replay, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        got = result(node(tmp_path, url, "B", 0.1, ABICACHE_SIGNING_KEY=private, ABICACHE_TRUSTED_KEYS=public,
                          ABICACHE_REMOTE_LEASE="2"), timeout=60)
    finally:
        stop.set()
        thread.join()
    assert got.get("origin") == "built" and got["seconds"] < 10, got
