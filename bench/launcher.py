"""The compiler launcher beside ccache (issue 50): per compile, and a whole CMake build.

Per compile (one C++ unit: `<map>`, `<string>`, `<vector>`, `-O2 -c -MD`), fresh processes,
wall time, alternating runs, medians:

- a hit: `ccache g++` (direct mode), abicache's native front (`$(abicache launcher) g++`,
  served from its hit record), and `abicache g++` (the Python launcher, a clean venv's
  interpreter, the full lookup);
- a miss: each run a new key (`-DRUN=<n>`), against `g++` alone run the same way: the
  overhead as a share of the compile.

A project (default a generated tree of 60 units; `--sdist lightgbm==4.5.0`: a public C++
project from PyPI, its CMakeLists as released, fetched once into bench/results/sdists):
configured with CMake and ninja for each tool as CMAKE_CXX_COMPILER_LAUNCHER (C and C++),
built from a clean build folder twice (`g++` alone once); the second build's wall time and
how many of its compiles hit.

Targets (issue 50): hit <= 1.5x ccache's, miss overhead <= 5% of the compile, the second
build >= 95% hits and within 1.2x of ccache's second build.

    python3 bench/launcher.py [--runs 21] [--jobs 2]
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

from common import base_env

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
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], check=True)
    python = str(work / "venv" / "bin" / "python")
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


def per_compile(work: Path, launchers: dict[str, list[str]], runs: int) -> dict[str, float]:
    gxx = shutil.which("g++") or sys.exit("bench/launcher: g++ not found")
    env = environment(work)
    (work / "unit").mkdir()
    # RUN changes what is compiled (a define the code uses: ccache's preprocessor mode misses too)
    (work / "unit" / "unit.cpp").write_text("#ifndef RUN\n#define RUN 0\n#endif\nint tag = RUN;\n"
                                            + UNIT.replace("RUN", "unit"))
    words = [gxx, "-O2", "-c", "unit.cpp", "-o", "unit.o", "-MD", "-MF", "unit.d"]
    for name, before in launchers.items():
        if before:
            wall_ms([*before, *words], work / "unit", env)  # primes it (the front's record: a child writes it)
    time.sleep(0.5)
    times: dict[str, list[float]] = {}
    for n in range(runs):
        for index, (name, before) in enumerate(launchers.items()):
            if before:
                times.setdefault(f"hit: {name}", []).append(wall_ms([*before, *words], work / "unit", env))
            run = 1 + n * len(launchers) + index
            # its own output names: a depfile the same as the hit's would be one blob of both entries,
            # whose ctime each new entry moves (the hit's record would then hand it to Python)
            miss = [*before, words[0], f"-DRUN={run}", "-O2", "-c", "unit.cpp", "-o", f"miss{run}.o",
                    "-MD", "-MF", f"miss{run}.d"]
            times.setdefault(f"miss: {name}", []).append(wall_ms(miss, work / "unit", env))
        time.sleep(0.1)  # the records misses leave to children: not measured in the next run
    return {name: statistics.median(t) for name, t in times.items()}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--sdist", help="a PyPI source release with a CMake project, e.g. lightgbm==4.5.0")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--subdir", default="", help="the CMake project inside the sdist (vendor/llama.cpp)")
    parser.add_argument("--cmake-arg", action="append", default=[], help="passed to cmake (repeatable)")
    parser.add_argument("--skip-project", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="abicache-bench-launch-"))
    try:
        launchers = tools(work)
        compile_ms = per_compile(work, launchers, args.runs)
        bare = compile_ms["miss: g++ alone"]
        ccache_hit = compile_ms.get("hit: ccache")
        print(f"one C++ unit, wall, medians of {args.runs} alternating runs (g++ alone: {bare:.1f} ms)")
        for name, ms in compile_ms.items():
            extra = ""
            if name.startswith("hit:") and ccache_hit:
                extra = f"   {ms / ccache_hit:5.2f}x ccache's hit"
            elif name.startswith("miss:") and name != "miss: g++ alone":
                extra = f"   overhead {100 * (ms - bare) / bare:+5.1f}% of the compile"
            print(f"  {name:28} {ms:9.2f} ms{extra}")
        doc: dict = {"runs": args.runs, "per_compile_ms": compile_ms}
        if not args.skip_project and shutil.which("cmake") and shutil.which("ninja"):
            source = sdist(args.sdist, work / "sdist", args.subdir) if args.sdist else generated(work / "gen")
            before = hit_counts(work)
            builds = project_builds(source, work, launchers, args.jobs, args.cmake_arg)
            after = hit_counts(work)
            label = args.sdist or "a generated tree of 60 units"
            print(f"{label}: CMake + ninja -j{args.jobs}, a clean build folder twice")
            for name, walls in builds.items():
                ratio = ""
                if "ccache" in builds and name != "ccache":
                    ratio = f"   second build {walls['second_s'] / builds['ccache']['second_s']:.2f}x ccache's"
                print(f"  {name:20} first {walls['first_s']:7.2f} s   second {walls['second_s']:7.2f} s{ratio}")
            hits, misses = after.get("hits", 0) - before.get("hits", 0), after.get("misses", 0) - before.get("misses", 0)
            print(f"  abicache's compiles: {misses} misses (the first build), {hits} hits")
            doc["project"] = {"source": label, "jobs": args.jobs, "builds": builds, "hits": hits, "misses": misses}
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
