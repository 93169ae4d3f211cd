"""`import abicache` stays light; the hit path imports no torch, spawns nothing and compiles no pattern."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

from abicache import Cache, cc
from conftest import need, run_py

# ctypes is not here: abicache.cc imports it so that the first hit does not pay for it.
HEAVY = ["torch", "triton", "filelock", "platformdirs", "elftools", "abi3info", "rich", "boto3",
         "obstore", "redis", "cryptography", "packaging", "subprocess", "logging", "dataclasses",
         "tempfile", "abicache.core.explain", "abicache.store.lock", "abicache.cli"]


def test_import_abicache_pulls_in_nothing_heavy() -> None:
    # Only what abicache itself adds counts: site hooks may load some of these first.
    code = (f"import sys, json; before = set(sys.modules); import abicache; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules and m not in before]))")
    out = run_py(code, env={"ABICACHE_DIR": "/nonexistent"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


# Counts the patterns compiled (re's own cache aside): a fresh process's hit compiles none.
# STRICT counts every one. Otherwise a pattern another module compiles at its own import
# (urllib.parse's, when the full lookup's `import pathlib` is the first in a clean venv: no
# .pth imported it at startup) is the interpreter's cost of that module and is not counted;
# one compiled by abicache's code, or by any function at the time abicache calls it, is.
# A hit its record serves (hits/) imports no pathlib: it is counted strictly.
COUNT_PATTERNS = textwrap.dedent("""
    import re, sys
    compiled = []
    _engine = getattr(re, "_compiler", None) or __import__("sre_compile")  # 3.10: sre_compile
    _compile = _engine.compile
    def _count(p, flags=0):
        caller = sys._getframe(1)
        while caller is not None and caller.f_globals.get("__name__", "").split(".")[0] in ("re", "sre_compile"):
            caller = caller.f_back
        imported = caller is not None and caller.f_code.co_name == "<module>"
        if STRICT or not imported or caller.f_globals.get("__name__", "").split(".")[0] == "abicache":
            compiled.append(str(getattr(p, "pattern", p))[:60])
        return _compile(p, flags)
    _engine.compile = _count
""")

HIT = textwrap.dedent("""
    import json, os, subprocess, sys
""") + COUNT_PATTERNS + textwrap.dedent("""
    import abicache
    spawned = []
    def refuse(*a, **k):
        spawned.append(a[0] if a else k)
        raise AssertionError("the hit path must not spawn a process")
    subprocess.Popen.__init__ = refuse
    os.posix_spawn = os.posix_spawnp = os.fork = refuse
    from abicache import Cache, cc
    lib = cc.load_library("hitlib", [SRC], cache=Cache(ROOT))
    served = type(next(iter(cc._loaded.values()))[0]).__name__ == "Served"
    print(json.dumps({"value": lib.answer(), "spawned": spawned,
                      "heavy": [m for m in HEAVY if m in sys.modules], "compiled": compiled, "served": served,
                      "blake2": "_blake2" in sys.modules, "sha256": "_sha256" in sys.modules,
                      "engine": "abicache.engine" in sys.modules}))
""")


#: nor what only a miss uses: the other stores and tiers, the fallback store, the CUDA probe
#: (the entry asks no CUDA fact), the build's tools
HIT_HEAVY = ("torch", "triton", "filelock", "elftools", "rich", "shlex", "abicache.store.asked", "abicache.shipping.tiers",
             "abicache.core.fallback", "abicache.env.cuda_probe", "abicache.store.lock", "abicache.audit")


def test_a_fresh_process_hit_spawns_nothing_and_imports_no_torch(tmp_path: Path) -> None:
    """The first process after the build looks the entry up in full (and records it); a later
    one is served by its record and compiles no pattern at all, counted strictly (issue 48:
    in a clean venv the full lookup's pathlib imports urllib.parse, which compiles one)."""
    need("c++")
    src = 'extern "C" int answer() { return 7; }'
    root = tmp_path / "store"
    cc.build_library("hitlib", [src], cache=Cache(root))  # also fills the compiler-identity memo
    code = HIT.replace("SRC", repr(src)).replace("ROOT", repr(str(root))).replace("HEAVY", repr(HIT_HEAVY))
    runs = []
    for strict in (False, True, True, True):
        out = run_py(code.replace("STRICT", repr(strict)))
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout))
        if runs[-1]["served"]:
            break
    assert {**runs[0], "blake2": None, "sha256": None, "engine": None} == {
        "value": 7, "spawned": [], "heavy": [], "compiled": [], "served": False, "blake2": None, "sha256": None,
        "engine": None}  # the full lookup sums the build's dependencies with blake2, and plans with the engine
    # served: blake2 names its record (hits _digest), and nothing more: no CPython sha256 (values/digest.py),
    # no engine, nor the steering variables (engine/steer.py: the memo compares the whole environment)
    assert runs[-1] == {"value": 7, "spawned": [], "heavy": [], "compiled": [], "served": True, "blake2": True,
                        "sha256": False, "engine": False}, runs


#: what a fresh process's hit must not import at all: typing (2-3 ms), OpenSSL's hashlib (2-3 ms:
#: a hit hashes short texts, values/digest.py), threading (its Lock is _thread's), dataclasses,
#: importlib (abicache's lazy names use __import__), contextlib and math (the miss's, or unneeded)
NEVER_ON_A_HIT = ("typing", "hashlib", "_hashlib", "threading", "dataclasses", "inspect", "tempfile", "importlib",
                  "contextlib", "math")
HIT_ADDS = textwrap.dedent("""
    import sys
    before = set(sys.modules)
    from abicache import Cache, cc
    lib = cc.load_library("hitlib", [SRC], cache=Cache(ROOT))
    assert lib.answer() == 7
    print(" ".join(m for m in NEVER if m in sys.modules and m not in before) or "none")
""")


def test_a_fresh_process_hit_imports_no_typing_hashlib_or_threading(tmp_path: Path) -> None:
    """Run without site (-S), where nothing has imported these first: each costs a fresh
    process milliseconds that its hit does not need (issue 49: the hit at its floor)."""
    import time

    from abicache.store import stamps

    need("c++")
    src = 'extern "C" int answer() { return 7; }'
    root = tmp_path / "store"
    cc.build_library("hitlib", [src], cache=Cache(root))
    time.sleep(stamps.RACY_SECONDS + 0.1)
    assert cc.build_library("hitlib", [src], cache=Cache(root)).hit  # the first hit may stamp (hashing): once
    code = HIT_ADDS.replace("SRC", repr(src)).replace("ROOT", repr(str(root))).replace("NEVER", repr(NEVER_ON_A_HIT))
    out = run_without_site(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["none"]


def run_without_site(code: str) -> subprocess.CompletedProcess[str]:
    import os
    import sys

    from conftest import SRC
    return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC)})


def test_the_torch_frontend_imports_nothing_only_a_miss_uses() -> None:
    """abicache.torch, imported by every fresh process that loads an extension, leaves
    torch.compile's cache and the miss-only modules to their first use."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    code = COUNT_PATTERNS.replace("STRICT", "False") + (
        f"import sys, json, torch; before = set(sys.modules); compiled.clear(); import abicache.torch as at; "
        f"print(json.dumps([m for m in {HIT_HEAVY + ('abicache.frontends.torch_compile',)!r} "
        f"if m in sys.modules and m not in before]), json.dumps(compiled), at.compile_cache.__name__)")
    out = run_py(code, env={"ABICACHE_DIR": "/nonexistent"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "[]", "abicache.frontends.torch_compile"]  # no module, no pattern compiled


def test_a_hit_writes_nothing_within_the_touch_interval(tmp_path: Path) -> None:
    """Once an entry's stamps are written, hits write nothing. Stamps vouch only for
    files whose times have settled (stamps.RACY_SECONDS): what the build could not stamp
    yet, the first hit after that stamps, once. This test once failed under load: its
    hit came after the settling time, so it was that first, stamping hit. Now it waits
    for the settling time, lets the first hit stamp, and checks the hits after it."""
    import time

    from abicache.store import stamps

    need("c++")
    root = tmp_path / "store"
    src = 'extern "C" int answer() { return 8; }'
    cc.build_library("quiet", [src], cache=Cache(root))
    time.sleep(stamps.RACY_SECONDS + 0.1)
    assert cc.build_library("quiet", [src], cache=Cache(root)).hit  # may stamp: once
    before = {p: p.lstat().st_mtime_ns for p in root.rglob("*")}
    for _ in range(3):
        assert cc.build_library("quiet", [src], cache=Cache(root)).hit
        time.sleep(0.05)
    assert {p: p.lstat().st_mtime_ns for p in root.rglob("*")} == before


def test_the_sdist_and_wheel_install_into_a_clean_venv_and_run_the_demo(tmp_path: Path) -> None:
    """The light path: `python -m build` (the wheel made from the sdist, as pip makes it), installed
    into a venv that sees nothing of this machine's packages, pulls only the core dependencies,
    and `abicache demo` runs there (no torch, no test tools)."""
    import os
    import shutil
    import subprocess
    import sys

    import pytest

    from conftest import ROOT

    need("c++")
    if subprocess.run([sys.executable, "-m", "build", "--version"], capture_output=True).returncode != 0:
        pytest.skip("the 'build' package is not installed (bash scripts/bootstrap.sh --test installs it)")
    tree = tmp_path / "tree"  # the tracked files only, as a fresh clone has them
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                            str(tree)], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("abicache-*.whl"))
    assert next((tmp_path / "dist").glob("abicache-*.tar.gz"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                               capture_output=True, text=True, timeout=900)
    if installed.returncode != 0 and "No matching distribution" in installed.stderr:
        pytest.skip(f"no package index to fetch the core dependencies from: {installed.stderr[-300:]}")
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ABICACHE_DROPIN")}
    demo = subprocess.run([str(venv / "bin" / "abicache"), "demo", "--root", str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "dot([1,2,3], [4,5,6]) = 32" in demo.stdout
    present = subprocess.run([str(python), "-c", "import importlib.util as u; print([m for m in ('torch', 'triton', "
                              "'pytest', 'redis', 'abicache') if u.find_spec(m)])"], capture_output=True, text=True,
                             env=env).stdout.strip()
    assert present == "['abicache']"
    assert list(venv.glob("lib/python*/site-packages/abicache-dropin.pth"))  # the sdist carried it


def test_bootstrap_on_a_pep668_python_explains_the_venv_instead_of_failing_in_pip(tmp_path: Path) -> None:
    """A stand-in interpreter that reports itself externally managed (PEP 668, as Debian 12's
    does): bootstrap stops before pip with the two commands that make and use a venv."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    log = tmp_path / "calls"
    fake = tmp_path / "python3"
    fake.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n'
                    'case "$*" in *EXTERNALLY-MANAGED*) exit 0 ;; esac\n'  # "yes, managed by the system"
                    f'exec "{sys.executable}" "$@"\n')
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap.sh")], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(fake)}, timeout=120)
    assert done.returncode == 1
    assert "PEP 668" in done.stderr and "python3 -m venv .venv && . .venv/bin/activate" in done.stderr
    assert "pip" not in log.read_text().replace("EXTERNALLY-MANAGED", "")  # pip was never run



def test_a_lookup_with_one_variant_does_not_ask_for_the_gpus(tmp_path: Path) -> None:
    """Asking for the GPUs costs cuInit (10 to 200 ms): a lookup asks only to choose among
    several variants, or where a requirement names them (Triton's key pins the target)."""
    from abicache.env import Facts

    class Asked(Facts):
        asked: list[str] = []

        def get(self, name: str) -> str | None:
            self.asked.append(name)
            return super().get(name)

    cache = Cache(tmp_path / "store", facts=Asked({"gpu.arch": "sm_90", "cuda.driver": "13.0"}, probe=False))
    pinned = cache.pinned_by_key({"gpu.arch", "cuda.driver"})
    inputs = {"sources": {"k.txt": "kernel"}}

    def build(out: Path) -> None:
        (out / "k.bin").write_bytes(b"code")

    pinned.get_or_build("gpu.kernel", "k", inputs, build, requires=["gpu.arch ~= sm_90"])
    Asked.asked.clear()
    assert pinned.lookup("gpu.kernel", "k", inputs) is not None
    assert "gpu.arch" not in Asked.asked
