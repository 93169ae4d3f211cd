"""Fault-injection harness shared by the tests (few trials, asserted) and
bench/faults.py (thousands, counted): SIGKILL builders at random moments and
look for anything a reader could see that is not a whole, valid entry."""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

from abicache import Cache
from abicache.store.manifest import RESERVED_PREFIX

KEYS = 11  # contents repeat every KEYS trials: blobs are shared across keys


def payload(i: int) -> dict[str, bytes]:
    # Some files are shared between keys (blob adoption), some unique.
    return {
        "lib.so": os.urandom(2048),
        "shared/common.bin": b"common" * 1000,
        "data.bin": bytes([i % KEYS]) * (1 + 4096 * (i % 3)),
    }


def child(root: Path, i: int) -> None:
    cache = Cache(root, lock_timeout=30, remote=False)

    def build(out: Path) -> None:
        for name, data in payload(i).items():
            path = out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            time.sleep(random.random() * 0.002)

    cache.get_or_build("crash", f"k{i}", {"sources": {"s": str(i)}}, build)


def fork_child(root: Path, i: int, seed: int) -> int:
    pid = os.fork()
    if pid == 0:  # child: build, publish, and exit without cleanup
        code = 0
        try:
            random.seed(seed * 1000 + i)
            child(root, i)
        except BaseException:
            code = 1
        os._exit(code)
    return pid


def calibrate(root: Path) -> float:
    """How long one uncontended build-and-publish takes here (a throwaway store)."""
    times = []
    for i in range(5):
        start = time.perf_counter()
        _, status = os.waitpid(fork_child(root, i, 0), 0)
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            raise RuntimeError("an unkilled build failed; the harness cannot calibrate")
        times.append(time.perf_counter() - start)
    return sorted(times)[2]


def partial_entries(cache: Cache, since: float = 0.0) -> list[str]:
    """Every visible variant that is not a whole, valid entry (what a reader could load);
    with since, only those changed since then (a trial can only touch its own entry)."""
    problems = []
    for vdir in cache.store.iter_variant_dirs():
        if since and vdir.stat().st_mtime < since:
            continue
        try:
            manifest = cache.store.read_manifest(vdir)
        except Exception as exc:  # noqa: BLE001  any failure to read is a partial entry
            problems.append(f"{vdir}: {exc}")
            continue
        found = cache.store.full_problem(vdir, manifest)
        listed = sorted([f.path for f in manifest.files] + [n for n in ["manifest.json"] if (vdir / n).exists()])
        present = sorted(p.relative_to(vdir).as_posix() for p in vdir.rglob("*")
                         if p.is_file() and not p.name.startswith(RESERVED_PREFIX))  # stamps are the store's
        if found is not None or present != listed:
            problems.append(f"{vdir}: {found[0] if found else 'files differ from the manifest'}")
    return problems


def crash_trials(root: Path, trials: int, seed: int, first: int = 0) -> dict[str, int]:
    """Kill a builder at a random moment in each trial; count what was left visible.
    Trial i builds key k<first + i>: a later round given a new `first` builds keys no
    earlier round finished (a key built before is a hit, which stages nothing)."""
    calibration = root.with_name(root.name + "-calibration")
    shutil.rmtree(calibration, ignore_errors=True)  # builds, not the hits a second round would find
    window = 1.3 * calibrate(calibration)
    rng = random.Random(seed)
    cache = Cache(root, remote=False)
    counts = {"trials": 0, "killed": 0, "finished": 0, "killed_while_staging": 0, "corrupt": 0}
    for i in range(trials):
        tmp = cache.store.layout.tmp
        staged = len(list(tmp.iterdir())) if tmp.exists() else 0
        started = time.time() - 1.0  # mtimes have coarse granularity on some filesystems
        pid = fork_child(root, first + i, seed)
        time.sleep(rng.random() * window)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        counts["trials"] += 1
        counts["killed" if os.WIFSIGNALED(status) else "finished"] += 1
        if tmp.exists() and len(list(tmp.iterdir())) > staged:
            counts["killed_while_staging"] += 1  # died between stage creation and rename
        counts["corrupt"] += len(partial_entries(cache, since=started))
    return counts
