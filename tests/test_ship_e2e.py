"""Shipping prebuilt, end to end, as a maintainer's CI and a user meet it.

Two jobs of a matrix, each in its own venv (Python 3.11 with torch; Python 3.12), build
through abicache and push to a SeaweedFS remote; a last job bundles every variant from
the remote into one wheel; a fresh venv with no compiler on PATH installs only that wheel
and loads everything with zero compiles (counted), and a variant nobody built is named
with what it needs.

The 3.12 job builds a C library and a Python-specific CPython module, not torch
extensions: the only torch wheel for 3.12 on this machine's index is a CUDA build of
several GB (the 3.11 job builds the pybind extension and the stable-ABI op).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import servers
from conftest import SRC, need
from corpus import TORCH_STABLE
from remote_fixtures import s3_endpoint  # noqa: F401  (fixture)
from venvs import make_venv, py312_with_abicache

ADD = 'extern "C" int add(int a, int b) { return a + b; }'
PYBIND = "int64_t add(int64_t a, int64_t b) { return a + b; }\n"
TWICE = textwrap.dedent(r"""
    #include <Python.h>
    static PyObject* twice(PyObject* self, PyObject* arg) { return PyLong_FromLong(2 * PyLong_AsLong(arg)); }
    static PyMethodDef methods[] = {{"twice", twice, METH_O, ""}, {NULL, NULL, 0, NULL}};
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "twice", NULL, -1, methods};
    PyMODINIT_FUNC PyInit_twice(void) { return PyModule_Create(&def); }
""")
JOB_TORCH = textwrap.dedent(f"""
    import abicache.cc as cc, abicache.torch as at
    print(cc.build_library("adder", [{ADD!r}]).origin,
          at.build_inline("ship_pyext", [{PYBIND!r}], functions=["add"]).origin,
          at.build_inline("ship_stable", [{TORCH_STABLE!r}], stable=True).origin)
""")
JOB_312 = textwrap.dedent(f"""
    import abicache.cc as cc
    print(cc.build_library("adder", [{ADD!r}]).origin, cc.build_module("twice", [{TWICE!r}], lang="c").origin)
""")
USER = textwrap.dedent(f"""
    import ctypes, json
    import torch
    import abicache.cc as cc, abicache.torch as at
    lib = cc.build_library("adder", [{ADD!r}])
    ext = at.build_inline("ship_pyext", [{PYBIND!r}], functions=["add"])
    op = at.build_inline("ship_stable", [{TORCH_STABLE!r}], stable=True)
    mod = at.load_inline("ship_pyext", [{PYBIND!r}], functions=["add"])
    at.load_inline("ship_stable", [{TORCH_STABLE!r}], stable=True)
    filled = torch.ops.abicache_stable.my_fill(torch.zeros(3), 7.0)
    print(json.dumps({{"origins": [lib.origin, ext.origin, op.origin], "add": ctypes.CDLL(str(lib.file())).add(2, 40),
                      "ext": mod.add(40, 2), "op": filled.tolist()}}))
""")
MISSING = textwrap.dedent(f"""
    import abicache.cc as cc
    cc.build_module("twice", [{TWICE!r}], lang="c")
""")


def _run(python: str, code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_PROGRESS": "0", **env})


def test_a_matrix_pushes_the_last_job_bundles_a_wheel_and_a_user_without_a_compiler_loads_it(
        s3_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    pytest.importorskip("torch")
    need("c++")
    remote = servers.s3_url(s3_endpoint, f"ship-{os.getpid()}")
    shared = {"ABICACHE_REMOTE": remote, **servers.CREDENTIALS}
    job1 = _run(make_venv(tmp_path / "job-311", sys.executable, system=True), JOB_TORCH,
                {**shared, "ABICACHE_DIR": str(tmp_path / "job-311-store")})
    assert job1.returncode == 0 and job1.stdout.split() == ["built"] * 3, job1.stderr[-3000:]
    job2 = _run(py312_with_abicache(), JOB_312, {**shared, "ABICACHE_DIR": str(tmp_path / "job-312-store")})
    assert job2.returncode == 0, job2.stderr[-3000:]
    assert job2.stdout.split() == ["remote", "built"]  # the C library: the 3.11 job's, the same for every Python

    dist = tmp_path / "dist"
    bundled = _run(sys.executable, "from abicache.cli.program import main; raise SystemExit(main())",
                   {**servers.CREDENTIALS, "ABICACHE_DIR": str(tmp_path / "bundler-store")},
                   "bundle", "--remote", remote, "--wheel", "mylib-kernels==1.0", "--out", str(dist), "--json",
                   "adder", "ship_pyext", "ship_stable", "twice")
    assert bundled.returncode == 0, bundled.stderr[-3000:]
    doc = json.loads(bundled.stdout)
    assert sorted(e["name"] for e in doc["entries"]) == ["adder", "ship_pyext", "ship_stable", "twice"]
    (wheel,) = dist.glob("*.whl")

    user = make_venv(tmp_path / "user", sys.executable, system=True)
    if subprocess.run([user, "-c", "import torch"], capture_output=True).returncode != 0:
        pytest.skip("a --system-site-packages venv of this interpreter does not see torch (run outside a venv)")
    installed = subprocess.run([user, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    os.symlink(user, bare / "python3")
    no_compiler = {"PATH": str(bare), "CC": "", "CXX": "", "ABICACHE_DIR": str(tmp_path / "user-store")}
    used = _run(user, USER, no_compiler)
    assert used.returncode == 0, used.stderr[-3000:]
    assert json.loads(used.stdout.splitlines()[-1]) == {"origins": ["tier", "tier", "tier"], "add": 42, "ext": 42,
                                                        "op": [7.0, 7.0, 7.0]}
    stats = _run(user, "from abicache.cli.program import main; raise SystemExit(main())", no_compiler,
                 "stats", "--json")
    counts = json.loads(stats.stdout)["counts"]
    assert counts["builds"] == 0 and counts["hits_read_only"] >= 3, counts  # zero compiles: the wheel's store served them
    missing = _run(user, MISSING, no_compiler)
    assert missing.returncode == 1
    assert "No prebuilt cc.module 'twice' fits this environment" in missing.stderr, missing.stderr[-2000:]
    assert "needs python.abi == cp312" in missing.stderr
