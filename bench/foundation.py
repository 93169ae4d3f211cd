"""Foundation benchmarks: abicache against tvm-ffi and torch.utils.cpp_extension.

Every number comes from this run, on this machine. Targets (from the issue):
import < 20 ms; in-process repeated hit < 20 us; fresh-process first
lookup-and-load (after import) < 2 ms, spawning no process; cold build
overhead < 30 ms beyond the compiler itself.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import base_env, run_last_line as py

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ADD_C = 'extern "C" long add(long a, long b) { return a + b; }'
TVM_SRC = "int64_t add(int64_t a, int64_t b) { return a + b; }"
TORCH_SRC = "#include <torch/extension.h>\nint64_t add(int64_t a, int64_t b) { return a + b; }"






def median_of(n: int, code: str, env: dict[str, str]) -> float:
    return statistics.median(float(py(code, env)) for _ in range(n))


def bench_abicache(work: Path, runs: int) -> dict[str, float]:
    env = {"ABICACHE_DIR": str(work / "abicache"), "ABICACHE_PROGRESS": "0"}
    res: dict[str, float] = {}
    res["import_ms"] = 1e3 * median_of(runs, """
        import time; t = time.perf_counter(); import abicache; print(time.perf_counter() - t)""", env)
    # cold builds: total wall time vs the compiler's own time (recorded per build)
    cold = py(f"""
        import json, time, abicache.cc as cc
        totals, compiles = [], []
        for i in range({runs}):
            t = time.perf_counter()
            art = cc.build_library(f"cold{{i}}", [{ADD_C!r} + f"// {{i}}"])
            totals.append(time.perf_counter() - t)
            compiles.append(art.manifest.build_seconds)
        print(json.dumps([totals, compiles]))""", env)
    totals, compiles = json.loads(cold)
    res["cold_build_ms"] = 1e3 * statistics.median(totals)
    res["cold_overhead_ms"] = 1e3 * statistics.median(t - c for t, c in zip(totals, compiles))
    # The first miss of a process also imports the ELF reader and abi3info.
    res["first_overhead_ms"] = 1e3 * (totals[0] - compiles[0])
    res["bare_compiler_ms"] = 1e3 * _bare_compile(work, runs)
    py(f"import abicache.cc as cc; cc.load_library('warm', [{ADD_C!r}]); print(0)", env)
    res["fresh_hit_ms"] = 1e3 * median_of(runs, f"""
        import abicache, time
        t = time.perf_counter()
        lib = abicache.cc.load_library('warm', [{ADD_C!r}])
        assert lib.add(2, 3) == 5
        print(time.perf_counter() - t)""", env)
    res["import_and_hit_ms"] = 1e3 * median_of(runs, f"""
        import time
        t = time.perf_counter()
        import abicache
        lib = abicache.cc.load_library('warm', [{ADD_C!r}])
        print(time.perf_counter() - t)""", env)
    res["repeat_hit_us"] = 1e6 * float(py(f"""
        import timeit, abicache.cc as cc
        src = [{ADD_C!r}]
        cc.load_library('warm', src)
        n = 20000
        print(min(timeit.repeat(lambda: cc.load_library('warm', src), number=n, repeat=5)) / n)""", env))
    res["repeat_lookup_us"] = 1e6 * float(py(f"""
        import timeit, abicache
        from abicache.cc import library_plan
        plan = library_plan('warm', [{ADD_C!r}])
        n = 2000
        def fresh_lookup():  # no memo: key, manifest read, requirement and file checks
            abicache.Cache().lookup(plan.kind, plan.name, plan.inputs)
        print(min(timeit.repeat(fresh_lookup, number=n, repeat=3)) / n)""", env))
    return res


def _bare_compile(work: Path, runs: int) -> float:
    src = work / "bare.cpp"
    src.write_text(ADD_C)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(["c++", "-shared", "-fPIC", "-O2", str(src), "-o", str(work / "bare.so")], check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_tvm_ffi(work: Path, runs: int) -> dict[str, float]:
    env = {"TVM_FFI_CACHE_DIR": str(work / "tvm-ffi")}
    call = f"tvm_ffi.cpp.load_inline('add_mod', cpp_sources={TVM_SRC!r}, functions=['add'])"
    res = {"cold_build_ms": 1e3 * float(py(f"""
        import time, tvm_ffi.cpp; t = time.perf_counter(); m = {call}
        assert m.add(2, 3) == 5; print(time.perf_counter() - t)""", env))}
    res["import_ms"] = 1e3 * median_of(runs, """
        import time; t = time.perf_counter(); import tvm_ffi.cpp; print(time.perf_counter() - t)""", env)
    res["fresh_hit_ms"] = 1e3 * median_of(runs, f"""
        import time, tvm_ffi, tvm_ffi.cpp; t = time.perf_counter(); m = {call}
        assert m.add(2, 3) == 5; print(time.perf_counter() - t)""", env)
    res["import_and_hit_ms"] = 1e3 * median_of(runs, f"""
        import time
        t = time.perf_counter()
        import abicache
        lib = abicache.cc.load_library('warm', [{ADD_C!r}])
        print(time.perf_counter() - t)""", env)
    res["repeat_hit_us"] = 1e6 * float(py(f"""
        import timeit, tvm_ffi.cpp; {call}; n = 200
        print(min(timeit.repeat(lambda: {call}, number=n, repeat=3)) / n)""", env))
    return res


def bench_torch(work: Path, runs: int) -> dict[str, float]:
    env = {"TORCH_EXTENSIONS_DIR": str(work / "torch_extensions")}
    call = f"load_inline('add_ext', cpp_sources=[{TORCH_SRC!r}], functions=['add'])"
    head = "import time, torch; from torch.utils.cpp_extension import load_inline"
    res = {"cold_build_ms": 1e3 * float(py(f"""
        {head}; t = time.perf_counter(); m = {call}
        assert m.add(2, 3) == 5; print(time.perf_counter() - t)""", env))}
    res["import_ms"] = 1e3 * median_of(max(3, runs // 4), """
        import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)""", env)
    res["fresh_hit_ms"] = 1e3 * median_of(max(3, runs // 4), f"""
        {head}; t = time.perf_counter(); m = {call}
        assert m.add(2, 3) == 5; print(time.perf_counter() - t)""", env)
    res["import_and_hit_ms"] = 1e3 * median_of(runs, f"""
        import time
        t = time.perf_counter()
        import abicache
        lib = abicache.cc.load_library('warm', [{ADD_C!r}])
        print(time.perf_counter() - t)""", env)
    res["repeat_hit_us"] = 1e6 * float(py(f"""
        {head}; import timeit; {call}; n = 50
        print(min(timeit.repeat(lambda: {call}, number=n, repeat=3)) / n)""", env))
    return res


def _ratio(other: float | None, ours: float) -> str:
    if other is None:
        return "-"
    ratio = other / ours
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2f}x"


def bench_import_ratio(runs: int) -> dict[str, float]:
    """`import abicache` against a bare `python -c pass`, paired run by run (target <= 1.5x)."""
    env = base_env()
    pairs = []
    for _ in range(runs):
        times = []
        for code in ("pass", "import abicache", "import abicache; abicache.Cache"):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            times.append(time.perf_counter() - start)
        pairs.append(times)
    bare, plain, cache = (statistics.median(p[i] for p in pairs) for i in range(3))
    return {"python_pass_ms": 1e3 * bare, "import_ratio": plain / bare, "import_cache_ratio": cache / bare}


def bench_store(work: Path, entries: int) -> dict[str, float]:
    """A store of `entries` small entries: `abicache ls`, `gc` (a full pass that evicts
    nothing) and `verify`, each in a fresh process, and the disk it takes beyond the
    artifacts' own bytes (blocks allocated, per entry; target <= 8 KiB)."""
    root = work / "big-store"
    env = {"ABICACHE_PROGRESS": "0"}
    py(f"""
        from abicache import Cache
        cache = Cache({str(root)!r}, remote=False)
        for n in range({entries}):
            cache.get_or_build("bench", f"e{{n}}", {{"extra": {{"n": n}}}},
                               lambda out, n=n: (out / "lib.so").write_bytes(n.to_bytes(8, "little") * 64))
        print(0)""", env)
    res: dict[str, float] = {"entries": entries}

    def cli(*argv: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "abicache", *argv, "--root", str(root)], env=base_env(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - start

    # the first `ls` reads every manifest and writes its memo; the next ones read the memo
    res["ls_first_s"] = cli("ls", "--json")
    res["ls_s"] = statistics.median(cli("ls", "--json") for _ in range(3))
    res["ls_table_s"] = statistics.median(cli("ls") for _ in range(3))
    res["gc_s"] = cli("gc", "--max-size", "1T", "--json")
    res["verify_s"] = cli("verify", "--json")
    seen: dict[tuple[int, int], int] = {}  # an entry's file and its blob are one inode: counted once
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    artifact = 4096  # each artifact's own 512 bytes take one 4 KiB block
    res["bytes_per_entry"] = (sum(seen.values()) - entries * artifact) / entries
    return res


def report(a: dict[str, float], t: dict[str, float] | None, p: dict[str, float] | None) -> None:
    from rich.console import Console
    from rich.table import Table

    def get(d: dict[str, float] | None, k: str) -> float | None:
        return None if d is None else d.get(k)

    def fmt(v: float | None, unit: str) -> str:
        return "-" if v is None else f"{v:,.2f} {unit}" if v < 100 else f"{v:,.0f} {unit}"

    rows = [
        ("import (python -c 'import X')", "import_ms", "ms", "< 20 ms"),
        ("warm hit, fresh process, after import", "fresh_hit_ms", "ms", "< 2 ms"),
        ("import and warm hit, fresh process (what a user waits)", "import_and_hit_ms", "ms", ""),
        ("warm hit, repeated in-process", "repeat_hit_us", "us", "< 20 us"),
        ("cold build (wall)", "cold_build_ms", "ms", ""),
    ]
    table = Table(title="abicache foundation benchmarks (median; same run, same machine)", title_justify="left")
    for col in ("measure", "abicache", "target", "tvm-ffi load_inline", "torch load_inline",
                "tvm-ffi / abicache", "torch / abicache"):
        table.add_column(col, justify="left" if col in ("measure", "target") else "right")
    for label, key, unit, target in rows:
        ours = a[key]
        table.add_row(label, fmt(ours, unit), target, fmt(get(t, key), unit), fmt(get(p, key), unit),
                      _ratio(get(t, key), ours), _ratio(get(p, key), ours))
    table.add_row("uncached lookup in-process (new Cache, no memo)", fmt(a["repeat_lookup_us"], "us"), "", "", "", "", "")
    table.add_row("bare compiler command (c++ -shared -O2)", fmt(a["bare_compiler_ms"], "ms"), "", "", "", "", "")
    table.add_row("cold build overhead beyond the compiler (incl. audit)", fmt(a["cold_overhead_ms"], "ms"), "< 30 ms", "", "", "", "")
    table.add_row("  same, first build of a process (one-time imports)", fmt(a["first_overhead_ms"], "ms"), "", "", "", "", "")
    if "import_ratio" in a:
        table.add_row("import abicache / python -c pass (paired)", f"{a['import_ratio']:.2f}x", "<= 1.5x", "", "", "",
                      "")
        table.add_row("  import abicache; abicache.Cache / python -c pass", f"{a['import_cache_ratio']:.2f}x", "", "",
                      "", "", "")
    if "store" in a:
        st = a["store"]  # type: ignore[index]
        n = int(st["entries"])
        table.add_row(f"abicache ls --json, a store of {n:,} entries", fmt(st["ls_s"] * 1e3, "ms"), "< 500 ms", "", "",
                      "", "")
        if "ls_first_s" in st:
            table.add_row("  the same, first (reads every manifest, writes the memo)", fmt(st["ls_first_s"] * 1e3, "ms"),
                          "", "", "", "", "")
            table.add_row("  abicache ls (the table)", fmt(st["ls_table_s"] * 1e3, "ms"), "< 500 ms", "", "", "", "")
        table.add_row(f"abicache gc (full pass), {n:,} entries", fmt(st["gc_s"] * 1e3, "ms"), "", "", "", "", "")
        table.add_row(f"abicache verify, {n:,} entries", fmt(st["verify_s"] * 1e3, "ms"), "", "", "", "", "")
        table.add_row("disk per entry beyond its own bytes", f"{st['bytes_per_entry'] / 1024:.1f} KiB", "<= 8 KiB",
                      "", "", "", "")
    Console(width=200).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15, help="repetitions per measurement")
    parser.add_argument("--skip-torch", action="store_true", help="skip torch (its cold build takes ~25 s)")
    parser.add_argument("--store-entries", type=int, default=10_000,
                        help="entries of the store `ls`, `gc` and `verify` are timed on (0: skip)")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "src")], check=True,
                   stdout=subprocess.DEVNULL, env=base_env())
    work = Path(tempfile.mkdtemp(prefix="abicache-bench-"))
    try:
        ours = bench_abicache(work, args.runs)
        ours.update(bench_import_ratio(max(args.runs, 30)))
        if args.store_entries:
            ours["store"] = bench_store(work, args.store_entries)  # type: ignore[assignment]
        tvm = _optional("tvm_ffi", lambda: bench_tvm_ffi(work, args.runs))
        torch = None if args.skip_torch else _optional("torch", lambda: bench_torch(work, args.runs))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(ours, tvm, torch)
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"abicache": ours, "tvm_ffi": tvm, "torch": torch, "python": sys.version.split()[0],
           "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    (RESULTS / "foundation.json").write_text(json.dumps(doc, indent=2))


def _optional(module: str, fn):
    import importlib.util

    if importlib.util.find_spec(module) is None:
        print(f"({module} is not installed: its column stays empty; bench/run installs it)", file=sys.stderr)
        return None
    return fn()


if __name__ == "__main__":
    main()
