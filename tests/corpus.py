"""Builders for the audit corpus: real compilers, real files, built by the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from abicache.env import Facts


def find_tool(name: str) -> str | None:
    """PATH, then CUDA_HOME/CUDA_PATH, /usr/local/cuda, then PyPI's nvidia/cu13 wheels."""
    found = shutil.which(name)
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    purelib = Path(sysconfig.get_paths()["purelib"])
    candidates = [Path(h) / "bin" / name for h in homes if h] + [purelib / "nvidia" / "cu13" / "bin" / name]
    return next((str(c) for c in candidates if c.is_file()), None)


def need_tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        pytest.skip(f"{name} is not installed (CUDA toolkit, or PyPI's nvidia-cuda-* wheels)")
    return path


def torch_root() -> Path:
    root = Facts().get("torch.root")
    if not root:
        pytest.skip("torch is not installed (pip install torch==2.13.0)")
    return Path(root)


def run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(argv)}\n{done.stdout}{done.stderr}"


def gxx(src: str, out: Path, *flags: str, lang: str = "c++") -> Path:
    source = out.with_suffix(".c" if lang == "c" else ".cpp")
    source.write_text(src)
    compiler = "cc" if lang == "c" else "c++"
    run([compiler, "-shared", "-fPIC", "-O2", *flags, str(source), "-o", str(out)], out.parent)
    return out


def torch_op(src: str, out: Path, *flags: str) -> Path:
    root = torch_root()
    return gxx(src, out, "-std=c++17", "-isystem", str(root / "include"),
               "-isystem", str(root / "include" / "torch" / "csrc" / "api" / "include"),
               *flags, f"-L{root / 'lib'}", "-ltorch_cpu", "-lc10")


KERNEL = 'extern "C" __global__ void scale(float* x, float a, int n) ' \
         "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }\n"


def nvcc(out: Path, *flags: str) -> Path:
    source = out.parent / "kernel.cu"
    source.write_text(KERNEL)
    run([need_tool("nvcc"), *flags, str(source), "-o", str(out)], out.parent)
    return out


PLAIN_C = r"""
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
int describe(const char* s, char* out, size_t n) { return snprintf(out, n, "%zu:%s", strlen(s), s); }
void* grow(void* p, size_t n) { return reallocarray(p, n, 2); }
"""

CXX_STRING = r"""
#include <string>
std::string greet(const std::string& who) { return "hello " + who; }
"""

PY_FULL = r"""
#include <Python.h>
static PyObject* shrink(PyObject* self, PyObject* arg) {
    PyObject* b = PyBytes_FromStringAndSize("abcdef", 6);
    if (b == NULL || _PyBytes_Resize(&b, 3) < 0) return NULL;
    return b;
}
static PyMethodDef methods[] = {{"shrink", shrink, METH_O, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&def); }
"""

PY_LIMITED = r"""
#include <Python.h>
static PyObject* twice(PyObject* self, PyObject* arg) { return PyNumber_Add(arg, arg); }
static PyMethodDef methods[] = {{"twice", twice, METH_O, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&def); }
"""

# Declares a function that entered the limited API in 3.12, while claiming 3.10.
PY_TOO_NEW = PY_LIMITED.replace(
    "static PyObject* twice",
    "PyAPI_FUNC(PyObject*) PyErr_GetRaisedException(void);\n"
    "static PyObject* raised(PyObject* self, PyObject* arg) { return PyErr_GetRaisedException(); }\n"
    "static PyObject* twice",
).replace('{"twice", twice, METH_O, ""},', '{"twice", twice, METH_O, ""}, {"raised", raised, METH_O, ""},')

TORCH_CLASSIC = r"""
#include <torch/library.h>
#include <ATen/ATen.h>
at::Tensor my_add(const at::Tensor& a, const at::Tensor& b) { return a + b; }
TORCH_LIBRARY(abicache_classic, m) { m.def("my_add(Tensor a, Tensor b) -> Tensor", &my_add); }
"""

# The documented example (examples/stable_ops.cpp), under a library name of its own.
TORCH_STABLE = (Path(__file__).resolve().parents[1] / "examples" / "stable_ops.cpp").read_text().replace(
    "my_ops", "abicache_stable")

# "Stable" in name only: it reaches into ATen.
TORCH_FAKE_STABLE = TORCH_STABLE.replace(
    "#include <torch/csrc/stable/ops.h>",
    "#include <torch/csrc/stable/ops.h>\n#include <ATen/ATen.h>\n"
    "at::Tensor sneaky(const at::Tensor& a) { return a.sum(); }",
)

STALE_TORCH = r"""
#include <c10/util/Exception.h>
#include <string>
void check_positive(int x) { std::string msg = "x must be positive"; TORCH_CHECK(x > 0, msg); }
"""

TARGET_2_10 = "-DTORCH_TARGET_VERSION=0x020a000000000000"
