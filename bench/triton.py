"""abicache.triton against Triton's default cache, same kernel, same run.

First cache hit in a fresh process (Triton's default hashes libtriton.so there),
and the disk used for the same kernel compiled under several Python versions.
The 3.12 column needs the venv the tests make (~/.cache/abicache-test-venvs).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import base_env

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "tests" / "triton_kernel.py"
RESULTS = ROOT / "bench" / "results"
PY312 = Path(os.environ.get("ABICACHE_TEST_VENVS", Path.home() / ".cache" / "abicache-test-venvs")) / "py312-triton" / "bin" / "python"


def compile_once(python: str, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([python, str(KERNEL)], capture_output=True, text=True,
                         env={**base_env(), "PYTHONPATH": str(ROOT / "src"), **env}, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) if path.exists() else 0


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    work = Path(tempfile.mkdtemp(prefix="abicache-triton-bench-"))
    default_env = {"DEFAULT_CACHE": "1", "TRITON_CACHE_DIR": str(work / "triton")}
    ours_env = {"ABICACHE_DIR": str(work / "abicache"), "TRITON_CACHE_DIR": str(work / "unused")}
    pythons = [sys.executable] + ([str(PY312)] if PY312.exists() else [])
    for python in pythons:  # cold compiles fill both caches
        compile_once(python, default_env)
        compile_once(python, ours_env)
    hits = {name: [compile_once(sys.executable, env) for _ in range(5)]
            for name, env in (("default", default_env), ("abicache", ours_env))}
    med = {name: {k: statistics.median(r[k] for r in runs) for k in ("hit_path_s", "total_s")}
           for name, runs in hits.items()}
    sizes = {"default": du(work / "triton"), "abicache": du(work / "abicache" / "v3" / "blobs")}
    table = Table(title=f"Triton 3.9 default cache vs abicache.triton (medians of 5 fresh processes, "
                        f"{len(pythons)} Python versions)", title_justify="left")
    for col in ("measure", "Triton default", "abicache", "default / abicache"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    for label, key in (("first hit: install + triton.compile", "hit_path_s"),
                       ("whole process to compiled kernel", "total_s")):
        a, b = med["default"][key], med["abicache"][key]
        table.add_row(label, f"{a * 1e3:,.1f} ms", f"{b * 1e3:,.1f} ms", f"{a / b:,.1f}x")
    table.add_row(f"disk for the kernel under {len(pythons)} Python versions", f"{sizes['default'] / 1024:,.1f} KiB",
                  f"{sizes['abicache'] / 1024:,.1f} KiB", f"{sizes['default'] / max(sizes['abicache'], 1):,.1f}x")
    Console(width=200).print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "triton.json").write_text(json.dumps({"medians": med, "disk_bytes": sizes,
                                                     "pythons": len(pythons)}, indent=2))


if __name__ == "__main__":
    main()
