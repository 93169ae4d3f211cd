"""The compiler launcher beside ccache (issue 50): per compile, and a whole CMake build.

Per compile (one C++ unit: `<map>`, `<string>`, `<vector>`, `-O2 -c -MD`), fresh processes,
wall time, alternating runs, medians:

- a hit: `ccache g++` (direct mode), abicache's native front (`$(abicache launcher) g++`,
  served from its hit record), and `abicache g++` (the Python launcher, a clean venv's
  interpreter, the full lookup);
- a miss: each run a new key (`-DRUN=<n>`), against `g++` alone run the same way: the
  overhead as a share of the compile, in wall time (what the build waits for) and in the
  machine's CPU time until half a second after it (`cpu miss:` rows, from /proc/stat: what a
  miss leaves to a child or a warm launcher's fork after it answered counts too; on a machine
  otherwise idle). Beside the overhead of the medians, the median of each run's overhead
  against the bare compile of its own round ("paired by round": less of a noisy machine's drift).

A project (default a generated tree of 60 units; `--sdist lightgbm==4.5.0`: a public C++
project from PyPI, its CMakeLists as released, fetched once into bench/results/sdists):
configured with CMake and ninja for each tool as CMAKE_CXX_COMPILER_LAUNCHER (C and C++),
built from a clean build folder twice (`g++` alone once); the second build's wall time and
how many of its compiles hit.

`--nvcc RUNS`: the same per compile for nvcc (a .cu, `-c` for sm_90: no GPU needed), nvcc alone
as the bare row. `--torch-extension`: a torch extension built ahead of time with `BuildExtension`
(`pip install --no-build-isolation`), a clean build folder twice: g++ alone, the launcher's
link as `$CXX` (`TORCH_NO_COMPILER_WRAPPER=1`), and ccache, which torch puts in front of `$CXX`
itself when it finds it. `--runs 0` leaves the C++ unit out.

Targets (issue 50): hit <= 1.5x ccache's, miss overhead <= 5% of the compile, the second
build >= 95% hits and within 1.2x of ccache's second build.

    python3 bench/launcher.py [--runs 21] [--jobs 2]
    python3 bench/launcher.py --runs 0 --skip-project --nvcc 7 --torch-extension
    python3 bench/launcher.py --runs 3 --sdist lightgbm==4.5.0 --cmake-arg=-DBUILD_CLI=OFF
    python3 bench/launcher.py --runs 3 --sdist llama-cpp-python==0.3.36 --subdir vendor/llama.cpp \
        --cmake-arg=-DLLAMA_BUILD_TESTS=OFF --cmake-arg=-DLLAMA_BUILD_EXAMPLES=OFF \
        --cmake-arg=-DLLAMA_BUILD_TOOLS=OFF --cmake-arg=-DLLAMA_BUILD_SERVER=OFF --cmake-arg=-DLLAMA_BUILD_APP=OFF \
        --cmake-arg=-DLLAMA_CURL=OFF --cmake-arg=-DGGML_NATIVE=OFF --cmake-arg=-DGGML_CCACHE=OFF
        (llama.cpp puts ccache in front of the compiler itself unless GGML_CCACHE=OFF: the
        baseline would then be ccache's)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from common import base_env, clean_python

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "launcher.json"
SDISTS = ROOT / "bench" / "results" / "sdists"
UNIT = """#include <map>
#include <string>
#include <vector>
int count_RUN(const std::vector<std::string> &words) {
    std::map<std::string, int> seen;
    for (const auto &w : words) seen[w]++;
    return (int)seen.size();
}
"""


def wall_ms(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        sys.exit(f"bench/launcher: {' '.join(argv)} failed: {done.stderr.decode(errors='replace')[-400:]}")
    return (time.perf_counter() - start) * 1e3


def tools(work: Path) -> dict[str, list[str]]:
    """Each launcher as the words before the compiler, with a clean venv's interpreter."""
    python = clean_python(work / "venv")
    env = {**base_env(), "PYTHONPATH": str(ROOT / "src"), "ABICACHE_DIR": str(work / "store")}
    subprocess.run([python, "-m", "compileall", "-q", str(ROOT / "src" / "abicache")], check=True, env=env)
    made = subprocess.run([python, "-m", "abicache", "launcher"], capture_output=True, text=True, env=env)
    if made.returncode != 0:
        sys.exit(f"bench/launcher: the native front could not be built: {made.stderr}")
    out = {"g++ alone": [], "abicache front": [made.stdout.strip()], "abicache (Python)": [python, "-m", "abicache"]}
    if shutil.which("ccache"):
        out["ccache"] = ["ccache"]
    else:
        print("bench/launcher: ccache not found; its column is left out", file=sys.stderr)
    return out


def environment(work: Path) -> dict[str, str]:
    return {**base_env(), "PYTHONPATH": str(ROOT / "src"), "ABICACHE_DIR": str(work / "store"),
            "CCACHE_DIR": str(work / "ccache"), "CCACHE_NOHASHDIR": "1"}


#: a CUDA unit for nvcc's rows: compile-only, no GPU needed
CUDA_UNIT = """__global__ void scale_RUN(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i];
}
"""


def per_compile(work: Path, launchers: dict[str, list[str]], runs: int, cuda: bool = False) -> dict[str, float]:
    """One unit's hits and misses, each tool in turn (cuda: nvcc's `-c` of a .cu for sm_90, the
    bare compiler's row named "g++ alone" all the same)."""
    if cuda:
        compiler = nvcc_path() or sys.exit("bench/launcher: nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
        source, text, flags = "unit.cu", CUDA_UNIT, ["-O2", "-arch=sm_90", "-c"]
    else:
        compiler = shutil.which("g++") or sys.exit("bench/launcher: g++ not found")
        source, text, flags = "unit.cpp", UNIT, ["-O2", "-c"]
    env = environment(work)
    folder = work / ("unit-cuda" if cuda else "unit")
    folder.mkdir()
    # RUN changes what is compiled (a define the code uses: ccache's preprocessor mode misses too)
    (folder / source).write_text("#ifndef RUN\n#define RUN 0\n#endif\nint tag = RUN;\n" + text.replace("RUN", "unit"))
    words = [compiler, *flags, source, "-o", "unit.o", "-MD", "-MF", "unit.d"]
    for name, before in launchers.items():
        if before:
            wall_ms([*before, *words], folder, env)  # primes it (the front's record: a child writes it)
    time.sleep(0.5)
    times: dict[str, list[float]] = {}
    for n in range(runs):
        for index, (name, before) in enumerate(launchers.items()):
            if before:
                times.setdefault(f"hit: {name}", []).append(wall_ms([*before, *words], folder, env))
            run = 1 + n * len(launchers) + index
            # its own output names: a depfile the same as the hit's would be one blob of both entries,
            # whose ctime each new entry moves (the hit's record would then hand it to Python)
            miss = [*before, compiler, f"-DRUN={run}", *flags, source, "-o", f"miss{run}.o", "-MD", "-MF", f"miss{run}.d"]
            busy = busy_ms()
            times.setdefault(f"miss: {name}", []).append(wall_ms(miss, folder, env))
            time.sleep(SETTLE_S)  # what a miss leaves to children (a record; a warm fork's entry) ends meanwhile
            if busy is not None:
                times.setdefault(f"cpu miss: {name}", []).append(busy_ms() - busy)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for row in ("miss", "cpu miss"):  # each run against the bare compile of its own round: less of the noise
        bare = times.get(f"{row}: g++ alone", [])
        for name in launchers:
            if name != "g++ alone" and len(times.get(f"{row}: {name}", [])) == len(bare) > 0:
                medians[f"paired {row}: {name}"] = statistics.median(
                    100 * (t - b) / b for t, b in zip(times[f"{row}: {name}"], bare))
    return medians


#: seconds after each miss before the machine's CPU time is read again
SETTLE_S = 0.5


def busy_ms() -> float | None:
    """The machine's CPU time so far (every process: a miss's work after its answer, in a
    child or a warm launcher's fork, counts too), from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) * 1e3 / os.sysconf("SC_CLK_TCK")


def nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if found is None and home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            found = os.path.join(home, "bin", "nvcc")
    return found


EXTENSION = """#include <torch/extension.h>
int64_t add(int64_t a, int64_t b) { return a + b; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add", &add); }
"""
SETUP = """from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
setup(name="bench_ext", version="0", ext_modules=[CppExtension("bench_ext", ["ext.cpp"])],
      cmdclass={"build_ext": BuildExtension})
"""


def extension_builds(work: Path, links: str) -> dict[str, dict[str, float]]:
    """A torch extension built ahead of time with BuildExtension (`pip install --no-build-isolation`),
    twice from a clean build folder for each tool: g++ alone (TORCH_NO_COMPILER_WRAPPER=1), the
    launcher's link as $CXX, and ccache (which torch puts in front of $CXX itself when it finds it)."""
    source = work / "extension"
    source.mkdir()
    (source / "ext.cpp").write_text(EXTENSION)
    (source / "setup.py").write_text(SETUP)
    base = {**environment(work), "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    tools = {"g++ alone": {"TORCH_NO_COMPILER_WRAPPER": "1", "CXX": "g++"},
             "abicache front": {"TORCH_NO_COMPILER_WRAPPER": "1", "CXX": os.path.join(links, "g++")}}
    if shutil.which("ccache"):
        tools["ccache"] = {"CXX": "g++"}
    out: dict[str, dict[str, float]] = {}
    for name, extra in tools.items():
        walls = []
        for attempt in range(1 if name == "g++ alone" else 2):
            for made in ("build", "bench_ext.egg-info", "target"):
                shutil.rmtree(source / made, ignore_errors=True)
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                                   "--target", str(source / "target"), "."], cwd=source, env={**base, **extra},
                                  capture_output=True)
            walls.append(time.perf_counter() - start)
            if done.returncode != 0:
                sys.exit(f"bench/launcher: {name}'s extension build failed: {done.stderr.decode(errors='replace')[-800:]}")
            if attempt == 0:
                time.sleep(1.0)  # the records the first build's misses leave to children
        out[name] = {"first_s": walls[0], "second_s": walls[-1]}
    return out


def generated(folder: Path, units: int = 60) -> Path:
    """A CMake project of `units` C++ units sharing headers (a stand-in when no sdist is given)."""
    (folder / "src").mkdir(parents=True)
    (folder / "include").mkdir()
    (folder / "include" / "common.h").write_text("#pragma once\n#include <map>\n#include <string>\n#include <vector>\n")
    for i in range(units):
        (folder / "src" / f"u{i}.cpp").write_text('#include "common.h"\n' + UNIT.replace("RUN", str(i)))
    names = " ".join(f"src/u{i}.cpp" for i in range(units))
    (folder / "CMakeLists.txt").write_text(f"cmake_minimum_required(VERSION 3.16)\nproject(gen CXX)\n"
                                           f"add_library(gen STATIC {names})\n"
                                           "target_include_directories(gen PUBLIC include)\n")
    return folder


def sdist(requirement: str, into: Path, subdir: str = "") -> Path:
    """A released source tree from PyPI (pip download --no-binary), unpacked; subdir: the CMake
    project inside it (llama-cpp-python vendors llama.cpp)."""
    SDISTS.mkdir(parents=True, exist_ok=True)
    found = sorted(SDISTS.glob(requirement.split("==")[0].replace("-", "_") + "-*.tar.gz")) + \
        sorted(SDISTS.glob(requirement.split("==")[0] + "-*.tar.gz"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        "-d", str(SDISTS), requirement], check=True)
        found = sorted(SDISTS.glob("*.tar.gz"))
    with tarfile.open(found[-1]) as archive:
        archive.extractall(into, filter="data")
    return next(p / subdir for p in into.iterdir() if (p / subdir / "CMakeLists.txt").exists())


def project_builds(source: Path, work: Path, launchers: dict[str, list[str]], jobs: int,
                   cmake_args: list[str]) -> dict[str, dict[str, float]]:
    env = environment(work)
    out: dict[str, dict[str, float]] = {}
    for name, before in launchers.items():
        if name == "abicache (Python)":
            continue  # the front hands its misses to it: the row that counts is the front's
        build = work / f"build-{len(out)}"
        launcher = [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={';'.join(before)}" for lang in ("C", "CXX")] if before else []
        walls = []
        for attempt in range(1 if not before else 2):  # g++ alone: its second build is its first
            shutil.rmtree(build, ignore_errors=True)
            subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                            *launcher, *cmake_args], check=True, env=env, capture_output=True)
            start = time.perf_counter()
            done = subprocess.run(["ninja", "-C", str(build), f"-j{jobs}"], env=env, capture_output=True)
            walls.append(time.perf_counter() - start)
            if done.returncode != 0:
                sys.exit(f"bench/launcher: {name}'s build failed: {done.stdout.decode(errors='replace')[-800:]}")
            if attempt == 0:
                time.sleep(1.0)  # the records the first build's misses leave to children
        out[name] = {"first_s": walls[0], "second_s": walls[-1]}
    return out


def hit_counts(work: Path) -> dict[str, int]:
    env = environment(work)
    done = subprocess.run([sys.executable, "-m", "abicache", "stats", "--json"], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)["counts"]["by_kind"].get("cc.compile", {})


def report_compiles(compile_ms: dict[str, float]) -> None:
    ccache_hit = compile_ms.get("hit: ccache")
    for name, ms in compile_ms.items():
        if name.startswith("paired"):
            continue
        extra = ""
        bare = compile_ms.get("cpu miss: g++ alone" if name.startswith("cpu") else "miss: g++ alone")
        if name.startswith("hit:") and ccache_hit:
            extra = f"   {ms / ccache_hit:5.2f}x ccache's hit"
        elif "miss:" in name and not name.endswith("g++ alone") and bare:
            paired = compile_ms.get(f"paired {name}")
            extra = f"   overhead {100 * (ms - bare) / bare:+5.1f}% of the compile" + (
                f" (paired by round: {paired:+5.1f}%)" if paired is not None else "")
        print(f"  {name:28} {ms:9.2f} ms{extra}")


def report_builds(builds: dict[str, dict[str, float]]) -> None:
    for name, walls in builds.items():
        ratio = ""
        if "ccache" in builds and name != "ccache":
            ratio = f"   second build {walls['second_s'] / builds['ccache']['second_s']:.2f}x ccache's"
        print(f"  {name:20} first {walls['first_s']:7.2f} s   second {walls['second_s']:7.2f} s{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--sdist", help="a PyPI source release with a CMake project, e.g. lightgbm==4.5.0")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--subdir", default="", help="the CMake project inside the sdist (vendor/llama.cpp)")
    parser.add_argument("--cmake-arg", action="append", default=[], help="passed to cmake (repeatable)")
    parser.add_argument("--skip-project", action="store_true")
    parser.add_argument("--nvcc", type=int, default=0, metavar="RUNS",
                        help="also nvcc's per-compile rows (a .cu, -c for sm_90; no GPU needed), RUNS runs")
    parser.add_argument("--torch-extension", action="store_true",
                        help="also a torch extension built with BuildExtension (pip install --no-build-isolation)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="abicache-bench-launch-"))
    try:
        launchers = tools(work)
        doc: dict = {"runs": args.runs}
        if args.runs:
            compile_ms = doc["per_compile_ms"] = per_compile(work, launchers, args.runs)
            print(f"one C++ unit, wall, medians of {args.runs} alternating runs "
                  f"(g++ alone: {compile_ms['miss: g++ alone']:.1f} ms)")
            report_compiles(compile_ms)
        if args.nvcc:
            nvcc_ms = per_compile(work, launchers, args.nvcc, cuda=True)
            print(f"one CUDA unit (nvcc -c, sm_90), wall, medians of {args.nvcc} alternating runs "
                  f"(nvcc alone: {nvcc_ms['miss: g++ alone']:.1f} ms)")
            report_compiles(nvcc_ms)
            doc["nvcc_ms"] = nvcc_ms
        if args.torch_extension:
            links = subprocess.run([sys.executable, "-m", "abicache", "launcher", "--links"], capture_output=True,
                                   text=True, env=environment(work), check=True).stdout.strip()
            before = hit_counts(work)
            built = extension_builds(work, links)
            after = hit_counts(work)
            hits = after.get("hits", 0) - before.get("hits", 0)
            print("a torch extension, BuildExtension (pip install --no-build-isolation), a clean build folder twice")
            report_builds(built)
            print(f"  abicache's compiles: {after.get('misses', 0) - before.get('misses', 0)} misses, {hits} hits")
            doc["torch_extension"] = {"builds": built, "hits": hits}
        if not args.skip_project and shutil.which("cmake") and shutil.which("ninja"):
            source = sdist(args.sdist, work / "sdist", args.subdir) if args.sdist else generated(work / "gen")
            before = hit_counts(work)
            builds = project_builds(source, work, launchers, args.jobs, args.cmake_arg)
            after = hit_counts(work)
            label = args.sdist or "a generated tree of 60 units"
            print(f"{label}: CMake + ninja -j{args.jobs}, a clean build folder twice")
            report_builds(builds)
            hits, misses = after.get("hits", 0) - before.get("hits", 0), after.get("misses", 0) - before.get("misses", 0)
            print(f"  abicache's compiles: {misses} misses (the first build), {hits} hits")
            doc["project"] = {"source": label, "jobs": args.jobs, "builds": builds, "hits": hits, "misses": misses}
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
