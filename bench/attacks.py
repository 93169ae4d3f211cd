"""bench/faults.py rows for the store-safety attacks: a hostile co-user, a
changed byte under the default verify policy, a slow-drip Redis, states
that never recovered, and oversize remote values. Each returns counts the
report prints: planted loads, changed bytes run, hangs, unrecoverable keys.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ABICACHE_PROGRESS": "0"}

import hostile  # noqa: E402  (tests/ is on sys.path: bench/faults.py puts it there)
import servers  # noqa: E402
from abicache import Cache, cc  # noqa: E402
from abicache.store.verify import verify_store  # noqa: E402

Row = Any  # bench.faults.Row (a dataclass with the counters)

# Loads the cc library "answer" from a store in a fresh process; prints what it returned.
LOAD = textwrap.dedent("""
    import sys, warnings
    warnings.simplefilter("ignore")
    from abicache import Cache, cc
    GOOD = sys.argv[2]
    print(cc.load_library("answer", [GOOD], cache=Cache(sys.argv[1], remote=False)).answer())
""")


def _load_answer(root: Path, mark: Path, shared: str) -> int:
    env = {**ENV, "ABICACHE_PLANTED_MARK": str(mark), "ABICACHE_SHARED": shared}
    done = subprocess.run([sys.executable, "-c", LOAD, str(root), hostile.GOOD_C], capture_output=True, text=True,
                          env=env, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-500:])
    return int(done.stdout.strip().splitlines()[-1])


# ---- a hostile co-user -----------------------------------------------------------------------


def co_user(work: Path, trials: int) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        why = hostile.why_not()
        if why:
            row.note = f"skipped: {why}"
            return
        evil_file = hostile.evil_file(work)
        evil = evil_file.read_bytes()
        legit = work / "legit"
        art = cc.build_library("answer", [hostile.GOOD_C], cache=Cache(legit, remote=False))
        rel = art.path.relative_to(legit)
        plant = hostile.copy_tree(art.path)
        hostile.forge(plant, work / "unused-blobs", evil)
        landed = 0
        for t in range(trials):
            scenario = ("fresh store", "store left 0777", "root owned by nobody")[t % 3]
            mark = work / f"PLANTED-{t}"
            root = _victim_root(work, t, scenario, legit, rel, plant, evil)
            if scenario != "root owned by nobody":
                planted = hostile.as_attacker("sh", "-c", hostile.plant_command(root, rel, plant, evil_file),
                                              check=False)
                landed += planted.returncode == 0
            row.trials += 1
            row.faults += 1
            try:
                # the attacker's own root is offered as a cache shared with a group it is not in
                got = _load_answer(root, mark, "users" if scenario == "root owned by nobody" else "")
            except RuntimeError as exc:  # the root owned by nobody is refused: that is the right answer
                got = 42 if "owned by uid 65534" in str(exc) else -1
            row.planted += int(got == 666 or mark.exists())
            row.corrupt += int(got not in (42, 666))
        row.note = (f"nobody plants the victim's next key via setpriv; {landed} plants reached the store "
                    "(only where an old version left it 0777); fresh/0777/foreign-root rotated")

    return run


def _victim_root(work: Path, t: int, scenario: str, legit: Path, rel: Path, plant: Path, evil: bytes) -> Path:
    pub = hostile.public_dir()
    root = pub / "store"
    if scenario == "root owned by nobody":  # the attacker's own root, offered as a shared cache
        forged = hostile.copy_tree(legit)
        hostile.forge(forged / rel, forged / "v3" / "blobs", evil)
        hostile.as_attacker("sh", "-c", f"cp -a '{forged}' '{root}' && chmod -R go-w '{root}'")
        return root
    root.mkdir()
    root.chmod(0o755)
    old = os.umask(0)
    try:
        Cache(root, remote=False).get_or_build("t", "first", {}, lambda out: (out / "f").write_bytes(b"x"))
    finally:
        os.umask(old)
    if scenario == "store left 0777":
        for folder, _, _ in os.walk(root / "v3"):
            os.chmod(folder, 0o777)
    return root


# ---- a changed byte under the default policy ---------------------------------------------------


def default_policy_flips(work: Path, rounds: int) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        rng = random.Random(13)
        for r in range(rounds):
            root = work / f"dflip{r}"
            contents = {f"k{i}": os.urandom(rng.randint(1, 50_000)) for i in range(20)}
            arts = {k: Cache(root, remote=False).get_or_build("flip", k, {"extra": {"k": k}},
                                                            lambda out, d=d: (out / "f.bin").write_bytes(d))
                    for k, d in contents.items()}
            if r % 2:  # half the rounds: stamps written by an earlier hit, so only ctime can tell
                time.sleep(2.1)
                for k, d in contents.items():
                    Cache(root, remote=False).get_or_build("flip", k, {"extra": {"k": k}}, lambda out: None)
            for k in rng.sample(sorted(arts), 5):
                path = arts[k].path / "f.bin"
                os.chmod(path, 0o644)
                with open(path, "r+b") as fh:  # same size, same inode; mode restored
                    pos = rng.randrange(len(contents[k]))
                    fh.seek(pos)
                    fh.write(bytes([contents[k][pos] ^ (1 << rng.randrange(8))]))
                os.chmod(path, 0o444)
                row.faults += 1
            for k, d in contents.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got = Cache(root, remote=False).get_or_build(  # the default verify policy
                        "flip", k, {"extra": {"k": k}}, lambda out, d=d: (out / "f.bin").write_bytes(d))
                row.trials += 1
                row.changed += int(got.file().read_bytes() != d)
        row.note = "one bit flipped in place in 5 of 20 files per round, mode restored; default verify policy"

    return run


# ---- a slow-drip Redis ------------------------------------------------------------------------------

DRIP_CLIENT = textwrap.dedent("""
    import json, sys, time, warnings
    warnings.simplefilter("ignore")
    from abicache import Cache
    start = time.monotonic()
    art = Cache(sys.argv[1], remote=sys.argv[2]).get_or_build(
        "t", "drip" + sys.argv[3], {}, lambda out: (out / "f").write_bytes(b"local"))
    print(json.dumps([time.monotonic() - start, art.origin]))
""")


def slow_drip(work: Path, trials: int) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        why = servers.redis_available()
        if why:
            row.note = f"skipped: {why}"
            return
        worst = 0.0
        with servers.redis_server(tls=False) as server, servers.drip_proxy(server.port, 1.0) as port:
            for t in range(trials):
                url = server.base.replace(f":{server.port}", f":{port}") + f"/0?prefix=drip{t}"
                row.trials += 1
                row.faults += 1
                try:
                    done = subprocess.run([sys.executable, "-c", DRIP_CLIENT, str(work / f"drip{t}"), url, str(t)],
                                          capture_output=True, text=True, timeout=60,
                                          env={**ENV, "ABICACHE_REMOTE_TIMEOUT": "2"})
                except subprocess.TimeoutExpired:
                    row.hangs += 1
                    continue
                seconds, origin = json.loads(done.stdout.strip().splitlines()[-1])
                worst = max(worst, seconds)
                row.hangs += int(seconds > 20)
                row.corrupt += int(origin != "built")
        row.note = f"Redis answering 1 byte/s, ABICACHE_REMOTE_TIMEOUT=2; slowest lookup {worst:.1f} s"

    return run


# ---- states that never recovered --------------------------------------------------------------------


def _no_manifest(cache: Cache, art: Any) -> None:
    hostile.remove_manifest(art.path)


def _tmp_deleted(cache: Cache, art: Any) -> None:
    shutil.rmtree(cache.store.layout.tmp)


def _every_folder_deleted(cache: Cache, art: Any) -> None:
    for name in ("tmp", "blobs", "locks", "quarantine", "trash", "index", "log"):
        shutil.rmtree(cache.store.layout.base / name, ignore_errors=True)


def _edited_requirements(cache: Cache, art: Any) -> None:
    doc = hostile.manifest_doc(art.path)
    doc["requirements"] = ["platform.machine == nowhere"]
    hostile.rewrite_manifest(art.path, json.dumps(doc).encode())


def _folders_left_open(cache: Cache, art: Any) -> None:
    for folder, _, _ in os.walk(cache.store.layout.base):
        os.chmod(folder, 0o777)


def _truncated_file(cache: Cache, art: Any) -> None:
    path = art.path / "lib.so"
    path.chmod(0o644)
    path.write_bytes(b"")
    path.chmod(0o444)


BREAKAGES = {"no manifest": _no_manifest, "tmp/ deleted": _tmp_deleted,
             "every folder deleted": _every_folder_deleted, "requirements edited": _edited_requirements,
             "folders left 0777": _folders_left_open, "file truncated": _truncated_file}

RECOVER = textwrap.dedent("""
    import sys, warnings
    warnings.simplefilter("ignore")
    from abicache import Cache
    for attempt in range(3):  # every later process must get a working entry, not just the next one
        art = Cache(sys.argv[1], remote=False).get_or_build(
            "t", "x", {}, lambda out: (out / "lib.so").write_bytes(b"genuine"))
        assert art.file().read_bytes() == b"genuine", art.file().read_bytes()
    print("ok")
""")


def unrecoverable(work: Path, rounds: int) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        for r in range(rounds):
            for i, breakage in enumerate(BREAKAGES.values()):
                root = work / f"state{r}-{i}"
                cache = Cache(root, remote=False)
                art = cache.get_or_build("t", "x", {}, lambda out: (out / "lib.so").write_bytes(b"genuine"))
                breakage(cache, art)
                row.trials += 1
                row.faults += 1
                done = subprocess.run([sys.executable, "-c", RECOVER, str(root)], capture_output=True, text=True,
                                      env=ENV, timeout=120)
                row.unrecoverable += int(done.returncode != 0 or "ok" not in done.stdout)
                report = verify_store(Cache(root, remote=False).store, full=True)
                row.corrupt += len(report.problems)
        row.note = "each of: " + ", ".join(BREAKAGES) + "; then 3 fresh processes per state"

    return run


# ---- oversize remote values ------------------------------------------------------------------------

MEMORY_CLIENT = textwrap.dedent("""
    import json, re, sys, warnings
    warnings.simplefilter("ignore")
    from abicache import Cache
    art = Cache(sys.argv[1], remote=sys.argv[2]).get_or_build(
        "t", "mem", {}, lambda out: (out / "f").write_bytes(b"local bytes"))
    peak = int(re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10
    print(json.dumps([peak, art.origin]))
""")


def remote_memory(work: Path, size: int) -> Callable[[Row], None]:
    def run(row: Row) -> None:
        why = servers.redis_available()
        if why:
            row.note = f"skipped: {why}"
            return
        growth = []
        with servers.redis_server() as server:
            client = server.client()
            for case in ("blob", "manifest"):
                prefix = f"mem{case}"
                url = server.url(prefix)
                art = Cache(work / f"{case}A", remote=url).get_or_build(
                    "t", "mem", {}, lambda out: (out / "f").write_bytes(b"local bytes"))
                baseline = _peak(work / f"{case}B0", url)
                if case == "blob":  # a frame of a few KiB that inflates to `size` (remote/packed.py)
                    import zstandard

                    client.set(f"{prefix}:v2:b:{art.manifest.files[0].sha256}.zst",
                               zstandard.ZstdCompressor().compress(b"\0" * size))
                else:
                    client.hset(f"{prefix}:v2:m:t:{art.key}", "0123456789abcdef", b"{" * size)
                grew = _peak(work / f"{case}B1", url) - baseline
                growth.append(grew)
                row.trials += 1
                row.faults += 1
                row.corrupt += int(grew > size // 4)  # read before it was bounded
        row.note = (f"Redis holds {size >> 20} MiB where 11 bytes are announced; peak RSS grew "
                    + " / ".join(f"{g / 2**20:.1f} MiB" for g in growth) + " (blob / manifest)")

    return run


def _peak(root: Path, url: str) -> int:
    done = subprocess.run([sys.executable, "-c", MEMORY_CLIENT, str(root), url], capture_output=True, text=True,
                          env=ENV, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-500:])
    return int(json.loads(done.stdout.strip().splitlines()[-1])[0])
