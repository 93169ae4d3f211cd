"""torch.compile warm start through abicache.torch.compile_cache, on Inductor's CPU
backend: a fresh process on a "new machine" (its own TORCHINDUCTOR_CACHE_DIR) compiling
a 40-step function cold, against the same with the saved entry loaded first.

    python bench/torch_compile.py

Rounds alternate cold and warm. The floor is what any fresh Inductor cache dir costs
before the first graph (its CPU ISA probes: small C++ programs it compiles and keeps in
that dir; torch's cache artifacts do not carry them).
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import run_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ROUNDS = 3

PROGRAM = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
import torch
from abicache import Cache
from abicache.torch import compile_cache
cache = Cache({store!r}, remote=False)

def g(x, y):
    for i in range(40):
        x = torch.sin(x) * y + torch.cos(y * (i + 1))
        if i % 8 == 0:
            x = x - x.mean(dim=-1, keepdim=True)
        y = torch.tanh(y + x * 0.5)
    return x.sum() + y.sum()

x, y = torch.randn(64, 128), torch.randn(64, 128)
t = time.perf_counter()
if {mode!r} == "floor":
    torch.compile(lambda a: a + 1)(x)
else:
    if {mode!r} == "warm":
        assert compile_cache.load("bench-40", cache=cache).loaded
    torch.compile(g)(x, y)
seconds = time.perf_counter() - t
if {mode!r} == "save":
    compile_cache.save("bench-40", cache=cache)
print(json.dumps(seconds))
"""


def once(work: Path, mode: str, n: int) -> float:
    return float(run_json(PROGRAM.format(store=str(work / "store"), mode=mode),
                          {"TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-{mode}-{n}"), "ABICACHE_PROGRESS": "0"}))


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="abicache-bench-compile-"))
    try:
        res: dict[str, list[float]] = {"save": [once(work, "save", 0)], "cold": [], "warm": [], "floor": []}
        for n in range(ROUNDS):
            for mode in (("cold", "warm") if n % 2 == 0 else ("warm", "cold")):
                res[mode].append(once(work, mode, n))
            res["floor"].append(once(work, "floor", n))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cold, warm, floor = (statistics.median(res[m]) for m in ("cold", "warm", "floor"))
    print(f"torch.compile, fresh process and Inductor cache dir, medians of {ROUNDS} alternating rounds:")
    print(f"  cold compile              {cold:6.2f} s   ({', '.join(f'{v:.2f}' for v in res['cold'])})")
    print(f"  warm, entry loaded first  {warm:6.2f} s   ({', '.join(f'{v:.2f}' for v in res['warm'])})  "
          f"{cold / warm:.2f}x faster")
    print(f"  floor: a one-op compile   {floor:6.2f} s   (Inductor's per-cache-dir CPU probes)")
    print(f"  beyond the floor: cold {cold - floor:.2f} s, warm {warm - floor:.2f} s "
          f"({(cold - floor) / max(warm - floor, 1e-3):.1f}x)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "torch_compile.json").write_text(json.dumps({**res, "when": time.strftime("%Y-%m-%d %H:%M:%S")},
                                                           indent=1))


if __name__ == "__main__":
    sys.exit(main())
