"""bench/gpu's speed checks beside their floors (issue: speed against the floor).

  7. a torch CUDA extension kept as a source tree (4 files, 2 headers), load()ed
     warm in fresh processes: abicache against torch's own load() and against
     the same .so imported by path;
  8. many distinct Triton kernels (1, 10, 100, 1,000 by default) launched from
     the store in one fresh process, against Triton's own cache.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Callable

import gpu_scripts
from gpu_checks import WARM_RUNS, Context, row

TREE_FILES = {
    "include/ops.h": """#pragma once
#include <torch/extension.h>
torch::Tensor axpb(torch::Tensor x, double a, double b);
void launch_scale(const float* x, float* y, float a, int64_t n);
void launch_shift(float* y, float b, int64_t n);
""",
    "include/kernels.cuh": """#pragma once
#include <cstdint>
#define THREADS 256
inline int blocks_for(int64_t n) { return (int)((n + THREADS - 1) / THREADS); }
""",
    "csrc/main.cpp": """#include "ops.h"
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("axpb", &axpb, "a * x + b"); }
""",
    "csrc/ops.cpp": """#include "ops.h"
torch::Tensor axpb(torch::Tensor x, double a, double b) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "a float CUDA tensor");
  auto y = torch::empty_like(x);
  launch_scale(x.data_ptr<float>(), y.data_ptr<float>(), (float)a, x.numel());
  launch_shift(y.data_ptr<float>(), (float)b, y.numel());
  return y;
}
""",
    "csrc/scale.cu": """#include "kernels.cuh"
__global__ void scale_kernel(const float* x, float* y, float a, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
void launch_scale(const float* x, float* y, float a, int64_t n) { scale_kernel<<<blocks_for(n), THREADS>>>(x, y, a, n); }
""",
    "csrc/shift.cu": """#include "kernels.cuh"
__global__ void shift_kernel(float* y, float b, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] += b;
}
void launch_shift(float* y, float b, int64_t n) { shift_kernel<<<blocks_for(n), THREADS>>>(y, b, n); }
""",
}


def check_tree(ctx: Context) -> list[dict]:
    """7: the source tree, cold once per tool, then warm loads against torch's and the floor."""
    check = "7 torch CUDA tree"
    if ctx.cache.facts.get("torch.root") is None:
        return [row(check, "load() of a source tree", "skip", "torch is not installed")]
    flavor = ctx.cache.facts.get("torch.flavor")
    if ctx.no_gpu or flavor != "cuda":
        why = ctx.no_gpu or f"this torch is {ctx.cache.facts.get('torch.version')} ({flavor}), not a CUDA build"
        return [row(check, "load() of a source tree", "skip", f"needs a CUDA torch and a GPU: {why}")]
    root = ctx.work / "tree"
    for rel, text in TREE_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    tree = {"sources": [str(root / rel) for rel in TREE_FILES if rel.startswith("csrc/")],
            "include": str(root / "include")}
    env = {"TREE": json.dumps(tree), "MAX_JOBS": str(os.cpu_count())}
    build_dir = ctx.work / "tree-torch"
    build_dir.mkdir(exist_ok=True)
    medians, colds, served = {}, {}, 0
    for mode in ("abicache", "torch"):
        colds[mode] = ctx.python(gpu_scripts.TREE, mode, str(build_dir), env=env, timeout=540)
        ctx.python(gpu_scripts.TREE, mode, str(build_dir), env=env)  # the first hit stamps the witnesses
        warm = [ctx.python(gpu_scripts.TREE, mode, str(build_dir), env=env) for _ in range(WARM_RUNS)]
        medians[mode] = statistics.median(w["load_s"] for w in warm)
        served += sum(bool(w["served"]) for w in warm)
        if max(w["err"] for w in [colds[mode], *warm]) > 1e-5:
            return [row(check, f"load() of a source tree ({mode})", "FAIL", f"max error {warm[0]['err']:.1e}")]
    ctx.profiled(gpu_scripts.TREE, "abicache", str(build_dir), env=env)
    floor = statistics.median(ctx.python(gpu_scripts.TREE, "floor", colds["abicache"]["path"], env=env)["load_s"]
                              for _ in range(WARM_RUNS))
    a, t = medians["abicache"], medians["torch"]
    met = a <= t and a / floor <= 1.2
    return [row(check, "4 sources, 2 headers: built by each tool, called on CUDA tensors", "pass",
                f"cold: abicache {colds['abicache']['load_s']:.1f} s, torch {colds['torch']['load_s']:.1f} s; "
                "answers exact"),
            row(check, "warm load() in a fresh process (median)", "pass",
                f"abicache {a * 1e3:.1f} ms, torch's load {t * 1e3:.1f} ms ({t / a:.2f}x), the .so imported by path "
                f"{floor * 1e3:.1f} ms: abicache / floor = {a / floor:.2f}x (targets <= torch and <= 1.2x the floor: "
                f"{'met' if met else 'NOT met'}); served by its hit record: {served} of {WARM_RUNS}",
                abicache_s=a, torch_s=t, floor_s=floor)]


def kernel_counts() -> list[int]:
    return sorted({int(n) for n in os.environ.get("ABICACHE_GPU_KERNELS", "1,10,100,1000").split(",")})


def check_many_kernels(ctx: Context) -> list[dict]:
    """8: every count of distinct kernels compiled once (workers in parallel), then launched warm."""
    check = "8 many Triton kernels"
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return [row(check, "distinct kernels warm", "skip", f"triton is not installed ({exc})")]
    if ctx.no_gpu:
        return [row(check, "distinct kernels warm", "skip", f"launching needs a GPU: {ctx.no_gpu}; bench/scale.py "
                    "measures the CPU half (1,000 C libraries in one process)")]
    counts = kernel_counts()
    envs = {mode: {"TRITON_CACHE_DIR": str(ctx.work / f"kernels-{mode}" / "triton"),
                   "ABICACHE_DIR": str(ctx.work / f"kernels-{mode}" / "store")} for mode in ("abicache", "default")}
    for mode, env in envs.items():
        _in_parallel(ctx, gpu_scripts.KERNELS, mode, max(counts), env)
    got: dict[str, dict[int, float]] = {mode: {} for mode in envs}
    for count in counts:  # alternate the tools: neither gets a warmer page cache
        for mode, env in envs.items():
            done = ctx.python(gpu_scripts.KERNELS, mode, str(count), env=env, timeout=600)
            if done["err"] > 1e-5:
                return [row(check, f"{count} kernels ({mode})", "FAIL", f"max error {done['err']:.1e}")]
            got[mode][count] = done["seconds"]
    ctx.profiled(gpu_scripts.KERNELS, "abicache", str(max(counts)), env=envs["abicache"])
    rows = [row(check, f"{n} distinct kernels in a fresh process", "pass",
                f"abicache {got['abicache'][n] * 1e3:.0f} ms ({got['abicache'][n] / n * 1e3:.2f} ms a kernel), "
                f"Triton's own cache {got['default'][n] * 1e3:.0f} ms ({got['default'][n] / n * 1e3:.2f} ms a kernel): "
                f"{got['default'][n] / got['abicache'][n]:.2f}x", abicache_s=got["abicache"][n],
                default_s=got["default"][n], kernels=n) for n in counts]
    if len(counts) > 2:
        small, big = counts[1], counts[-1]
        flat = (got["abicache"][big] / big) / (got["abicache"][small] / small)
        marginal = {m: (got[m][big] - got[m][counts[0]]) / (big - counts[0]) for m in got}
        rows.append(row(check, f"per-kernel cost, {small} to {big} kernels", "pass",
                        f"abicache {big} / {small}: {flat:.2f}x (target <= 1.2x: {'met' if flat <= 1.2 else 'NOT met'}); "
                        f"each kernel after the first: abicache {marginal['abicache'] * 1e3:.2f} ms, Triton's own "
                        f"{marginal['default'] * 1e3:.2f} ms", flat=flat))
    return rows


def _in_parallel(ctx: Context, script: str, mode: str, count: int, env: dict[str, str]) -> None:
    """Compile `count` kernels cold with one worker process a core (each its share)."""
    workers = max(1, min(os.cpu_count() or 1, 16))
    path = ctx.work / "kernels-cold.py"
    path.write_text(script)
    procs = [subprocess.Popen([sys.executable, str(path), mode, str(count), str(w), str(workers)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**ctx.env, **env})
             for w in range(workers)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"a {mode} compiling worker exited {proc.returncode}: {err[-1500:]}")
    print(f"bench/gpu: {count} kernels compiled cold ({mode}, {workers} workers)", file=sys.stderr, flush=True)


CHECKS: list[tuple[str, Callable[[Context], list[dict]]]] = [
    ("7 torch CUDA tree", check_tree),
    ("8 many Triton kernels", check_many_kernels),
]
