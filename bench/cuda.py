"""CUDA benchmarks: NVRTC cold compile vs cached hit, and the library loader."""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from common import run_json as run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
KERNEL = ('extern "C" __global__ void scale(float* x, float a, int n) '
          "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }")




def main() -> None:
    from rich.console import Console
    from rich.table import Table

    work = Path(tempfile.mkdtemp(prefix="abicache-cuda-bench-"))
    env = {"ABICACHE_DIR": str(work), "ABICACHE_PROGRESS": "0"}
    colds, hits = [], []
    for i in range(5):
        source = KERNEL + f"\n// variant {i}\n"
        got = run(f"""
            import json, time
            from abicache import cuda
            t = time.perf_counter(); cuda.compile({source!r}, arch="sm_90", compiler="nvrtc"); cold = time.perf_counter() - t
            print(json.dumps({{"cold": cold}}))""", env)
        colds.append(got["cold"])
        got = run(f"""
            import json, time
            from abicache import cuda
            t = time.perf_counter(); c = cuda.compile({source!r}, arch="sm_90", compiler="nvrtc"); assert c.artifact.hit
            print(json.dumps({{"hit": time.perf_counter() - t}}))""", env)
        hits.append(got["hit"])
    loader = run("""
        import json, time
        from abicache.cuda import load_library
        t = time.perf_counter(); lib = load_library("nvrtc"); first = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(1000): load_library("nvrtc")
        print(json.dumps({"first": first, "repeat": (time.perf_counter() - t) / 1000, "major": lib.major}))""", env)
    cold, hit = statistics.median(colds), statistics.median(hits)
    table = Table(title=f"CUDA (NVRTC {loader['major']}, sm_90 cubin; medians of 5, fresh processes)",
                  title_justify="left")
    for col in ("measure", "time", "ratio"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    table.add_row("NVRTC compile, cold (incl. loading NVRTC)", f"{cold * 1e3:,.1f} ms", "")
    table.add_row("cached hit, fresh process (NVRTC not loaded)", f"{hit * 1e3:,.1f} ms", f"{cold / hit:,.1f}x faster")
    table.add_row("load_library('nvrtc'), first in a process", f"{loader['first'] * 1e3:,.2f} ms", "")
    table.add_row("load_library('nvrtc'), repeated", f"{loader['repeat'] * 1e6:,.2f} us", "")
    Console(width=200).print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cuda.json").write_text(json.dumps({"nvrtc_cold_s": cold, "nvrtc_hit_s": hit, "loader": loader},
                                                  indent=2))


if __name__ == "__main__":
    main()
