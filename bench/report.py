"""One report from every benchmark's results (bench/results/*.json): markdown
tables with the ratios against torch, tvm-ffi and Triton measured in the same
run, and charts. Written to bench/results/report.md (+ *.png)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def load(name: str) -> Any:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def table(columns: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def ratio(theirs: float, ours: float) -> str:
    return f"{theirs / ours:,.1f}x" if ours else "-"


def hit_rows(f: dict[str, Any], t: dict[str, Any] | None, tr: dict[str, Any] | None) -> list[list[Any]]:
    a, tv, to = f["abicache"], f["tvm_ffi"], f["torch"]
    rows = [
        ["import", f"{a['import_ms']:.1f} ms", f"{tv['import_ms']:.0f} ms ({ratio(tv['import_ms'], a['import_ms'])})",
         f"{to['import_ms']:.0f} ms ({ratio(to['import_ms'], a['import_ms'])})"],
        ["warm hit, fresh process", f"{a['fresh_hit_ms']:.2f} ms",
         f"{tv['fresh_hit_ms']:.2f} ms ({ratio(tv['fresh_hit_ms'], a['fresh_hit_ms'])})",
         f"{to['fresh_hit_ms']:.2f} ms ({ratio(to['fresh_hit_ms'], a['fresh_hit_ms'])})"],
        ["warm hit, in-process", f"{a['repeat_hit_us']:.2f} µs",
         f"{tv['repeat_hit_us']:.0f} µs ({ratio(tv['repeat_hit_us'], a['repeat_hit_us'])})",
         f"{to['repeat_hit_us']:.1f} µs ({ratio(to['repeat_hit_us'], a['repeat_hit_us'])})"],
    ]
    if t:
        rows.append(["torch extension: find and load after `import torch`", f"{t['abicache']['after_import_s'] * 1e3:.1f} ms",
                     "", f"{t['cpp_extension']['after_import_s'] * 1e3:.0f} ms "
                         f"({ratio(t['cpp_extension']['after_import_s'], t['abicache']['after_import_s'])})"])
    if tr:
        m = tr["medians"]
        rows.append(["Triton kernel: first hit in a fresh process", f"{m['abicache']['hit_path_s'] * 1e3:.1f} ms",
                     "", f"Triton's cache: {m['default']['hit_path_s'] * 1e3:.0f} ms "
                         f"({ratio(m['default']['hit_path_s'], m['abicache']['hit_path_s'])})"])
    return rows


def ratio_chart(rows: list[tuple[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(rows)), dpi=120)
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color="#1f77b4")
    ax.set_xscale("log")
    ax.set_xlabel("times faster than the system it replaces (log scale, same run)")
    for i, (_, v) in enumerate(rows):
        ax.text(v, i, f" {v:,.1f}x", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    f, t, tr = load("foundation"), load("torch"), load("triton")
    parts = [f"# abicache benchmark report\n\nGenerated {time.strftime('%Y-%m-%d %H:%M')} from "
             f"`bench/results/*.json` (one `bash bench/run`, one machine).\n"]
    if f:
        parts.append("## Hits against the systems abicache replaces\n\n" + table(
            ["measure", "abicache", "tvm-ffi", "torch / Triton"], hit_rows(f, t, tr)))
        speedups = [("hit, fresh process vs tvm-ffi", f["tvm_ffi"]["fresh_hit_ms"] / f["abicache"]["fresh_hit_ms"]),
                    ("hit, fresh process vs torch", f["torch"]["fresh_hit_ms"] / f["abicache"]["fresh_hit_ms"]),
                    ("hit, in-process vs torch", f["torch"]["repeat_hit_us"] / f["abicache"]["repeat_hit_us"])]
        if t:
            speedups.append(("torch ext. load after import", t["cpp_extension"]["after_import_s"] / t["abicache"]["after_import_s"]))
        if tr:
            speedups.append(("Triton first hit", tr["medians"]["default"]["hit_path_s"] / tr["medians"]["abicache"]["hit_path_s"]))
        ratio_chart(speedups, RESULTS / "ratios.png")
        parts.append("![speedups](ratios.png)\n")
    m = load("matrix")
    if m:
        rows = [[n, s["unsafe"], s["needless"], s["builds"], f"{s['builds'] / m['minimum_builds']:.2f}x", s["mechanism"]]
                for n, s in m["schemes"].items()]
        parts.append(f"## Compatibility matrix ({len(m['environments'])} environments x {len(m['artifacts'])} "
                     f"artifacts, minimum {m['minimum_builds']} builds)\n\n"
                     + table(["scheme", "unsafe reuses", "needless rebuilds", "builds", "vs minimum", "why"], rows)
                     + "\n![matrix](matrix.png)\n")
    r = load("remote")
    if r:
        rows = [[k.replace("_", " "), f"{v['abicache_s'] * 1e3:.1f} ms", f"{v['raw_s'] * 1e3:.1f} ms",
                 f"{v['ratio']:.0%}"] for k, v in r.items() if isinstance(v, dict) and "ratio" in v]
        parts.append("## Remote tier: hit vs the raw client downloading the same object\n\n"
                     + table(["remote, artifact", "abicache remote hit", "raw client", "abicache / raw throughput"], rows))
    fleet = load("fleet")
    if fleet:
        rows = [[x["run"], x["builds"], x["fetched"], x["wrong_loads"], f"{x['finished']}/{x['machines']}",
                 f"{x['bytes_up'] / 1e6:.2f} / {x['bytes_down'] / 1e6:.2f} MB",
                 *(f"{x[k] * 1e3:.0f} ms" if x[k] is not None else "-" for k in ("p50_s", "p99_s", "slowest_machine_s"))]
                for x in fleet["runs"]]
        parts.append(f"## Fleet: {fleet['nodes']} machines x {fleet['artifacts']} artifacts on one SeaweedFS\n\n"
                     + table(["run", "builds", "fetched", "wrong loads", "finished", "moved up / down", "p50", "p99",
                              "slowest machine"], rows))
    fl = load("faults")
    if fl:
        parts.append("## Fault injection\n\n" + table(
            ["trials of", "trials", "faults injected", "corrupt entries seen", "hangs", "data lost", "time"],
            [[x["kind"], x["trials"], x["faults"], x["corrupt"], x["hangs"], x["lost"], f"{x['seconds']:.0f} s"]
             for x in fl]))
    for name, title in (("cuda", "CUDA"), ("audit", "Audit")):
        doc = load(name)
        if doc:
            parts.append(f"## {title}\n\n```json\n{json.dumps(doc, indent=1)}\n```\n")
    out = RESULTS / "report.md"
    out.write_text("\n".join(parts))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
