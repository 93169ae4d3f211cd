"""GPU truth: every GPU promise of abicache executed on a real GPU (run it as `bash bench/gpu`).

Checks (bench/gpu_suite/gpu_checks.py), each against a reference computed another way:
  1. cuda.compile (nvcc, NVRTC) of cubin, PTX, fatbin, loaded from the store by the
     driver and launched (numpy reference); cubins and PTX for other targets judged by
     the requirement model and by the driver, which must agree;
  2. the driver-version floor: cuda.driver against cuDriverGetVersion, and PTX of a newer
     ISA than the driver knows, refused by both for the same reason;
  3. Triton through abicache.triton, launched; fresh processes served from the store;
     first launch in a fresh process against Triton's default cache and against the
     floor (Triton's own path with every lookup answered from memory; the same cubin
     through cuModuleLoadData by hand);
  4. torch CUDA extensions (classic with cuda_sources; a stable-ABI op with CUDA
     sources) called on CUDA tensors; fresh-process hit against torch's load_inline
     and against the floor (the same .so imported by path);
  5. a program linked against `abicache stub cudart`, run against the real runtime
     (malloc, memcpy, a launch through the runtime) and with no runtime at all;
  6. gpu.arch, cuda.driver and cuda.runtime facts against nvidia-smi and the loader;
  7. a CUDA extension kept as a source tree, load()ed warm: against torch's load()
     and the floor (bench/gpu_suite/gpu_speed.py);
  8. 1 to 1,000 distinct Triton kernels launched from the store in one fresh process,
     against Triton's own cache (ABICACHE_GPU_KERNELS=1,10,100,1000).
Without a GPU it runs what can run (compiles, the stub with no runtime, the model's
verdicts) and says for each skipped row what was missing. Prints a table, writes
bench/results/gpu.json; exits 1 if any row fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

# bench/ is sys.path[0] when run as a script, and bench/cuda.py would shadow the
# `cuda` namespace package of cuda-bindings (a module anywhere on the path beats a
# namespace package): the checks live in bench/gpu_suite/, bench/ leaves the path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != _HERE] + [str(_HERE / "gpu_suite")]

import gpu_checks  # noqa: E402
import gpu_speed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run_facts(ctx: gpu_checks.Context) -> dict[str, str]:
    """What this run ran on, for the top of the table."""
    from abicache.env import probes

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    smi = shutil.which("nvidia-smi")
    gpu = "none"
    if smi:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
        gpu = out.stdout.strip() or out.stderr.strip()[:200]
    facts = ctx.cache.facts
    return {
        "GPU (nvidia-smi: name, driver, memory)": gpu,
        "abicache facts": f"gpu.arch={facts.get('gpu.arch')} cuda.driver={facts.get('cuda.driver')} "
                          f"cuda.runtime={facts.get('cuda.runtime')}",
        "nvcc": str(probes.nvcc_path() or "not found") + f" ({(facts.get('cuda.nvcc') or '').split(',')[-1].strip()})",
        "python": f"{sys.executable} {platform.python_version()}",
        "torch / triton / cuda-bindings / cupy": " / ".join(version(d) for d in
                                                           ("torch", "triton", "cuda-bindings", "cupy-cuda13x")),
        "TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST", "(unset)"),
        "abicache's own dependencies from bench/wheels": os.environ.get("ABICACHE_GPU_WHEELS", "none needed"),
        "GPU checks": "run" if not ctx.no_gpu else f"skipped where a GPU is needed: {ctx.no_gpu}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-gpu", action="store_true", help="run only what needs no GPU, even if one is present")
    parser.add_argument("--only", help="comma-separated check numbers, run in that order, e.g. 3,8,1")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu.json")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (its path is printed)")
    parser.add_argument("--profile", type=Path, help="also run each abicache hit once under cProfile; append the "
                        "top functions to this file")
    args = parser.parse_args()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="abicache-gpu-"))
    try:
        ctx = gpu_checks.Context(work, args.no_gpu, args.profile and args.profile.resolve())
        facts = run_facts(ctx)
        rows = []
        every = gpu_checks.CHECKS + gpu_speed.CHECKS
        # --only runs the checks in the order it names them (the first ones first where time is short)
        chosen = [(n, c) for want in args.only.split(",") for n, c in every if n.split()[0] == want.strip()] \
            if args.only else every
        for name, check in chosen:
            t = time.perf_counter()
            print(f"bench/gpu: check {name} ...", file=sys.stderr, flush=True)
            try:
                got = check(ctx)
            except Exception as exc:  # a broken check is a failed row, and the others still run
                got = [gpu_checks.row(name, "(the check itself)", "FAIL",
                                      f"{type(exc).__name__}: {exc} | {traceback.format_exc(limit=-3)[-900:]}")]
            for r in got:
                r["seconds"] = round(time.perf_counter() - t, 2)
            rows += got
            save(facts, rows, time.perf_counter() - started, args.out)  # what ran so far survives a kill
    finally:
        if args.keep:
            print(f"bench/gpu: scratch kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(facts, rows, time.perf_counter() - started, args.out)
    return 1 if any(r["verdict"] == "FAIL" for r in rows) else 0


def report(facts: dict[str, str], rows: list[dict], seconds: float, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=220)
    head = Table(title="bench/gpu: what it ran on", title_justify="left", show_header=False)
    for key, value in facts.items():
        head.add_row(key, value)
    console.print(head)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("pass", "FAIL", "skip")}
    table = Table(title=f"bench/gpu: {counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} skipped "
                        f"in {seconds:.0f} s", title_justify="left")
    for col in ("check", "case", "verdict", "detail"):
        table.add_column(col, overflow="fold")
    for r in rows:
        style = {"pass": "green", "FAIL": "bold red", "skip": "yellow"}[r["verdict"]]
        table.add_row(r["check"], r["case"], f"[{style}]{r['verdict']}[/]", r["detail"])
    console.print(table)
    save(facts, rows, seconds, out)
    print(f"bench/gpu: wrote {out}", file=sys.stderr)


def save(facts: dict[str, str], rows: list[dict], seconds: float, out: Path) -> None:
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("pass", "FAIL", "skip")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"facts": facts, "rows": rows, "counts": counts, "seconds": seconds}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
