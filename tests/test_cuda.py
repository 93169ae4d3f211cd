"""CUDA: loader across majors, compile with nvcc/NVRTC, stub libraries.

Fakes are real shared libraries built here with the right sonames and
versioned symbols; the real libcudart 13 and PyPI's NVRTC 12 and 13 are used
where installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from conftest import SRC, gpu_present
from corpus import find_tool

KERNEL = ('extern "C" __global__ void scale(float* x, float a, int n) '
          "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }")
PURELIB = Path(sysconfig.get_paths()["purelib"])

FAKE_CUDART = r"""
#include <stddef.h>
int cudaRuntimeGetVersion(int* v) { *v = VERSION; return 0; }
int cudaGetDeviceCount(int* n) { *n = 1; return 0; }
int cudaMalloc(void** p, size_t size) { static char pool[64]; *p = pool; return size > 64 ? 2 : 0; }
#ifndef NO_FREE
int cudaFree(void* p) { return 0; }
#endif
#if VERSION < 12000
int cudaGraphInstantiate(void** e, void* g, void** node, char* log, size_t n) { return 0; }
#else
int cudaGraphInstantiate(void** e, void* g, unsigned long long flags) { return 0; }
#endif
"""


def sh(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})


def fake_cudart(folder: Path, major: int, version: int, *defines: str) -> Path:
    soname = {11: "libcudart.so.11.0", 12: "libcudart.so.12", 13: "libcudart.so.13"}[major]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fake.c").write_text(FAKE_CUDART)
    (folder / "fake.map").write_text(f"{soname} {{ global: cuda*; local: *; }};\n")
    out = folder / soname
    done = sh(["cc", "-shared", "-fPIC", f"-DVERSION={version}", *defines, str(folder / "fake.c"), "-o", str(out),
               f"-Wl,-soname,{soname}", f"-Wl,--version-script={folder / 'fake.map'}"])
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    base = tmp_path_factory.mktemp("fakes")
    return {11: fake_cudart(base / "11", 11, 11080, "-DNO_FREE"), 12: fake_cudart(base / "12", 12, 12090),
            13: fake_cudart(base / "13", 13, 13000)}


@pytest.fixture(scope="module")
def cuda11_headers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CUDA 11 headers from PyPI's wheel, unpacked (installing it would clobber cu12's)."""
    from abicache.cuda.headers import extract_wheel_headers

    where = tmp_path_factory.mktemp("cu11")
    done = sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "nvidia-cuda-runtime-cu11==11.8.89",
               "-d", str(where)])
    wheels = list(where.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        pytest.skip(f"cannot download nvidia-cuda-runtime-cu11 headers: {done.stderr[-300:]}")
    return extract_wheel_headers(wheels[0], where / "include")


def py(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A fresh process: each one may pin another major."""
    return sh([sys.executable, "-c", textwrap.dedent(code)], env={"PYTHONPATH": str(SRC), **(env or {})})


LOAD = """
import json, sys
from abicache.cuda import load_library
lib = load_library("cudart", major=None if sys.argv[1] == "best" else int(sys.argv[1]))
print(json.dumps({"major": lib.major, "path": lib.path, "via": lib.found_via}))
"""


@pytest.mark.parametrize("wanted", ["11", "12", "13", "best"])
def test_loader_picks_the_requested_or_best_major(fakes: dict[int, Path], tmp_path: Path, wanted: str) -> None:
    both = tmp_path / "all"
    both.mkdir()
    for lib in fakes.values():
        (both / lib.name).symlink_to(lib)
    out = sh([sys.executable, "-c", LOAD, wanted], env={"PYTHONPATH": str(SRC), "ABICACHE_CUDART": str(both)})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    major = 13 if wanted == "best" else int(wanted)
    assert got["major"] == major and got["via"] == "override ABICACHE_CUDART"
    assert Path(got["path"]).name == fakes[major].name


def test_loader_lists_every_place_tried(tmp_path: Path) -> None:
    out = sh([sys.executable, "-c", LOAD, "11"], env={"PYTHONPATH": str(SRC), "ABICACHE_CUDART": str(tmp_path),
                                                     "CUDA_HOME": str(tmp_path / "cuda")})
    assert out.returncode != 0
    text = out.stderr
    assert "could not load libcudart.so.11.0; tried, in order:" in text
    for where in ("override ABICACHE_CUDART", "pip wheel", "$CUDA_HOME", "/usr/local/cuda", "system loader"):
        assert where in text
    assert "cannot open shared object file" in text  # the dlerror() of the soname attempt


def test_one_major_per_process(fakes: dict[int, Path]) -> None:
    out = py("""
        from abicache.cuda import load_library
        load_library("cudart", major=12)
        try:
            load_library("cudart", major=13)
        except Exception as exc:
            print(exc)
    """, env={"ABICACHE_CUDART": str(fakes[12].parent)})
    assert "one major per process" in out.stdout, out.stderr


def test_nvrtc_needs_its_builtins_beside_it(tmp_path: Path) -> None:
    lib = tmp_path / "libnvrtc.so.12"
    (tmp_path / "n.c").write_text("int nvrtcVersion(int* a, int* b) { *a = 12; *b = 9; return 0; }")
    sh(["cc", "-shared", "-fPIC", str(tmp_path / "n.c"), "-o", str(lib), "-Wl,-soname,libnvrtc.so.12"])
    out = py("""
        from abicache.cuda import load_library
        try:
            lib = load_library("nvrtc", major=12)
            print(lib.attempts[0].error, "| then loaded", lib.path)
        except Exception as exc:
            print(exc)
    """, env={"ABICACHE_NVRTC": str(lib)})
    # the override is refused without its builtins; the search goes on
    assert "libnvrtc-builtins.so.12.* is not beside it" in out.stdout, out.stderr


def test_real_cudart_13_is_found() -> None:
    out = py("from abicache.cuda import load_library; l = load_library('cudart'); print(l.major, l.path)")
    if out.returncode != 0:
        pytest.skip("no libcudart here")
    major, path = out.stdout.split()
    assert major == "13" and path.endswith("libcudart.so.13")


def test_agrees_with_cuda_pathfinder() -> None:
    pytest.importorskip("cuda.pathfinder")
    out = py("""
        from cuda.pathfinder import load_nvidia_dynamic_lib
        from abicache.cuda.loader import candidates
        theirs = load_nvidia_dynamic_lib("cudart").abs_path
        print(theirs)
        print(any(theirs == path for _, path in candidates("cudart", 13) + candidates("cudart", 12)))
    """)
    assert out.returncode == 0, out.stderr
    path, listed = out.stdout.split()
    assert listed == "True", f"pathfinder chose {path}, which our search order never tries"


# ---- compile ---------------------------------------------------------------------

NVRTC = """
import json, sys
from abicache import Cache, cuda
from abicache.audit import audit_file
major, root = int(sys.argv[1]), sys.argv[2]
first = cuda.compile(KERNEL, arch="sm_90", compiler="nvrtc", nvrtc_major=major, cache=Cache(root))
again = cuda.compile(KERNEL, arch="sm_90", compiler="nvrtc", nvrtc_major=major, cache=Cache(root))
found = [str(f.requirement) for f in audit_file(first.path).findings]
print(json.dumps({"first_hit": first.artifact.hit, "second_hit": again.artifact.hit, "audit": found,
                  "compiler": first.artifact.manifest.inputs["extra"]["compiler"], "same": first.data == again.data}))
""".replace("KERNEL", repr(KERNEL))


@pytest.mark.parametrize("major,wheel", [(13, "cu13"), (12, "cuda_nvrtc")])
def test_nvrtc_of_each_major_compiles_a_cached_cubin(tmp_path: Path, major: int, wheel: str) -> None:
    if not list((PURELIB / "nvidia" / wheel / "lib").glob(f"libnvrtc.so.{major}*")):
        pytest.skip(f"NVRTC {major} from PyPI is not installed")
    out = sh([sys.executable, "-c", NVRTC, str(major), str(tmp_path / "store")], env={"PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["first_hit"] is False and got["second_hit"] is True and got["same"]
    assert got["audit"] == ["gpu.arch ~= sm_90"]
    assert got["compiler"].startswith(f"nvrtc {major}.")


def test_nvrtc_errors_carry_the_program_log(tmp_path: Path) -> None:
    out = py("""
        import sys
        from abicache import Cache, cuda
        try:
            cuda.compile("__global__ void k() { undefined_thing(); }", arch="sm_90", compiler="nvrtc",
                         cache=Cache(sys.argv[1] if len(sys.argv) > 1 else "/tmp/x"))
        except Exception as exc:
            print(exc)
    """, env={})
    if "could not load" in out.stdout:
        pytest.skip("no NVRTC here")
    assert "could not compile" in out.stdout and "undefined_thing" in out.stdout


def test_nvcc_outputs_through_the_same_api(tmp_path: Path) -> None:
    if find_tool("nvcc") is None:
        pytest.skip("nvcc is not installed")
    from abicache import Cache, cuda

    cache = Cache(tmp_path)
    cubin = cuda.compile(KERNEL, arch="sm_90a", cache=cache)
    ptx = cuda.compile(KERNEL, arch="sm_80", output="ptx", cache=cache)
    fat = cuda.compile(KERNEL, arch=["sm_80", "sm_90a"], output="fatbin", cache=cache)
    major = re.search(r"release (\d+)\.", cache.facts.get("cuda.nvcc")).group(1)
    driver = f"cuda.driver >= {major}.0"  # the toolkit's major: cubins carry no mark of it themselves
    assert cubin.artifact.requirements.to_list() == [driver, "gpu.arch ~= sm_90a"]
    assert ptx.data.lstrip().startswith(b"//") and "gpu.arch ~= compute_80" in ptx.artifact.requirements.to_list()
    assert fat.artifact.requirements.to_list() == [driver, "gpu.arch ~= sm_80,sm_90a"]
    assert cuda.compile(KERNEL, arch="sm_90a", cache=Cache(tmp_path)).artifact.hit
    assert not cuda.compile(KERNEL, arch="sm_90", cache=Cache(tmp_path)).artifact.hit  # arch is in the key


NVCC_HIT = """
import json, os, subprocess, sys
from abicache import Cache, cuda
def refuse(*a, **k):
    raise AssertionError("a cache hit must not spawn a process")
subprocess.Popen.__init__ = refuse
os.posix_spawn = os.posix_spawnp = os.fork = refuse
c = cuda.compile(KERNEL, arch="sm_90a", cache=Cache(sys.argv[1]))
print(json.dumps({"hit": c.artifact.hit}))
""".replace("KERNEL", repr(KERNEL))


def test_an_nvcc_hit_in_a_fresh_process_spawns_nothing(tmp_path: Path) -> None:
    if find_tool("nvcc") is None:
        pytest.skip("nvcc is not installed")
    from abicache import Cache, cuda

    cuda.compile(KERNEL, arch="sm_90a", cache=Cache(tmp_path))
    out = sh([sys.executable, "-c", NVCC_HIT, str(tmp_path)], env={"PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == {"hit": True}


def test_bad_compile_arguments() -> None:
    from abicache import cuda
    from abicache.errors import AbicacheError

    with pytest.raises(AbicacheError, match="not a GPU target"):
        cuda.compile(KERNEL, arch="sm_9x")
    with pytest.raises(AbicacheError, match="takes one arch"):
        cuda.compile(KERNEL, arch=["sm_80", "sm_90"], output="cubin")
    with pytest.raises(AbicacheError, match="use 'nvcc' or 'nvrtc'"):
        cuda.compile(KERNEL, arch="sm_90", compiler="clang")


# ---- stubs -----------------------------------------------------------------------

PROGRAM = r"""
#include <stdio.h>
#include <cuda_runtime_api.h>
int abicache_stub_cudart_report(char*, size_t);
int abicache_stub_cudart_major(void);
int main(void) {
    int v = -1, n = -1;
    void* p = 0;
    cudaGraphExec_t exec;
    int rv = cudaRuntimeGetVersion(&v);
    int rc = cudaGetDeviceCount(&n);
    int rm = cudaMalloc(&p, 16);
    int rf = cudaFree(p);
    int rg = cudaGraphInstantiate(&exec, 0, 0);
    char report[8192];
    abicache_stub_cudart_report(report, sizeof report);
    printf("{\"version\": %d, \"rv\": %d, \"count\": %d, \"malloc\": %d, \"free\": %d, \"graph\": %d, \"major\": %d}\n",
           v, rv, rc, rm, rf, rg, abicache_stub_cudart_major());
    fprintf(stderr, "%s", report);
    return 0;
}
"""
FUNCTIONS = ["cudaRuntimeGetVersion", "cudaGetDeviceCount", "cudaMalloc", "cudaFree", "cudaGraphInstantiate"]


@pytest.fixture(scope="module")
def stub_program(tmp_path_factory: pytest.TempPathFactory, cuda11_headers: Path) -> tuple[Path, Path]:
    """A stub with the CUDA 12 API that may load 12 or 11, and a program linked against it."""
    from abicache.cuda import stubs

    out = tmp_path_factory.mktemp("stub")
    so = stubs.build("cudart", FUNCTIONS, out, api_major=12, guard=True, majors=[12, 11],
                     header_dirs={11: cuda11_headers})
    include = stubs.plan("cudart", ["cudaMalloc"], api_major=12, majors=[12]).include
    (out / "prog.c").write_text(PROGRAM)
    from abicache.cuda.headers import support_flags

    done = sh(["cc", str(out / "prog.c"), f"-I{include}", *support_flags(), f"-L{out}", f"-l{so.name[3:-3]}",
               "-o", str(out / "prog")])
    assert done.returncode == 0, done.stderr
    return out, out / "prog"


def run_program(stub_program: tuple[Path, Path], libdir: Path | None) -> tuple[dict[str, int], str]:
    out, prog = stub_program
    path = f"{out}{os.pathsep}{libdir}" if libdir else str(out)
    done = sh([str(prog)], env={"LD_LIBRARY_PATH": path, "ABICACHE_STUB_CUDART": ""})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_stub_runs_against_each_fake_major(stub_program: tuple[Path, Path], fakes: dict[int, Path]) -> None:
    from abicache.cuda.stubs import NO_SYMBOL, SIGNATURE

    twelve, report = run_program(stub_program, fakes[12].parent)
    assert twelve == {"version": 12090, "rv": 0, "count": 0, "malloc": 0, "free": 0, "graph": 0, "major": 12}
    assert "loaded libcudart.so.12 (CUDA major 12)" in report
    eleven, report = run_program(stub_program, fakes[11].parent)
    assert eleven["version"] == 11080 and eleven["major"] == 11
    assert eleven["free"] == NO_SYMBOL  # the fake 11 lacks cudaFree: only that call fails
    assert eleven["graph"] == SIGNATURE  # 5 arguments in CUDA 11: not called with 3
    assert "symbol cudaFree" in report and "cudaGraphInstantiate: the loaded CUDA 11 has another signature" in report


def test_stub_for_12_and_13_runs_against_the_fake_13(tmp_path: Path, fakes: dict[int, Path],
                                                    cuda11_headers: Path) -> None:
    from abicache.cuda import stubs
    from abicache.cuda.headers import support_flags

    so = stubs.build("cudart", FUNCTIONS, tmp_path, api_major=12, guard=True, majors=[12, 13, 11],
                     header_dirs={11: cuda11_headers})
    include = stubs.plan("cudart", ["cudaMalloc"], api_major=12, majors=[12]).include
    (tmp_path / "prog.c").write_text(PROGRAM)
    done = sh(["cc", str(tmp_path / "prog.c"), f"-I{include}", *support_flags(), f"-L{tmp_path}",
               f"-l{so.name[3:-3]}", "-o", str(tmp_path / "prog")])
    assert done.returncode == 0, done.stderr
    run = sh([str(tmp_path / "prog")], env={"LD_LIBRARY_PATH": str(tmp_path), "ABICACHE_STUB_CUDART": str(fakes[13])})
    got = json.loads(run.stdout)
    assert got == {"version": 13000, "rv": 0, "count": 0, "malloc": 0, "free": 0, "graph": 0, "major": 13}


def test_stub_without_any_library_returns_the_documented_code(stub_program: tuple[Path, Path], tmp_path: Path) -> None:
    from abicache.cuda.stubs import NO_LIBRARY

    none, report = run_program(stub_program, tmp_path)
    assert {none[k] for k in ("rv", "count", "malloc", "free", "graph")} == {NO_LIBRARY} and none["major"] == -1
    assert "tried libcudart.so.12" in report and "tried libcudart.so.11.0" in report


def test_stub_exports_stay_in_their_own_version_node(stub_program: tuple[Path, Path]) -> None:
    out, _ = stub_program
    syms = sh(["readelf", "--dyn-syms", "-W", str(next(out.glob("lib*.so")))]).stdout
    assert "cudaMalloc@@ABICACHE_STUB_CUDART_12" in syms
    assert "stub_load" not in syms  # internals are local


def test_stub_against_the_real_cudart_13(tmp_path: Path) -> None:
    from abicache.cuda import stubs
    from abicache.cuda.headers import support_flags

    try:
        so = stubs.build("cudart", FUNCTIONS[:3], tmp_path, api_major=13, majors=[13])
    except Exception as exc:  # no CUDA 13 headers here
        pytest.skip(str(exc))
    include = stubs.plan("cudart", ["cudaMalloc"], api_major=13, majors=[13]).include
    prog = tmp_path / "prog.c"
    prog.write_text(PROGRAM.replace("int rf = cudaFree(p);", "int rf = 0;").replace(
        "int rg = cudaGraphInstantiate(&exec, 0, 0);", "int rg = 0; (void)exec;"))
    done = sh(["cc", str(prog), f"-I{include}", *support_flags(), f"-L{tmp_path}", f"-l{so.name[3:-3]}",
               "-o", str(tmp_path / "prog")])
    assert done.returncode == 0, done.stderr
    real = Path("/usr/local/cuda/lib64/libcudart.so.13")
    if not real.is_file():
        pytest.skip("no /usr/local/cuda/lib64/libcudart.so.13")
    run = sh([str(tmp_path / "prog")], env={"LD_LIBRARY_PATH": str(tmp_path), "ABICACHE_STUB_CUDART": str(real)})
    got = json.loads(run.stdout)
    assert got["version"] == 13000 and got["major"] == 13
    assert f"loaded {real} (CUDA major 13)" in run.stderr
    if gpu_present() is None:  # a GPU machine: the real answer
        assert got["count"] == 0
    else:  # cudaErrorInsufficientDriver, passed through and reported
        assert got["count"] == 35
        assert "cudaGetDeviceCount returned 35 (from the loaded CUDA 13)" in run.stderr


def test_signature_difference_is_detected_from_headers(cuda11_headers: Path) -> None:
    from abicache.cuda import stubs
    from abicache.errors import AbicacheError

    with pytest.raises(AbicacheError) as info:
        stubs.plan("cudart", ["cudaGraphInstantiate"], api_major=12, majors=[12, 11],
                   header_dirs={11: cuda11_headers})
    text = str(info.value)
    assert "cudaGraphInstantiate differs between majors" in text
    assert "unsigned long long flags" in text and "char *pLogBuffer" in text
    guarded = stubs.plan("cudart", ["cudaGraphInstantiate", "cudaMalloc"], api_major=12, majors=[12, 11],
                         header_dirs={11: cuda11_headers}, guard=True)
    assert {f.name: f.majors for f in guarded.functions} == {"cudaGraphInstantiate": (12,), "cudaMalloc": (12, 11)}


def test_renamed_functions_use_their_real_names() -> None:
    from abicache.cuda import stubs

    try:
        twelve = stubs.plan("cudart", ["cudaGetDeviceProperties"], api_major=12, majors=[12])
    except Exception as exc:
        pytest.skip(str(exc))
    assert twelve.functions[0].name == "cudaGetDeviceProperties_v2"


def test_stub_cli(tmp_path: Path) -> None:
    out = sh([sys.executable, "-m", "abicache", "stub", "cudart", "--functions", "cudaRuntimeGetVersion,cudaMalloc",
              "--out", str(tmp_path), "--majors", "12", "--json"], env={"PYTHONPATH": str(SRC)})
    if out.returncode != 0 and "no cudart headers" in out.stderr:
        pytest.skip(out.stderr)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert Path(doc["path"]).is_file() and doc["loads"] == [12]


def test_stub_cli_for_a_major_without_headers_is_a_clear_error(tmp_path: Path) -> None:
    """Seen on the GPU machine (CUDA 13 headers only): --majors 12 was a ValueError traceback."""
    out = sh([sys.executable, "-m", "abicache", "stub", "cudart", "--functions", "cudaMalloc", "--out",
              str(tmp_path), "--majors", "99"], env={"PYTHONPATH": str(SRC)})
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "no cudart headers for CUDA [99]" in out.stderr or "no cuda_runtime_api.h found" in out.stderr
