"""bench/faults.py rows for a fleet under faults and hostile peers: leases that
stall (a hung holder, a forged lease), a failing build on four machines, clocks
three minutes apart, a key flooded with variants (Redis and S3), gc during a
link, prune during a publish, a planted tools/ memo, hostile inline source
names, and a remote configured without its client library. Machines are
separate processes with their own cache roots (tests/lease_node.py), on real
servers. Every row runs with the default settings.

Counters, as faults.py prints them: `hangs` a wait past its bound, `corrupt` a
broken build or entry or a duplicate build, `planted` a planted value believed,
`lost` a file written outside the store or the scratch folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]


def _env(**more: str) -> dict[str, str]:
    """The machines' environment: read when each starts (_remotes() adds the S3 credentials)."""
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ABICACHE_PROGRESS": "0", **more}

NODE = str(ROOT / "tests" / "lease_node.py")
#: a peer whose build hangs: the others finish their own within this (acceptance)
HUNG_BOUND = 120.0

import servers  # noqa: E402  (tests/ is on sys.path: bench/faults.py puts it there)
from remote_fixtures import Raw  # noqa: E402

Row = Any  # bench.faults.Row


def _remotes(engines: tuple[str, ...] = ("s3", "redis")) -> Iterator[tuple[str, str, Raw]]:
    """(engine, url, raw view) of a fresh prefix on each real server."""
    import uuid

    os.environ.update(servers.CREDENTIALS)
    with servers.seaweedfs_s3() as endpoint, servers.redis_server() as redis:
        for engine in engines:
            prefix = uuid.uuid4().hex[:12]
            if engine == "s3":
                url = servers.s3_url(endpoint, prefix)
                yield engine, url, Raw(url, servers.raw_s3(endpoint), prefix)
            else:
                url = redis.url(prefix)
                yield engine, url, Raw(url, redis.client(), prefix)


def _node(work: Path, url: str, who: str, seconds: float, *, fail: bool = False, start_at: float = 0.0,
          **env: str) -> subprocess.Popen[str]:
    argv = [sys.executable, NODE, str(work / who), url, "thing", str(seconds), str(work / "builds.log"),
            "fail" if fail else "", str(start_at)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(**env))


def _result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """What a machine printed; "hung", or "crashed", or "origin": "remote down" (its remote
    failed: that machine did not take part in the fleet, and the row counts it as corrupt)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"hung": True}
    try:
        got = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"crashed": err[-300:]}
    if got.get("stats", {}).get("errors"):
        got["origin"] = "remote down"
    return got


def _builds(work: Path) -> int:
    log = work / "builds.log"
    return len(log.read_text().split()) if log.exists() else 0


def _started(work: Path, n: int = 1, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while _builds(work) < n and time.monotonic() < deadline:
        time.sleep(0.05)


def _fleet(work: Path, tag: str) -> Path:
    folder = work / tag
    folder.mkdir(parents=True)
    return folder


# ---- leases ----------------------------------------------------------------------------------------


def stuck_lease(work: Path) -> Callable[[Row], None]:
    """The holder lives and renews its lease, but its build sleeps (no CPU time)."""
    def run(row: Row) -> None:
        waits = []
        for engine, url, _ in _remotes():
            fleet = _fleet(work, f"stuck-{engine}")
            holder = _node(fleet, url, "A", 600.0)
            try:
                _started(fleet)
                got = _result(_node(fleet, url, "B", 0.1), timeout=HUNG_BOUND + 30)
            finally:
                holder.kill()
                holder.wait()
            row.trials += 1
            row.faults += 1
            waits.append(got.get("seconds", float("inf")))
            if got.get("hung") or got.get("seconds", 1e9) > HUNG_BOUND:
                row.hangs += 1
            elif got.get("origin") != "built":
                row.corrupt += 1
        row.note = (f"the waiter built its own after {', '.join(f'{w:.0f}' for w in waits)} s "
                    f"(ABICACHE_LEASE_STUCK=60 s; bound {HUNG_BOUND:.0f} s)")
    return run


def forged_lease(work: Path) -> Callable[[Row], None]:
    """A lease written by anyone who can write the remote, in a fleet that signs."""
    def run(row: Row) -> None:
        from abicache import Cache
        from abicache.core.key import Inputs
        from abicache.remote import keys

        waits = []
        for engine, url, _ in _remotes():
            fleet = _fleet(work, f"forged-{engine}")
            key_file = fleet / "ci.key"
            keys.write_pair(key_file)
            cache = Cache(fleet / "mallory", remote=url)
            key = cache.key_for("test", "thing", Inputs.make(extra={"name": "thing"}))[0]
            forged = json.dumps({"kind": "test", "key": key, "owner": "mallory", "host": "elsewhere", "pid": 1,
                                 "what": "test thing", "beat": 1, "progress": 1.0, "expect": 0, "ttl": 30}).encode()
            cache.remote.backend().put_lease("test", key, forged, 3600.0, None)
            got = _result(_node(fleet, url, "B", 0.1, ABICACHE_SIGNING_KEY=str(key_file),
                                ABICACHE_TRUSTED_KEYS=str(key_file) + ".pub"), timeout=HUNG_BOUND)
            row.trials += 1
            row.faults += 1
            waits.append(got.get("seconds", float("inf")))
            if got.get("hung") or got.get("seconds", 1e9) > 10:
                row.hangs += 1
            elif got.get("origin") != "built":
                row.corrupt += 1
        row.note = f"waited {', '.join(f'{w:.1f}' for w in waits)} s (bound 10 s)"
    return run


def failing_build(work: Path) -> Callable[[Row], None]:
    """Four machines start together on a key whose build fails after 4 s."""
    def run(row: Row) -> None:
        notes = []
        for engine, url, _ in _remotes():
            fleet = _fleet(work, f"failing-{engine}")
            start_at = time.time() + 2.0
            procs = [_node(fleet, url, f"m{i}", 4.0, fail=True, start_at=start_at) for i in range(4)]
            got = [_result(p, timeout=120) for p in procs]
            row.trials += 1
            row.faults += 4
            row.hangs += sum(1 for g in got if g.get("hung"))
            row.corrupt += sum(1 for g in got if "fails on purpose" not in g.get("error", ""))
            row.corrupt += abs(_builds(fleet) - 1)  # exactly one failing build per fleet
            notes.append(f"{engine}: {_builds(fleet)} build, errors at "
                         + ", ".join(f"{g.get('seconds', 0):.1f}" for g in got) + " s")
        row.note = "; ".join(notes)
    return run


def skewed_clock(work: Path) -> Callable[[Row], None]:
    """The holder's clock is 3 minutes behind, the waiter's 3 minutes ahead."""
    def run(row: Row) -> None:
        for engine, url, _ in _remotes():
            fleet = _fleet(work, f"skew-{engine}")
            holder = _node(fleet, url, "A", 4.0, LEASE_NODE_SKEW="-180", LEASE_NODE_BURN="1")
            _started(fleet)
            got = _result(_node(fleet, url, "B", 0.1, LEASE_NODE_SKEW="180"), timeout=120)
            held = _result(holder, timeout=120)
            row.trials += 1
            row.faults += 1
            row.hangs += bool(got.get("hung") or held.get("hung"))
            row.corrupt += abs(_builds(fleet) - 1)  # a duplicate build
            row.corrupt += got.get("origin") != "remote"
        row.note = "builds per key: 1 (a duplicate counts as corrupt)"
    return run


# ---- lookups -----------------------------------------------------------------------------------------

FLOOD_LOOKUP = textwrap.dedent("""
    import json, sys, time, warnings
    from abicache import Cache
    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    warnings.simplefilter("ignore")
    cache = Cache(sys.argv[1], remote=sys.argv[2])
    write = lambda out: (out / "lib.so").write_bytes(b"genuine")
    cache.get_or_build("flood", "warm", {"extra": {"v": 0}}, write)  # imports, client, connections
    before = status("VmRSS:")
    start = time.perf_counter()
    art = cache.get_or_build("flood", "victim", {"extra": {"v": 1}}, write)
    print(json.dumps({"seconds": time.perf_counter() - start, "added": status("VmHWM:") - before,
                      "peak": status("VmHWM:"), "origin": art.origin,
                      "bytes": art.file("lib.so").read_bytes().decode()}))
""")


def _junk_manifest(key: str, variant: str, size: int) -> bytes:
    """A manifest of the most expensive kind to parse: valid JSON, one file entry after another."""
    entry = '"f%07d": {"sha256": "' + "0" * 64 + '", "size": 1, "mode": 420}'
    files, n, total = [], 0, 0
    while total < size - 400:
        files.append(entry % n)
        total += len(files[-1]) + 2
        n += 1
    return json.dumps({"schema": 1, "kind": "flood", "key": key, "variant": variant}).encode()[:-1] + \
        b', "files": {' + ", ".join(files).encode() + b"}}"


def variant_flood(work: Path, engine: str, variants: int) -> Callable[[Row], None]:
    """Variants of 4 MiB (the manifest cap) filed under a key by anyone who can write the remote."""
    def run(row: Row) -> None:
        from abicache import Cache
        from abicache.core.key import Inputs
        from abicache.store import manifest as mf

        for _, url, raw in _remotes((engine,)):
            fleet = _fleet(work, f"flood-{engine}")
            key = Cache(fleet / "A", remote=url).key_for("flood", "victim", Inputs.make(extra={"v": 1}))[0]
            for i in range(variants):
                variant = f"{i:016x}"
                raw.put_manifest("flood", key, variant, _junk_manifest(key, variant, mf.MAX_BYTES - 64))
            done = subprocess.run([sys.executable, "-c", FLOOD_LOOKUP, str(fleet / "B"), url], capture_output=True,
                                  text=True, env=_env(), timeout=600)
            row.trials += 1
            row.faults += variants
            try:
                got = json.loads(done.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                row.corrupt += 1
                row.note = f"lookup failed: {done.stderr[-200:]}"
                return
            row.hangs += got["seconds"] > 2.0
            row.corrupt += got["added"] > 64 << 20 or got["bytes"] != "genuine"
            refusals = (fleet / "B").rglob("remote-refused.jsonl")
            lines = sum(len(p.read_text().splitlines()) for p in refusals)
            row.note = (f"{variants} x 4 MiB variants: lookup {got['seconds']:.2f} s, peak RSS +"
                        f"{got['added'] / 2**20:.0f} MiB (process {got['peak'] / 2**20:.0f} MiB), "
                        f"{lines} refusal log line(s)")
    return run


# ---- maintenance -------------------------------------------------------------------------------------

GC_WRAPPER = """#!/bin/sh
case " $* " in *" -c "*) ;; *) PYTHONPATH={src} {python} -m abicache gc --max-size 0 --root {store} --json \\
    >> {log} ;; esac
exec c++ "$@"
"""


def gc_during_link(work: Path, trials: int) -> Callable[[Row], None]:
    """`abicache gc --max-size 0` starts as each rebuild's linker starts (8 units, 7 object hits)."""
    def run(row: Row) -> None:
        from abicache import Cache, cc

        folder = _fleet(work, "gc-link")
        store, log = folder / "store", folder / "gc.jsonl"
        wrapper = folder / "gc-then-c++"
        wrapper.write_text(GC_WRAPPER.format(src=ROOT / "src", python=sys.executable, store=store, log=log))
        wrapper.chmod(0o755)
        os.environ["CXX"] = str(wrapper)
        try:
            paths = []
            for i in range(8):
                paths.append(folder / f"u{i}.cpp")
                paths[-1].write_text(f'extern "C" int f{i}() {{ return {i}; }}\n')
            cc.load_library("eight", paths, cache=Cache(store, remote=False))
            for t in range(trials):
                paths[t % 8].write_text(f'extern "C" int f{t % 8}() {{ return {1000 + t}; }}\n')
                row.trials += 1
                row.faults += 1
                try:
                    lib = cc.load_library("eight", paths, cache=Cache(store, remote=False))
                    row.corrupt += getattr(lib, f"f{t % 8}")() != 1000 + t
                except Exception:  # noqa: BLE001  a broken build is what this row counts
                    row.corrupt += 1
        finally:
            os.environ.pop("CXX", None)
        reports, text, at = [], log.read_text(), 0
        decoder = json.JSONDecoder()
        while text[at:].strip():  # one JSON document per gc run, each over several lines
            doc, at = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
            reports.append(doc)
        row.note = (f"{len(reports)} gc runs during links: {sum(r['in_use'] for r in reports)} entries left "
                    f"in use, {sum(r['entries_removed'] for r in reports)} evicted")
    return run


def prune_during_publish(work: Path) -> Callable[[Row], None]:
    """A prune lists, a machine publishes an entry reusing a blob the prune will delete,
    the prune deletes it: before, and between, the publisher's manifest and its re-check."""
    def run(row: Row) -> None:
        from abicache import Cache
        from abicache.remote import prune

        outcomes = []
        for engine, url, _ in _remotes():
            for n, when in enumerate(("before the publish", "after its manifest")):
                folder = _fleet(work, f"prune-{engine}-{n}")
                data = os.urandom(3000)  # each interleaving its own blob and names, on the one remote
                write = lambda out, data=data: (out / "f.bin").write_bytes(data)  # noqa: E731
                first = Cache(folder / "A", remote=url).get_or_build("t", f"old{n}", {"extra": {}}, write)
                backend = Cache(folder / "P", remote=url).remote.backend()
                backend.delete_manifest("t", first.key, first.variant)
                prune.apply(backend, prune.plan(prune.inventory(backend), now=time.time()))  # marks the blob
                inv = prune.inventory(backend)
                todo = prune.plan(inv, now=time.time(), grace=0.0)
                publisher = Cache(folder / "C", remote=url).remote.backend()
                real = publisher.put_manifest
                if when == "after its manifest":
                    def put_then_prune(*args: Any, inv: Any = inv, todo: Any = todo) -> bool:
                        done = real(*args)
                        publisher.put_manifest = real  # once (the process's tier is shared by its caches)
                        prune.apply(backend, todo, inv)
                        return done

                    publisher.put_manifest = put_then_prune  # type: ignore[method-assign]
                else:
                    prune.apply(backend, todo, inv)
                Cache(folder / "C", remote=url).get_or_build("t", f"new{n}", {"extra": {}}, write)
                publisher.put_manifest = real  # type: ignore[method-assign]
                row.trials += 1
                row.faults += 1
                broken = prune.stats(prune.inventory(backend))["broken_entries"]
                got = Cache(folder / "R", remote=url).get_or_build("t", f"new{n}", {"extra": {}}, write)
                broken += got.file("f.bin").read_bytes() != data
                row.corrupt += broken
                outcomes.append(f"{engine} {when}: {'BROKEN' if broken else got.origin}")
        row.note = "; ".join(outcomes)
    return run


# ---- inputs ------------------------------------------------------------------------------------------

MEMO_CHECK = textwrap.dedent("""
    import sys
    from pathlib import Path
    from abicache.env import Facts
    print(Facts(memo_dir=Path(sys.argv[1])).get("compiler.cxx"))
""")


def planted_memo(work: Path) -> Callable[[Row], None]:
    """A compiler identity memo in tools/, rewritten and left writable by others (a store an
    older version left open), or given to another user: a new process must not believe it."""
    def run(row: Row) -> None:
        memo = _fleet(work, "memo") / "tools"

        def ask() -> str:
            return subprocess.run([sys.executable, "-c", MEMO_CHECK, str(memo)], capture_output=True, text=True,
                                  env=_env(), timeout=60).stdout.strip()

        memo.mkdir(parents=True, exist_ok=True)
        genuine = ask()
        if not genuine or not list(memo.glob("*.json")):
            raise RuntimeError(f"no compiler identity was memoized in {memo} ({genuine!r})")
        ways = ["writable by others", *(["another user's"] if os.getuid() == 0 else [])]
        for way in ways:
            for record in memo.glob("*.json"):
                record.chmod(0o644)
                os.chown(record, os.getuid(), os.getgid())
                record.write_text(record.read_text().replace(genuine, "planted 9.9"))
                record.chmod(0o666) if way == "writable by others" else os.chown(record, 65534, 65534)
            row.trials += 1
            row.faults += 1
            row.planted += ask() != genuine
        row.note = f"{', '.join(ways)}; the identity stays {genuine[:40]!r}"
    return run


def hostile_inline_names(work: Path) -> Callable[[Row], None]:
    """{name: code} sources whose names would write outside the scratch folder."""
    def run(row: Row) -> None:
        from abicache import Cache, cc
        from abicache.errors import AbicacheError

        folder = _fleet(work, "inline")
        target = folder / "outside.cpp"
        names = [str(target), f"../{target.name}", f"a/../../{target.name}", f"../../../../../../{target}",
                 "./x.cpp", "", "x\0.cpp"]
        for name in names:
            row.trials += 1
            row.faults += 1
            try:
                cc.load_library("hostile", {name: 'extern "C" int f() { return 1; }'},
                                cache=Cache(folder / "store", remote=False))
                row.corrupt += 1  # built: the name should have been refused
            except AbicacheError:
                pass
        row.lost += sum(p.exists() for p in (target, folder.parent / target.name, Path("/") / target.name))
        row.note = f"{len(names)} names refused; files written outside: {row.lost}"
    return run


WITHOUT_EXTRA = textwrap.dedent("""
    import sys, warnings
    class Missing:  # as a plain `pip install abicache`: the remote extra's clients are absent
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("redis", "obstore", "cryptography"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Missing())
    from abicache import Cache
    c = Cache(sys.argv[1])
    print(sum(c.get_or_build("t", f"k{n}", {"extra": {"n": n}}, lambda out: (out / "f").write_text("x")).origin
              == "built" for n in range(3)))
""")


def missing_extra(work: Path) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        warned = []
        for url in ("redis://127.0.0.1:6399/0", "s3://bucket/p?endpoint=http://127.0.0.1:9"):
            done = subprocess.run([sys.executable, "-c", WITHOUT_EXTRA, str(_fleet(work, f"extra{len(warned)}"))],
                                  capture_output=True, text=True, env=_env(ABICACHE_REMOTE=url), timeout=60)
            row.trials += 1
            row.faults += 3
            built = int(done.stdout.strip() or 0) if done.returncode == 0 else 0
            row.corrupt += 3 - built  # a miss that failed instead of building
            warned.append(done.stderr.count("pip install 'abicache[remote]'"))
        row.note = f"3 misses per URL built locally; warnings naming the fix: {warned} (one per process)"
    return run
