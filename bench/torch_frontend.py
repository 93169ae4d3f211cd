"""abicache.torch against torch.utils.cpp_extension.load_inline, same sources, same run.

Cold build, warm hit in-process, and time to the first call in a fresh
process (with `import torch`, which both need), plus a stable-ABI op. The load
after `import torch` is shown beside its floor: the same `.so` imported by path
in a fresh process (Python's own import of the file; nothing checked), and
split in two: importing the frontend's modules, and the load call itself. And the load in a
process started just after a file was written in its working folder (its sys.path[0], which a
torch extension's record watches for names): a script's output, written beside it.

    python3 bench/torch_frontend.py [--rounds 11]

Rounds alternate the two tools; this machine runs in two speeds ~30% apart, so 5 rounds
(the old default) could put most of one tool's in the slow one.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from common import run_json as run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SRC = "int64_t add(int64_t a, int64_t b) { return a + b; }"
STABLE = r"""
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/ops.h>
using torch::stable::Tensor;
Tensor my_fill(Tensor t, double v) { Tensor o = torch::stable::empty_like(t); torch::stable::fill_(o, v); return o; }
STABLE_TORCH_LIBRARY(bench_stable, m) { m.def("my_fill(Tensor t, float v) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(bench_stable, CPU, m) { m.impl("my_fill", TORCH_BOX(&my_fill)); }
"""
CALLS = {
    "abicache": f"import abicache.torch as at\nload = lambda: at.load_inline('bench_ext', [{SRC!r}], functions=['add'])",
    "torch": "from torch.utils.cpp_extension import load_inline\n"
             f"load = lambda: load_inline('bench_ext', cpp_sources=[{SRC!r}], functions=['add'])",
}


# The time the garbage collector takes after `import torch`: torch leaves tens of thousands of
# young objects, and any code that then allocates a few thousand (importing modules does) sets off
# a collection of them (2-4 ms on the 2-core machine) that the floor's few allocations do not.
GC_CLOCK = """
import gc
gc_s, gc_start = [0.0], [0.0]
def _clock(phase, info):
    if phase == "start":
        gc_start[0] = time.perf_counter()
    else:
        gc_s[0] += time.perf_counter() - gc_start[0]
gc.callbacks.append(_clock)
"""


# The floor of the load after `import torch`: the very file imported by path, as Python's import would.
FLOOR = """
import importlib.util, json, time
import torch
t = time.perf_counter()
spec = importlib.util.spec_from_file_location("bench_ext", {path!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); assert m.add(2, 3) == 5
print(json.dumps({{"s": time.perf_counter() - t}}))
"""


#: how long before the next process a file is written in its working folder (a script's output,
#: written as it ends: the next one starts later than this)
WRITTEN_GAP_S = 0.2


PRELUDE = "import json, time, timeit\nstart = time.perf_counter()\nimport torch\nafter_import = time.perf_counter()\n"
HIT = """
imported = time.perf_counter()
m = load(); assert m.add(2, 3) == 5
t = time.perf_counter()
print(json.dumps({"first_call_s": t - start, "after_import_s": t - after_import, "gc_s": gc_s[0],
                  "frontend_import_s": imported - after_import, "call_s": t - imported, "path": m.__file__}))"""


def measure(env: dict[str, str], runs: int, cwd: str) -> dict[str, dict[str, float]]:
    """Each tool's cold build, then their fresh-process hits and floors alternating (a process's
    `import torch` alone varies by a second on this machine: neither tool takes all slow rounds).
    Every process works in cwd, its sys.path[0]; each round also runs one after a file was just
    written there (WRITTEN_GAP_S before), as a script's output beside it is."""
    tools = list(CALLS)
    res = {which: run(PRELUDE + CALLS[which] + """
m = load(); assert m.add(2, 3) == 5
print(json.dumps({"cold_s": time.perf_counter() - after_import}))""", env, cwd=cwd) for which in tools}
    hits: dict[str, list[dict[str, float]]] = {which: [] for which in tools}
    written: dict[str, list[dict[str, float]]] = {which: [] for which in tools}
    floors: dict[str, list[float]] = {which: [] for which in tools}
    for round_ in range(runs):
        for which in tools if round_ % 2 == 0 else tools[::-1]:
            hits[which].append(run(PRELUDE + GC_CLOCK + CALLS[which] + HIT, env, cwd=cwd))
            floors[which].append(run(FLOOR.format(path=hits[which][0]["path"]), env, cwd=cwd)["s"])
            Path(cwd, f"output-{which}-{round_}.txt").write_text("a script's output\n")
            time.sleep(WRITTEN_GAP_S)
            written[which].append(run(PRELUDE + GC_CLOCK + CALLS[which] + HIT, env, cwd=cwd))
    for which in tools:
        for key in ("first_call_s", "after_import_s", "frontend_import_s", "call_s", "gc_s"):
            res[which][key] = statistics.median(h[key] for h in hits[which])
        res[which]["written_s"] = statistics.median(h["after_import_s"] for h in written[which])
        res[which]["floor_s"] = statistics.median(floors[which])
        res[which]["repeat_us"] = 1e6 * run(PRELUDE + CALLS[which] + """
load(); n = 200
print(json.dumps({"s": min(timeit.repeat(load, number=n, repeat=3)) / n}))""", env)["s"]
    return res


def stable_cold(env: dict[str, str]) -> float:
    return run(f"""
import json, time, torch, abicache.torch as at
t = time.perf_counter(); at.load_inline('bench_stable', [{STABLE!r}], stable=True)
print(json.dumps({{"s": time.perf_counter() - t}}))""", env)["s"]


def main() -> None:
    import argparse

    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=11, help="fresh-process rounds of each tool (11)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="abicache-torch-bench-"))
    env = {"ABICACHE_DIR": str(work / "abicache"), "TORCH_EXTENSIONS_DIR": str(work / "torch_ext"),
           "ABICACHE_PROGRESS": "0"}
    (work / "script").mkdir()
    try:
        measured = measure(env, args.rounds, str(work / "script"))
        stable = stable_cold(env)
    finally:  # the builds, and with the store the keeper its first build started (it leaves when the store goes)
        shutil.rmtree(work, ignore_errors=True)
    ours, theirs = measured["abicache"], measured["torch"]
    table = Table(title="abicache.torch vs torch.utils.cpp_extension.load_inline (pybind module, same source, "
                        f"medians of {args.rounds} rounds)",
                  title_justify="left")
    for col in ("measure", "abicache", "cpp_extension", "cpp_extension / abicache"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    rows = [("cold build (after import torch)", "cold_s", 1e3, "ms"),
            ("first call, fresh process (incl. import torch)", "first_call_s", 1e3, "ms"),
            ("  of which: load after import torch", "after_import_s", 1e3, "ms"),
            ("    importing the frontend's modules", "frontend_import_s", 1e3, "ms"),
            ("    the load call (key, lookup, checks, dlopen)", "call_s", 1e3, "ms"),
            ("    of these, garbage collection of torch's young objects", "gc_s", 1e3, "ms"),
            ("  the load, a file just written in its working folder", "written_s", 1e3, "ms"),
            ("warm hit, repeated in-process", "repeat_us", 1, "us")]
    for label, key, scale, unit in rows:
        a, b = ours[key] * scale, theirs[key] * scale
        table.add_row(label, f"{a:,.2f} {unit}", f"{b:,.2f} {unit}", f"{b / a:,.1f}x" if a else "")
    table.add_row("  floor: the same .so imported by path", f"{ours['floor_s'] * 1e3:,.2f} ms",
                  f"{theirs['floor_s'] * 1e3:,.2f} ms",
                  f"load / floor: {ours['after_import_s'] / ours['floor_s']:,.1f}x and "
                  f"{theirs['after_import_s'] / theirs['floor_s']:,.1f}x; the call alone "
                  f"{ours['call_s'] / ours['floor_s']:,.1f}x and {theirs['call_s'] / theirs['floor_s']:,.1f}x")
    table.add_row("stable-ABI op, cold build (abicache only)", f"{stable * 1e3:,.0f} ms", "", "")
    Console(width=200).print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "torch.json").write_text(json.dumps({"abicache": ours, "cpp_extension": theirs,
                                                    "stable_cold_s": stable}, indent=2))


if __name__ == "__main__":
    main()
