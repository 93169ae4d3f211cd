"""abicache under the newest torch users install (venvs.NEWEST_TORCH: the CUDA build from the
package index, which imports without a GPU) beside the suite's own torch (2.13, CPU), on a
machine without a GPU: the parameter and build-line tests run there, a CUDA extension is
built and loaded there, and a stable op built under one torch is loaded under the other
without a compile. The newest torch's venv is made once (venvs.newest_torch) and reused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import venvs
from conftest import ROOT, SRC, run_py

pytest.importorskip("torch", reason="torch is not installed")


@pytest.fixture(scope="module")
def newest() -> str:
    from abicache.env import probes

    if probes.nvcc_path() is None:
        pytest.skip("nvcc is not installed (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    return venvs.newest_torch()


#: the tests of this suite that say what a torch release changes: its parameters, its build lines
UNDER_THE_NEWEST = ["tests/test_torch_dropin.py::test_every_torch_parameter_in_torch_order",
                    "tests/test_torch_dropin.py::test_gil_not_used_declares_it_in_the_bindings_as_torch_2_15_does",
                    "tests/test_torch_dropin.py::test_a_parameter_abicache_does_not_know_runs_torchs_own_call",
                    "tests/test_torch_dropin.py::test_a_parameter_torch_does_not_know_either_is_torchs_type_error",
                    "tests/test_torch_lines.py"]


def test_the_parameter_and_build_line_tests_pass_under_the_newest_torch(newest: str) -> None:
    ran = subprocess.run([newest, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", *UNDER_THE_NEWEST],
                         cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert " passed" in ran.stdout and "skipped" not in ran.stdout, ran.stdout[-1000:]


EXT_CPP = r"""
#include <torch/extension.h>
#include <omp.h>
void launch_add_one(const float* x, float* y, int64_t n);  // kernel.cu

// The CPU path: OpenMP over a float tensor (built with -Ofast -fopenmp).
double sum_of_squares(torch::Tensor x) {
  auto a = x.contiguous();
  const float* p = a.data_ptr<float>();
  double s = 0;
  #pragma omp parallel for reduction(+:s)
  for (int64_t i = 0; i < a.numel(); ++i) s += (double)p[i] * p[i];
  return s;
}

// The GPU path: needs a CUDA tensor, so a GPU.
torch::Tensor add_one(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "add_one needs a CUDA tensor");
  auto y = torch::empty_like(x);
  launch_add_one(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("sum_of_squares", &sum_of_squares);
  m.def("add_one", &add_one);
}
"""
EXT_CU = r"""
#include <cstdint>
__global__ void add_one_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
void launch_add_one(const float* x, float* y, int64_t n) { add_one_kernel<<<(n + 255) / 256, 256>>>(x, y, n); }
"""
#: a project's build script: load, as a project calls it (the second process calls torch's, routed to abicache)
LOAD = """
import sys, torch
{load}
m = load("farm_ext", ["ext.cpp", "kernel.cu"], extra_cflags=["-Ofast", "-fopenmp"], extra_ldflags=["-fopenmp"])
print(m.sum_of_squares(torch.arange(10, dtype=torch.float32)), torch.__version__, torch.cuda.is_available())
"""


def test_a_cuda_extension_builds_and_loads_without_a_gpu_and_a_second_process_compiles_nothing(
        newest: str, tmp_path: Path) -> None:
    """The build farm: a C++ and CUDA extension (-Ofast -fopenmp, TORCH_CUDA_ARCH_LIST=9.0) under a
    CUDA torch on a machine without a GPU. It raised 'was built, but cannot be loaded here:
    gpu.arch ~= sm_90' after compiling, and rebuilt on every call; torch's own load returns a
    module whose CPU functions run. Published under what it was built for."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "ext.cpp").write_text(EXT_CPP)
    (project / "kernel.cu").write_text(EXT_CU)
    env = {"ABICACHE_DIR": str(tmp_path / "store"), "TORCH_CUDA_ARCH_LIST": "9.0", "PYTHONPATH": str(SRC)}

    def run(code: str, **more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([newest, "-c", code], cwd=project, capture_output=True, text=True, timeout=600,
                              env={**os.environ, **env, **more})

    if run("import abicache.env as e; print(e.Facts().get('gpu.arch'))").stdout.strip() != "none":
        pytest.skip("this machine has a GPU (or its driver failed): the test is of a machine without one")
    first = run(LOAD.format(load="from abicache.torch import load"))
    assert first.returncode == 0, first.stderr[-3000:]
    value, version, cuda = first.stdout.split()
    assert float(value) == 285.0 and version.startswith("2.15") and "+cu" in version and cuda == "False"
    # a second process, through torch's own load (routed by install()), may not build: it must find it
    routed = "import abicache.torch; abicache.torch.install()\nfrom torch.utils.cpp_extension import load"
    second = run(LOAD.format(load=routed), ABICACHE_BUILD="never")
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.split()[0] == "285.0"
    listed = subprocess.run([sys.executable, "-m", "abicache", "ls", "--json"], capture_output=True, text=True,
                            env={**os.environ, **env}, timeout=120)
    assert listed.returncode == 0, listed.stderr
    (entry,) = [e for e in json.loads(listed.stdout) if e["name"] == "farm_ext"]
    assert "gpu.arch ~= sm_90" in entry["requirements"] and "cuda.runtime == 13" in entry["requirements"]
    assert any(r.startswith("torch.build == 2.15.0+cu") for r in entry["requirements"]), entry["requirements"]
    stats = json.loads(subprocess.run([sys.executable, "-m", "abicache", "stats", "--json"], capture_output=True,
                                      text=True, env={**os.environ, **env}, timeout=120).stdout)
    assert (stats["counts"]["builds"], stats["counts"]["hits_local"]) == (1, 1)
    assert stats["by_kind"]["cc.object"]["entries"] == 2  # its two units, compiled once each
    _a_cuda_extension_is_served_by_its_record_while_no_driver_loads(run, project)


#: a later process's call: served by its hit record or not (hits/cuda_witness.py)
SERVED = """
import json, torch
from abicache import cc
from abicache.torch import load
m = load("farm_ext", ["ext.cpp", "kernel.cu"], extra_cflags=["-Ofast", "-fopenmp"], extra_ldflags=["-fopenmp"])
held = next(iter(cc._loaded.values()))[0]
print(json.dumps([type(held).__name__ == "Served", m.sum_of_squares(torch.arange(10, dtype=torch.float32))]))
"""


def _a_cuda_extension_is_served_by_its_record_while_no_driver_loads(run: Any, project: Path) -> None:
    """Issue 49 on a GPU fleet's build machines: a CUDA extension's record was refused (nvcc,
    gpu.arch and cuda.runtime are no file's stat), so every process paid the full lookup.
    Its record holds `gpu=none` (no kernel module, no driver library: no GPU for CUDA here)
    and the CUDA runtime torch loaded (tests/test_cuda_records.py: what sends it the full way)."""
    for _ in range(6):
        ran = run(SERVED)
        assert ran.returncode == 0, ran.stderr[-3000:]
        served, value = json.loads(ran.stdout.splitlines()[-1])
        assert value == 285.0
        if served:
            break
    assert served, "no record served the CUDA extension"
    fields = [path.read_bytes() for path in (project.parent / "store" / "v3" / "hits").iterdir()]
    assert any(b"\0gpu=none;cudart=13\0" in data for data in fields)


def _guide_stable_cuda_op() -> str:
    """The torch guide's stable CUDA op example, as written."""
    section = (ROOT / "docs" / "guides" / "torch.md").read_text().split("### Stable ops with CUDA kernels", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("builder", ["newest", "suite's"])
def test_the_guides_stable_cuda_op_built_under_one_torch_loads_under_the_other_without_a_compile(
        newest: str, tmp_path: Path, builder: str) -> None:
    """The build farm's stable op: the guide's example, as written, on a machine without a GPU,
    under the newest CUDA torch and the suite's CPU torch; the second finds the first's build
    (ABICACHE_BUILD=never) and registers the op."""
    code = _guide_stable_cuda_op() + "\nprint(torch.__version__, torch.ops.my_cuda_ops.add_one)"
    env = {"ABICACHE_DIR": str(tmp_path / "store")}
    pythons = [newest, sys.executable] if builder == "newest" else [sys.executable, newest]
    outputs = []
    for python, more in zip(pythons, ({}, {"ABICACHE_BUILD": "never"})):
        ran = run_py(code, python=python, env={**env, **more}, timeout=600)
        assert ran.returncode == 0, ran.stderr[-3000:]
        outputs.append(ran.stdout.split())
    versions = sorted(out[0].split(".")[1] for out in outputs)
    assert versions == ["13", "15"] and all(out[1] == "my_cuda_ops.add_one" for out in outputs), outputs
