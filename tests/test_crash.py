"""SIGKILL builders at random moments of build and publish.

After every kill: no partial entry is visible (every variant directory has a
valid manifest and files that hash to it). After all of them: the next call
for every key succeeds without hanging, and `abicache verify --full` is clean.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import filelock  # noqa: F401  imported before forking, so children start building at once
import pytest

from abicache import Cache
from abicache.cli import main as cli_main
from conftest import SRC

KEYS = 11  # contents repeat every KEYS trials: blobs are shared across keys


def _payload(i: int) -> dict[str, bytes]:
    # Some files are shared between keys (blob adoption), some unique.
    return {
        "lib.so": os.urandom(2048),
        "shared/common.bin": b"common" * 1000,
        "data.bin": bytes([i % KEYS]) * (1 + 4096 * (i % 3)),
    }


def _child(root: Path, i: int) -> None:
    cache = Cache(root, lock_timeout=30)

    def build(out: Path) -> None:
        for name, data in _payload(i).items():
            path = out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            time.sleep(random.random() * 0.002)

    cache.get_or_build("crash", f"k{i}", {"sources": {"s": str(i)}}, build)


def _assert_no_partial_entry(cache: Cache) -> None:
    for vdir in cache.store.iter_variant_dirs():
        manifest = cache.store.read_manifest(vdir)  # raises if partial
        assert cache.store.full_problem(vdir, manifest) is None, vdir
        assert sorted(p.relative_to(vdir).as_posix() for p in vdir.rglob("*") if p.is_file()) == sorted(
            [f.path for f in manifest.files] + ["manifest.json"]
        )


def _fork_child(root: Path, i: int, seed: int) -> int:
    pid = os.fork()
    if pid == 0:  # child: build, publish, and exit without cleanup
        code = 0
        try:
            random.seed(seed * 1000 + i)
            _child(root, i)
        except BaseException:
            code = 1
        os._exit(code)
    return pid


def _calibrate(root: Path) -> float:
    """How long one uncontended build-and-publish takes here (a throwaway store)."""
    times = []
    for i in range(5):
        start = time.perf_counter()
        _, status = os.waitpid(_fork_child(root, i, 0), 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        times.append(time.perf_counter() - start)
    return sorted(times)[2]


def run_trials(root: Path, trials: int, seed: int) -> dict[str, int]:
    if threading.active_count() != 1:
        pytest.skip("fork-based trials need a single-threaded test process")
    window = 1.3 * _calibrate(root.with_name(root.name + "-calibration"))
    rng = random.Random(seed)
    cache = Cache(root)
    counts = {"killed": 0, "finished": 0, "killed_while_staging": 0}
    for i in range(trials):
        staged = len(list(cache.store.layout.tmp.iterdir())) if cache.store.layout.tmp.exists() else 0
        pid = _fork_child(root, i, seed)
        time.sleep(rng.random() * window)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            counts["killed"] += 1
        else:
            assert os.WEXITSTATUS(status) == 0
            counts["finished"] += 1
        if len(list(cache.store.layout.tmp.iterdir())) > staged:
            counts["killed_while_staging"] += 1  # died between stage creation and rename
        _assert_no_partial_entry(cache)
    return counts


def _check_recovery(root: Path, trials: int) -> None:
    cache = Cache(root, lock_timeout=20)
    for k in range(trials):
        start = time.monotonic()
        art = cache.get_or_build("crash", f"k{k}", {"sources": {"s": str(k)}},
                                 lambda out: (out / "lib.so").write_bytes(b"fresh"))
        assert time.monotonic() - start < 10
        assert art.path.is_dir()
    assert cli_main(["verify", "--full", "--root", str(root)]) == 0


def test_sigkill_during_build_and_publish(tmp_path: Path) -> None:
    counts = run_trials(tmp_path / "store", trials=40, seed=1)
    assert counts["killed"] > 0 and counts["killed_while_staging"] > 0, counts
    _check_recovery(tmp_path / "store", 40)


@pytest.mark.stress
def test_sigkill_stress(tmp_path: Path) -> None:
    counts = run_trials(tmp_path / "store", trials=300, seed=2)
    assert counts["killed_while_staging"] >= 30 and counts["finished"] >= 10, counts
    _check_recovery(tmp_path / "store", 300)


COMPILE = textwrap.dedent("""
    import sys
    from abicache import Cache, cc
    cc.build_library("crashy", ['extern "C" int seven() { return 7; }'], cache=Cache(sys.argv[1]))
""")


@pytest.mark.parametrize("trial", range(4))
def test_sigkill_during_a_real_compile(tmp_path: Path, trial: int) -> None:
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-c", COMPILE, str(root)], env=env)
    time.sleep(0.15 + 0.1 * trial)
    proc.kill()
    proc.wait()
    _assert_no_partial_entry(Cache(root))
    from abicache import cc
    import ctypes

    art = cc.build_library("crashy", ['extern "C" int seven() { return 7; }'], cache=Cache(root, lock_timeout=20))
    assert ctypes.CDLL(str(art.file())).seven() == 7
    assert cli_main(["verify", "--full", "--root", str(root)]) == 0
