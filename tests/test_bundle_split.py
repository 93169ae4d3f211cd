"""`abicache bundle --wheel --split-by`: a base wheel and one provider wheel per group, each
installable alone and with the base, none over --max-size, identical files shipped once.

The store holds what a kernel library ships: a C library, a CPython module for two Pythons
(3.11 here, 3.12 from a venv of its own), a classic torch extension, a stable-ABI op, and a
kernel's cubins for three archs (nvcc), plus two entries whose file is byte for byte the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import hostile
import shared_builds
from abicache import Cache, cc, cuda
from abicache.env import probes
from conftest import SRC, need
from corpus import TORCH_STABLE
from venvs import make_venv, py312_with_abicache

TWICE = textwrap.dedent(r"""
    #include <Python.h>
    static PyObject* twice(PyObject* self, PyObject* arg) { return PyLong_FromLong(2 * PyLong_AsLong(arg)); }
    static PyMethodDef methods[] = {{"twice", twice, METH_O, ""}, {NULL, NULL, 0, NULL}};
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "twice", NULL, -1, methods};
    PyMODINIT_FUNC PyInit_twice(void) { return PyModule_Create(&def); }
""")
KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }'
ARCHS = ("sm_80", "sm_90", "sm_100f")
NAMES = ["adder", "twice", shared_builds.ADD_EXT, "split_stable", "k", "dup_a", "dup_b"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    need("c++")
    if probes.nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    import abicache.torch as at

    # the classic extension is the run's shared one (shared_builds.py): a copy, built once
    root = shared_builds.torch_extension_store(tmp_path_factory, tmp_path_factory.mktemp("split") / "store")
    cache = Cache(root)
    cc.build_library("adder", ['extern "C" int add(int a, int b) { return a + b; }'], cache=cache)
    cc.build_module("twice", [TWICE], lang="c", cache=cache)
    job = subprocess.run([py312_with_abicache(), "-c", "import abicache.cc as cc, sys; "
                          f"cc.build_module('twice', [{TWICE!r}], lang='c', cache=__import__('abicache').Cache(sys.argv[1]))",
                          str(root)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)},
                         timeout=600)
    assert job.returncode == 0, job.stderr[-2000:]
    at.build_inline("split_stable", [TORCH_STABLE], stable=True, cache=cache)
    for arch in ARCHS:
        device = {"gpu.arch": "sm_" + arch.split("_")[1].rstrip("af"), "cuda.driver": "13.0"}
        cuda.compile(KERNEL, arch=arch, output="cubin", compiler="nvcc", name="k", cache=cache.for_target(device))
    for name in ("dup_a", "dup_b"):  # the same bytes under two names
        cache.get_or_build("t", name, {"extra": {"n": name}}, lambda out: (out / "same.bin").write_bytes(b"x" * 5000))
    return root


def _bundle(store: Path, out: Path, *args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "abicache", "bundle", "--wheel", "split-kernels==1.0", "--out",
                           str(out), "--root", str(store), "--json", *args, *NAMES], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=600)
    return done.returncode, (json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr})


def test_split_by_arch_makes_a_provider_per_arch_each_installable(store: Path, tmp_path: Path) -> None:
    code, doc = _bundle(store, tmp_path / "dist", "--split-by", "arch")
    assert code == 0, doc
    groups = {w["group"]: Path(w["file"]) for w in doc["wheels"]}
    assert set(groups) == {"", "sm_80", "sm_90", "sm_100f"}, groups
    assert all(groups[g].name.endswith("-any.whl") for g in ARCHS)  # cubins need no Python, no libc
    by_wheel: dict[str, list[str]] = {}
    for entry in doc["entries"]:
        by_wheel.setdefault(entry["wheel"], []).append(entry["name"])
    assert sorted(by_wheel[str(groups["sm_90"])]) == ["k"]
    assert "k" not in by_wheel[str(groups[""])] and "twice" in by_wheel[str(groups[""])]
    for label, wheels in (("base", [groups[""]]), ("sm_90 alone", [groups["sm_90"]]),
                          ("all", list(groups.values()))):
        python = make_venv(tmp_path / label.replace(" ", "-"), sys.executable)
        done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *map(str, wheels)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (label, done.stderr[-1500:])
        env = subprocess.run([python, "-c", "from abicache.shipping import tiers; print(len(tiers.tiers()))"],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)
        assert env.stdout.strip() == str(len(wheels)), (label, env.stdout, env.stderr[-1000:])


def test_split_by_python_and_a_size_cap_naming_the_group(store: Path, tmp_path: Path) -> None:
    code, doc = _bundle(store, tmp_path / "py", "--split-by", "python")
    assert code == 0, doc
    groups = {w["group"] for w in doc["wheels"]}
    assert groups == {"", "cp311", "cp312"}, groups
    here = {e["name"] for e in doc["entries"] if e["wheel"].endswith("-cp311-cp311-manylinux_2_17_x86_64.whl")
            or "cp311" in Path(e["wheel"]).name.split("-")[2]}
    assert {"twice", shared_builds.ADD_EXT} <= here
    code, doc = _bundle(store, tmp_path / "capped", "--split-by", "python", "--max-size", "20K")
    assert code == 2 and "over --max-size 0.0 MiB" not in doc["error"], doc
    assert "over --max-size" in doc["error"] and ("(base)" in doc["error"] or "(group " in doc["error"]), doc
    assert not list((tmp_path / "capped").glob("*.whl"))  # nothing half made


def test_identical_files_are_shipped_once_per_wheel(store: Path, tmp_path: Path) -> None:
    code, doc = _bundle(store, tmp_path / "one")
    assert code == 0, doc
    (wheel,) = [Path(w["file"]) for w in doc["wheels"]]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    blobs = [n for n in names if "/store/v3/blobs/" in n]
    # adder, twice for two Pythons, add_ext, split_stable, k for three archs, dup_a, dup_b
    assert len(doc["entries"]) == 10, [(e["kind"], e["name"]) for e in doc["entries"]]
    manifests = [hostile.manifest_doc(v) for v in store.glob("v3/entries/*/*/*.*") if v.is_dir()]
    wanted = [f["sha256"] for entry in manifests if entry["name"] in NAMES for f in entry["files"].values()]
    assert len(wanted) == 10 and len(set(wanted)) < len(wanted)  # dup_a's and dup_b's file at least
    assert len(blobs) == len(set(wanted)), (len(blobs), len(set(wanted)))  # each distinct file once
    assert not [n for n in names if "/store/v3/entries/" in n and not n.endswith("manifest.json")]
