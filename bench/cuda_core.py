"""cuda.core's Program.compile(cache=...): a hit in a fresh process, abicache's ProgramCache
beside cuda.core's own FileStreamProgramCache, and the floor (NVRTC compiling every time).

Each number is the median of --runs fresh interpreters, timed inside the process from
before the Program is made to the returned ObjectCode (imports excluded: both import
cuda.core; abicache's import is timed on its own in bench/foundation.py). No GPU needed:
the programs are compiled for sm_90 and not loaded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import run_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
KERNEL = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''
SNIPPET = """
import json, sys, time
sys.path.insert(0, {src!r})
from cuda.core import Program, ProgramOptions
which, where = {which!r}, {where!r}
if which == "abicache":
    from abicache import Cache
    from abicache.cuda.program_cache import ProgramCache
    cache = ProgramCache(Cache(where), target={{"gpu.arch": "sm_90"}})
elif which == "cuda.core":
    from cuda.core.utils import FileStreamProgramCache
    cache = FileStreamProgramCache(where)
else:
    cache = None
start = time.perf_counter()
obj = Program({kernel!r}, "c++", ProgramOptions(arch="sm_90")).compile("cubin", cache=cache)
print(json.dumps({{"ms": (time.perf_counter() - start) * 1000}}))
"""


def once(which: str, where: Path) -> float:
    code = SNIPPET.format(src=str(ROOT / "src"), which=which, where=str(where), kernel=KERNEL)
    return float(run_json(code, {"ABICACHE_PROGRESS": "0"})["ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("cuda-core")  # not an import: this folder's cuda.py would stand in for the package
    except PackageNotFoundError:
        print("cuda-core is not installed (pip install 'abicache[cuda-core]'): nothing to measure", file=sys.stderr)
        return
    work = Path(tempfile.mkdtemp(prefix="abicache-bench-cuda-core-"))
    try:
        res: dict[str, float] = {"compile_ms": statistics.median(once("none", work) for _ in range(args.runs))}
        for which in ("abicache", "cuda.core"):
            where = work / which
            res[f"{which}_first_ms"] = once(which, where)  # compiles and stores
            res[f"{which}_hit_ms"] = statistics.median(once(which, where) for _ in range(args.runs))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("cuda.core Program.compile('cubin', cache=...), fresh process, median ms (inside the process)")
    print(f"  NVRTC compile, no cache (the floor a hit avoids): {res['compile_ms']:8.2f}")
    for which in ("abicache", "cuda.core"):
        print(f"  {which + ' hit':<20} {res[f'{which}_hit_ms']:8.2f}   first (compile + store): "
              f"{res[f'{which}_first_ms']:8.2f}")
    print(f"  abicache hit / cuda.core hit: {res['abicache_hit_ms'] / res['cuda.core_hit_ms']:.2f}x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cuda_core.json").write_text(json.dumps({**res, "when": time.strftime("%Y-%m-%d %H:%M:%S")},
                                                       indent=2))


if __name__ == "__main__":
    main()
