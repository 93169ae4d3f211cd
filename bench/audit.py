"""Audit benchmarks: how long reading a binary's requirements takes.

A generated ~1 MB library (thousands of exported functions, libc imports)
and the installed libtorch_cpu.so (~400 MB, 70k+ dynamic symbols), each in a
fresh process so the imports (pyelftools, abi3info) are counted once.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import textwrap
from pathlib import Path

from common import run_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def one_mb_library(work: Path) -> Path:
    lines = ["#include <stdio.h>", "#include <string.h>"]
    for i in range(5200):
        lines.append(f'int fn_{i}(char* out, const char* s) {{ return sprintf(out, "{i}:%s:%zu", s, strlen(s)); }}')
    src = work / "big.c"
    src.write_text("\n".join(lines))
    out = work / "libbig.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O0", str(src), "-o", str(out)], check=True)
    return out


def time_audit(path: Path, runs: int) -> tuple[float, float]:
    """(median seconds in a fresh process incl. imports, median of repeated in-process audits)."""
    code = textwrap.dedent(f"""
        import json, time
        t = time.perf_counter()
        from abicache.audit import audit_file
        first = audit_file({str(path)!r})
        cold = time.perf_counter() - t
        warm = []
        for _ in range(3):
            t = time.perf_counter(); audit_file({str(path)!r}); warm.append(time.perf_counter() - t)
        print(json.dumps([cold, min(warm), len(first.findings)]))
    """)
    colds, warms = [], []
    for _ in range(runs):
        cold, warm, _ = run_json(code, {})
        colds.append(cold)
        warms.append(warm)
    return statistics.median(colds), statistics.median(warms)


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    from abicache.env import Facts

    work = Path(tempfile.mkdtemp(prefix="abicache-audit-bench-"))
    targets = [("generated library", one_mb_library(work))]
    torch_root = Facts().get("torch.root")
    if torch_root:
        targets.append(("libtorch_cpu.so", Path(torch_root) / "lib" / "libtorch_cpu.so"))
    table = Table(title="audit benchmarks (median)", title_justify="left")
    for col in ("file", "size", "fresh process (with imports)", "repeated in-process"):
        table.add_column(col, justify="left" if col == "file" else "right")
    doc = {}
    for label, path in targets:
        runs = 5 if path.stat().st_size < 50 << 20 else 3
        cold, warm = time_audit(path, runs)
        size = path.stat().st_size / (1 << 20)
        table.add_row(label, f"{size:,.1f} MiB", f"{cold * 1e3:,.0f} ms", f"{warm * 1e3:,.0f} ms")
        doc[label] = {"bytes": path.stat().st_size, "fresh_s": cold, "repeat_s": warm}
    Console(width=200).print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "audit.json").write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
