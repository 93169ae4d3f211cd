"""`import abicache` stays light; the hit path imports no torch and spawns nothing."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from abicache import Cache, cc
from conftest import need, run_py

# ctypes is not here: abicache.cc imports it so that the first hit does not pay for it.
HEAVY = ["torch", "triton", "filelock", "platformdirs", "elftools", "abi3info", "rich", "boto3",
         "obstore", "redis", "cryptography", "packaging", "subprocess", "logging", "dataclasses",
         "tempfile", "abicache.explain", "abicache.store.lock", "abicache.cli"]


def test_import_abicache_pulls_in_nothing_heavy() -> None:
    # Only what abicache itself adds counts: site hooks may load some of these first.
    code = (f"import sys, json; before = set(sys.modules); import abicache; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules and m not in before]))")
    out = run_py(code, env={"ABICACHE_DIR": "/nonexistent"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


HIT = textwrap.dedent("""
    import json, os, subprocess, sys
    import abicache
    spawned = []
    def refuse(*a, **k):
        spawned.append(a[0] if a else k)
        raise AssertionError("the hit path must not spawn a process")
    subprocess.Popen.__init__ = refuse
    os.posix_spawn = os.posix_spawnp = os.fork = refuse
    from abicache import Cache, cc
    lib = cc.load_library("hitlib", [SRC], cache=Cache(ROOT))
    print(json.dumps({"value": lib.answer(), "spawned": spawned,
                      "heavy": [m for m in ("torch", "triton", "filelock", "elftools", "rich") if m in sys.modules]}))
""")


def test_a_fresh_process_hit_spawns_nothing_and_imports_no_torch(tmp_path: Path) -> None:
    need("c++")
    src = 'extern "C" int answer() { return 7; }'
    root = tmp_path / "store"
    cc.build_library("hitlib", [src], cache=Cache(root))  # also fills the compiler-identity memo
    out = run_py(HIT.replace("SRC", repr(src)).replace("ROOT", repr(str(root))))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"value": 7, "spawned": [], "heavy": []}


def test_a_hit_writes_nothing_within_the_touch_interval(tmp_path: Path) -> None:
    need("c++")
    root = tmp_path / "store"
    src = 'extern "C" int answer() { return 8; }'
    cc.build_library("quiet", [src], cache=Cache(root))
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    assert cc.build_library("quiet", [src], cache=Cache(root)).hit
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before
