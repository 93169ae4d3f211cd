"""Fault injection at scale: crashes, concurrency, corruption, a full disk,
every remote fault, and the store-safety attacks (bench/attacks.py: a hostile
co-user, in-place edits under the default verify policy, a slow-drip Redis,
broken states, oversize remote values). Prints trials run, faults injected,
corrupt entries seen, hangs, data lost, planted loads, changed bytes run and
unrecoverable keys; exits 1 if any count but the first two is not zero.

    python bench/faults.py                    # the full run (under 15 minutes on 2 cores)
    python bench/faults.py --quick            # a few trials of each
    python bench/faults.py --only fleet       # only the fleet rows (bench/fleet_faults.py)
    python bench/faults.py --only neighbour   # only what a neighbour can steer (bench/neighbours.py)
    ABICACHE_TEST_BROKEN_PUBLISH=1 python bench/faults.py --quick
                                              # publish by copying: the harness must report failures
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
RESULTS = ROOT / "bench" / "results"

import attacks  # noqa: E402
import fleet_faults as fleet  # noqa: E402
import neighbours  # noqa: E402
import faultlib  # noqa: E402
import servers  # noqa: E402
from abicache import Cache, remote as remote_mod  # noqa: E402
from abicache.store.verify import verify_store  # noqa: E402


@dataclass
class Row:
    kind: str
    trials: int = 0
    faults: int = 0
    corrupt: int = 0
    hangs: int = 0
    lost: int = 0
    planted: int = 0  # loads of code another user planted
    changed: int = 0  # loads that returned a changed byte
    unrecoverable: int = 0  # keys that did not build or hit again
    refused: int = 0  # builds the fleet refused after their cause was fixed
    outside: int = 0  # files written (or modes changed) outside the store being written
    excess: int = 0  # background checks run beyond the cap
    stale: int = 0  # libraries served though an input they read had changed
    seconds: float = 0.0
    note: str = ""


def timed(fn: Callable[[Row], None], row: Row) -> Row:
    start = time.perf_counter()
    try:
        fn(row)
    except Exception as exc:  # noqa: BLE001  a harness failure is a failure, reported as such
        row.corrupt += 1
        row.note = f"harness error: {type(exc).__name__}: {exc}"[:160]
    row.seconds = time.perf_counter() - start
    return row


# ---- crashes -----------------------------------------------------------------------------


def crashes(work: Path, trials: int) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        root = work / "crash"
        counts = faultlib.crash_trials(root, trials, seed=7)
        row.trials, row.faults, row.corrupt = counts["trials"], counts["killed"], counts["corrupt"]
        row.note = f"{counts['killed_while_staging']} kills landed between stage and rename"
        cache = Cache(root, lock_timeout=20, remote=False)
        broken = faultlib.partial_entries(cache)
        row.corrupt += len(broken)
        valid = [v for v in cache.store.iter_variant_dirs() if not any(b.startswith(f"{v}:") for b in broken)]
        for k in range(min(trials, faultlib.KEYS * 3)):  # every key builds or hits, in bounded time
            start = time.monotonic()
            try:
                cache.get_or_build("crash", f"k{k}", {"sources": {"s": str(k)}},
                                   lambda out: (out / "lib.so").write_bytes(b"fresh"))
            except Exception:  # noqa: BLE001
                row.hangs += 1
            if time.monotonic() - start > 10:
                row.hangs += 1
        row.lost += sum(1 for v in valid if not v.is_dir())
        report = verify_store(cache.store, full=True)
        row.corrupt += len(report.problems)

    return run


# ---- concurrency -------------------------------------------------------------------------

RACER = r"""
import hashlib, json, os, sys, time
from pathlib import Path
from abicache import Cache
root, key, marks, start = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
time.sleep(max(0.0, start - time.time()))
def build(out):
    (marks / f"{key}-{os.getpid()}").touch()
    time.sleep(0.05)
    (out / "lib.so").write_bytes(os.urandom(20000))
art = Cache(root, remote=False, lock_timeout=60).get_or_build("race", key, {"extra": {"k": key}}, build)
print(json.dumps([key, hashlib.sha256(art.file().read_bytes()).hexdigest()]))
"""


def concurrency(work: Path, rounds: int, procs: int) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ABICACHE_PROGRESS": "0"}
        for r in range(rounds):
            root, marks = work / f"race{r}", work / f"marks{r}"
            marks.mkdir(parents=True)
            start = time.time() + 1.0
            ps = [subprocess.Popen([sys.executable, "-c", RACER, str(root), f"k{i % 4}", str(marks), str(start)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                  for i in range(procs)]
            seen: dict[str, set[str]] = {}
            for p in ps:
                try:
                    out, _ = p.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    row.hangs += 1
                    continue
                if p.returncode == 0:
                    key, digest = json.loads(out)
                    seen.setdefault(key, set()).add(digest)
                else:
                    row.corrupt += 1
            row.trials += 1
            row.faults += procs
            row.corrupt += sum(len(d) - 1 for d in seen.values())  # two answers for one key
            builds = len(list(marks.iterdir()))
            row.corrupt += len(faultlib.partial_entries(Cache(root, remote=False)))
            row.note = f"{procs} processes x {rounds} rounds, 4 keys; builds per round {builds} (single flight: 4)"
            if builds != 4:
                row.corrupt += abs(builds - 4)

    return run


# ---- corruption ----------------------------------------------------------------------------


def byte_flips(work: Path, rounds: int) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        rng = random.Random(11)
        for r in range(rounds):
            cache = Cache(work / f"flip{r}", remote=False)
            contents = {f"k{i}": os.urandom(rng.randint(1, 50_000)) for i in range(20)}
            arts = {k: cache.get_or_build("flip", k, {"extra": {"k": k}}, lambda out, d=d: (out / "f.bin").write_bytes(d))
                    for k, d in contents.items()}
            damaged = rng.sample(sorted(arts), 5)
            for k in damaged:  # flip one byte of the blob behind the entry
                blob = cache.store.layout.blob(arts[k].manifest.files[0].sha256, False)
                os.chmod(blob, 0o644)
                data = bytearray(blob.read_bytes())
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
                blob.write_bytes(bytes(data))
                os.chmod(blob, 0o444)
                row.faults += 1
            for k, d in contents.items():  # a full verification never serves a flipped byte
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got = Cache(work / f"flip{r}", remote=False).get_or_build(
                        "flip", k, {"extra": {"k": k}}, lambda out, d=d: (out / "f.bin").write_bytes(d), verify="full")
                row.trials += 1
                if got.file().read_bytes() != d:
                    row.corrupt += 1
            row.lost += sum(1 for k in contents if k not in damaged and not arts[k].path.is_dir())
        row.note = "one bit flipped in 5 of 20 blobs per round; loads use verify='full'"

    return run


# ---- a full disk ---------------------------------------------------------------------------


def disk_full(work: Path, trials: int) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        mount = work / "small"
        mount.mkdir()
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                              capture_output=True, text=True)
        if made.returncode != 0:
            row.note = f"skipped: cannot mount a small tmpfs here ({made.stderr.strip()[:60]})"
            return
        try:
            cache = Cache(mount / "store", remote=False)
            kept = cache.get_or_build("disk", "small", {}, lambda out: (out / "f").write_bytes(b"x" * 1000))
            for i in range(trials):
                size = random.Random(i).randint(1, 6) << 20
                try:
                    cache.get_or_build("disk", f"big{i}", {"extra": {"i": i}},
                                       lambda out, n=size: (out / "f").write_bytes(os.urandom(n)))
                except OSError:
                    row.faults += 1  # ENOSPC reached the caller as an error, as it should
                row.trials += 1
                row.corrupt += len(faultlib.partial_entries(cache))
                row.lost += 0 if (kept.path / "f").read_bytes() == b"x" * 1000 else 1
                for leftover in cache.store.layout.tmp.iterdir():  # gc's job; keep the disk usable
                    shutil.rmtree(leftover, ignore_errors=True)
            row.note = "4 MiB tmpfs; builds of 1-6 MiB"
        finally:
            subprocess.run(["umount", str(mount)], capture_output=True)

    return run


# ---- remote faults ---------------------------------------------------------------------------

REMOTE_FAULTS = ["refused", "silent", "altered blob", "truncated blob", "tampered manifest", "parent paths"]


def remote_faults(work: Path, rounds: int) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        from remote_fixtures import Raw

        os.environ.update(servers.CREDENTIALS)
        with servers.seaweedfs_s3() as endpoint, servers.redis_server() as redis:
            for r in range(rounds):
                for engine in ("s3", "redis"):
                    for fault in REMOTE_FAULTS:
                        prefix = f"f{r}{engine[0]}{REMOTE_FAULTS.index(fault)}"
                        url = servers.s3_url(endpoint, prefix) if engine == "s3" else redis.url(prefix)
                        client = servers.raw_s3(endpoint) if engine == "s3" else redis.client()
                        one_remote_fault(work / prefix, url, Raw(url, client, prefix), fault, row)

    return run


def one_remote_fault(work: Path, url: str, raw: object, fault: str, row: Row) -> None:
    remote_mod.reset()
    with servers.silent_server() as silent:
        if fault in ("refused", "silent"):
            port = silent if fault == "silent" else servers.refused_port()
            url = (f"s3://abicache-test/p?endpoint=http://127.0.0.1:{port}" if url.startswith("s3")
                   else f"redis://127.0.0.1:{port}/0")
        else:
            a = Cache(work / "A", remote=url)
            art = a.get_or_build("rf", "x", {}, lambda out: (out / "lib.so").write_bytes(b"genuine" * 100))
            sha = art.manifest.files[0].sha256
            doc = json.loads(raw.manifests("rf", art.key)[art.variant])
            if fault == "altered blob":
                raw.put_blob(sha, b"G" + b"genuine"[1:] + b"genuine" * 99)
            elif fault == "truncated blob":
                raw.put_blob(sha, b"genuine" * 50)
            elif fault == "tampered manifest":
                doc["requirements"] = ["platform.machine == x86_64"]  # any edit breaks the variant id
                raw.put_manifest("rf", art.key, art.variant, json.dumps(doc).encode())
            else:
                doc["files"] = {"../../evil.so": doc["files"]["lib.so"]}
                raw.put_manifest("rf", art.key, art.variant, json.dumps(doc).encode())
        b = Cache(work / "B", remote=url)
        start = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = b.get_or_build("rf", "x", {}, lambda out: (out / "lib.so").write_bytes(b"local"))
        elapsed = time.monotonic() - start
    row.trials += 1
    row.faults += 1
    if elapsed > 8:
        row.hangs += 1
    if got.origin != "built" or got.file().read_bytes() != b"local":
        row.corrupt += 1  # something from the faulty remote was used
    if not verify_store(b.store, full=True).clean or list(work.rglob("evil.so")):
        row.corrupt += 1


# ---- main ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few trials of each kind")
    parser.add_argument("--only", metavar="TEXT", help="only the rows whose name contains TEXT (e.g. fleet)")
    args = parser.parse_args()
    scale = 0.05 if args.quick else 1.0
    os.environ["ABICACHE_PROGRESS"] = "0"
    work = Path(tempfile.mkdtemp(prefix="abicache-faults-"))
    plan = [
        (Row("SIGKILL during build and publish"), crashes(work, max(40, int(3000 * scale)))),
        (Row("16 processes racing (single flight)"), concurrency(work, max(1, int(5 * scale)), 16)),
        (Row("bit flips in stored blobs"), byte_flips(work, max(1, int(10 * scale)))),
        (Row("disk full (ENOSPC)"), disk_full(work, max(5, int(40 * scale)))),
        (Row("remote faults (S3 + Redis)"), remote_faults(work, max(1, int(5 * scale)))),
        (Row("hostile co-user plants code (as nobody)"), attacks.co_user(work, max(3, int(12 * scale)))),
        (Row("bit flips in place, default verify policy"), attacks.default_policy_flips(work, max(2, int(6 * scale)))),
        (Row("slow-drip Redis (1 byte/s)"), attacks.slow_drip(work, max(1, int(3 * scale)))),
        (Row("broken states recover"), attacks.unrecoverable(work, max(1, int(5 * scale)))),
        (Row("oversize remote values (memory)"), attacks.remote_memory(work, 256 << 20 if scale == 1 else 64 << 20)),
        (Row("fleet: a holder's build hangs (S3, Redis)"), fleet.stuck_lease(work)),
        (Row("fleet: a forged lease, signed fleet"), fleet.forged_lease(work)),
        (Row("fleet: a build failing on 4 machines"), fleet.failing_build(work)),
        (Row("fleet: clocks 3 minutes apart"), fleet.skewed_clock(work)),
        (Row("fleet: variant flood, Redis"), fleet.variant_flood(work, "redis", 256 if scale == 1 else 32)),
        (Row("fleet: variant flood, S3"), fleet.variant_flood(work, "s3", 256 if scale == 1 else 32)),
        (Row("fleet: gc during a link"), fleet.gc_during_link(work, max(2, int(8 * scale)))),
        (Row("fleet: prune during a publish"), fleet.prune_during_publish(work)),
        (Row("fleet: planted tools/ memo"), fleet.planted_memo(work)),
        (Row("fleet: hostile inline source names"), fleet.hostile_inline_names(work)),
        (Row("fleet: remote extra not installed"), fleet.missing_extra(work)),
        *neighbours.rows(work, scale, lambda name: Row(f"neighbour: {name}")),
    ]
    if args.only:
        plan = [(row, fn) for row, fn in plan if args.only.lower() in row.kind.lower()]
    rows = []
    for row, fn in plan:
        print(f"faults: {row.kind} ...", file=sys.stderr, flush=True)
        rows.append(timed(fn, row))
    shutil.rmtree(work, ignore_errors=True)
    attacks.hostile.cleanup()
    report(rows)
    broken = os.environ.get("ABICACHE_TEST_BROKEN_PUBLISH") == "1"
    bad = sum(r.corrupt + r.hangs + r.lost + r.planted + r.changed + r.unrecoverable + r.refused + r.outside
              + r.excess + r.stale for r in rows)
    if broken:
        print(f"broken publish switch on: the harness {'caught it' if bad else 'MISSED it'} ({bad} failures)")
    return 1 if bad else 0


def report(rows: list[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Fault injection", title_justify="left")
    for col in ("trials of", "trials", "faults injected", "corrupt entries seen", "hangs", "data lost",
                "planted loads", "changed bytes run", "unrecoverable keys", "builds refused after the fix",
                "written outside", "checks over the cap", "stale served", "time", "notes"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(r.kind, str(r.trials), str(r.faults), str(r.corrupt), str(r.hangs), str(r.lost),
                  str(r.planted), str(r.changed), str(r.unrecoverable), str(r.refused), str(r.outside),
                  str(r.excess), str(r.stale), f"{r.seconds:.0f} s", r.note)
    Console(width=240).print(t)
    RESULTS.mkdir(exist_ok=True)
    name = "faults-broken.json" if os.environ.get("ABICACHE_TEST_BROKEN_PUBLISH") == "1" else "faults.json"
    (RESULTS / name).write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
