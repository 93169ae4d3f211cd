"""A store on a shared filesystem (NFS, Lustre, a volume shared by pods): no hard
links, no flock, and ENOENT / EBUSY / ESTALE from another machine's writes and
removals. tests/fsfault.c (LD_PRELOAD, compiled here) makes each of these
happen; tests/sharedfs.py runs the trials. bench/faults.py runs every step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SRC

import sharedfs

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("cc") is None
                                or shutil.which("c++") is None,
                                reason="the fault layer is an LD_PRELOAD library built with cc (Linux)")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("fsfault")
    return sharedfs.compile_fault_layer(out), sharedfs.compile_payload(out)


def _env(layer: Path, **flags: str) -> dict[str, str]:
    return {**os.environ, "LD_PRELOAD": str(layer), "PYTHONPATH": f"{SRC}{os.pathsep}{HERE}", **flags}


def _trials(built: tuple[Path, Path], work: Path, every: int, **flags: str) -> dict:
    layer, payload = built
    out = subprocess.run([sys.executable, "-W", "ignore", str(HERE / "sharedfs.py"), str(work), str(payload),
                          "ENOENT,EBUSY,ESTALE", str(every)], env=_env(layer, **flags), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("filesystem", ["local", "no-links-no-flock"])
def test_an_error_at_any_step_of_publish_or_lookup_is_retried(built: tuple[Path, Path], tmp_path: Path,
                                                             filesystem: str) -> None:
    """Every 7th step of a publish and every step of a lookup fails once, with each errno:
    the caller still gets the right bytes, and no good entry is quarantined."""
    flags = {"ABICACHE_FAULT_NOLINK": "1", "ABICACHE_FAULT_NOFLOCK": "1"} if filesystem != "local" else {}
    got = _trials(built, tmp_path, 7, **flags)
    print(json.dumps(got))
    assert got["steps"]["publish"] > 50 and got["steps"]["lookup"] > 5, got
    assert got["injected"] >= 0.9 * got["trials"], got  # the faults did happen
    assert (got["wrong"], got["crash"], got["quarantined"], got["partial"]) == (0, 0, 0, 0), got
    assert got["ok"] == got["trials"]


RACER = """
import sys, time
from pathlib import Path
from abicache import Cache, cc
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
lib = cc.load_library("answer", ['extern "C" int answer(void) { return 42; }'], cache=Cache(Path(sys.argv[1])))
print(lib.answer())
"""


def test_eight_machines_on_a_filesystem_without_links_or_locks(built: tuple[Path, Path], tmp_path: Path) -> None:
    """8 processes, one real library: each loads a correct build; the store holds
    one whole entry whose files are its own (no blobs), and verify and gc keep it."""
    layer, _ = built
    store = tmp_path / "store"
    env = _env(layer, ABICACHE_FAULT_NOLINK="1", ABICACHE_FAULT_NOFLOCK="1")
    start = str(time.time() + 2.0)
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", RACER, str(store), start], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [o[1][-2000:] for o in outs]
    assert [o[0].strip() for o in outs] == ["42"] * 8
    entries = list((store / "v3" / "entries").glob("*/*/*.*"))  # entry folders, not the variants links
    assert len(entries) == 1, entries
    blobs = [p for p in (store / "v3" / "blobs").rglob("*") if p.is_file()] if (store / "v3" / "blobs").exists() \
        else []
    assert blobs == []  # link() failed: the entry keeps its own files
    for command in (["verify", "--full"], ["gc", "--max-age", "3650d"]):
        out = subprocess.run([sys.executable, "-m", "abicache", *command, "--json"], env={**env, "ABICACHE_DIR":
                             str(store)}, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
    assert list((store / "v3" / "entries").glob("*/*/*.*")) == entries
    again = subprocess.run([sys.executable, "-c", RACER, str(store), "0"], env=env, capture_output=True, text=True,
                           timeout=120)
    assert again.stdout.strip() == "42", again.stderr[-2000:]
