"""Real source trees: abicache's build engine side by side with
torch.utils.cpp_extension.load (ninja, the same MAX_JOBS) and with ccache
(Debian's package, under the same ninja), in one run on one machine.

    python bench/build.py            # everything (about 5 minutes on 2 cores)
    python bench/build.py --no-torch-pybind   # skip the torch/extension.h builds (the slowest part)

Targets (issue: real source trees): cold build of 8 sources <= 1.0x ninja's
wall time; one source edited <= 1.2x (one unit + link); one header edited
rebuilds only its includers; fresh-process hit with 200 recorded headers
< 3 ms after import; repeated in-process hit with them < 150 us; a torch
pybind extension, cold, with the shared PCH present < 8 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import base_env, run_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
UNITS = 8
HEADERS = 200
JOBS = str(os.cpu_count() or 2)
COLD_ROUNDS = 8  # the machine's own drift between runs is about 1%: enough rounds to see through it

# Each unit instantiates some templates: about a second of compiler work.
UNIT = """#include "umbrella.h"
#include "common.h"
#include <map>
#include <regex>
#include <string>
#include <vector>
extern "C" long f{i}(long x) {{
  std::map<std::string, std::vector<long>> m;
  std::regex re("[a-z]+{i}");
  m["k"].push_back(x + COMMON + UMBRELLA + EXTRA);
  return std::regex_match("abc{i}", re) ? m["k"][0] : -1;
}}
"""


def make_project(root: Path) -> list[Path]:
    """8 units; all include umbrella.h (200 headers) and common.h; 3 include extra.h."""
    (root / "include" / "many").mkdir(parents=True)
    for h in range(HEADERS - 3):
        (root / "include" / "many" / f"h{h:03}.h").write_text(f"#pragma once\ninline int h{h}() {{ return {h}; }}\n")
    includes = "".join(f'#include "many/h{h:03}.h"\n' for h in range(HEADERS - 3))
    (root / "include" / "umbrella.h").write_text(f"#pragma once\n{includes}#define UMBRELLA 0\n")
    (root / "include" / "common.h").write_text("#pragma once\n#define COMMON 0\n")
    (root / "include" / "extra.h").write_text("#pragma once\n#define EXTRA 1\n")
    paths = []
    for i in range(UNITS):
        path = root / "src" / f"u{i}.cpp"
        path.parent.mkdir(exist_ok=True)
        extra = '#include "extra.h"\n' if i < 3 else "#define EXTRA 0\n"
        path.write_text(extra + UNIT.format(i=i))
        paths.append(path)
    return paths


# ---- the three tools, each in a fresh interpreter -----------------------------------------------

# Both tools' scripts end alike: the loaded library answers, then `repeat` in-process hits.
_REPEAT = """
import ctypes
value = ctypes.CDLL(str(path)).f0(1)
n = int(sys.argv[3])
rep = 0.0
if n:
    t = time.perf_counter()
    for _ in range(n):
        {call}
    rep = (time.perf_counter() - t) / n
"""

ABICACHE = """
import json, os, sys, time
from pathlib import Path
import torch  # the extension links libtorch; torch's own column imports it first too
t0 = time.perf_counter()
import abicache.torch as at
t1 = time.perf_counter()
paths = [Path(p) for p in json.loads(sys.argv[1])]
# what a process does first: the load (served by its hit record where one stands, since 271d5f5)
path = at.load("bench_ext", paths, extra_include_paths=[sys.argv[2]], is_python_module=False)
t2 = time.perf_counter()
# the full lookup (key, lookup, header check) in a Cache not used yet, its modules imported by a first one
art = at.plan("bench_ext", paths, extra_include_paths=[sys.argv[2]], python_module=False).run()
from abicache import Cache
t3 = time.perf_counter()
art = at.plan("bench_ext", paths, extra_include_paths=[sys.argv[2]], python_module=False).run(
    Cache(os.environ["ABICACHE_DIR"]))
t_lookup = time.perf_counter() - t3
""" + _REPEAT.format(call='at.load("bench_ext", paths, extra_include_paths=[sys.argv[2]], is_python_module=False)') + """
print(json.dumps({"import": t1 - t0, "call": t2 - t1, "lookup": t_lookup, "repeat": rep, "value": value}))
"""

# The same tree as a plain C++ library: a fresh process with only abicache imported.
CC = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
import abicache.cc as cc
t1 = time.perf_counter()
paths = [Path(p) for p in json.loads(sys.argv[1])]
lib = cc.load_library("bench_cc", paths, cflags=["-I" + sys.argv[2]])
t2 = time.perf_counter()
assert lib.f0(1) > 0
print(json.dumps({"import": t1 - t0, "call": t2 - t1, "path": lib._name}))
"""

# The floor any loader pays: ctypes loading that library (and libstdc++) in a fresh process.
BARE = """
import ctypes, json, sys, time
t = time.perf_counter()
ctypes.CDLL(sys.argv[1])
print(json.dumps(time.perf_counter() - t))
"""

TORCH = """
import json, os, sys, time
import torch
from torch.utils.cpp_extension import load
paths = json.loads(sys.argv[1])
t1 = time.perf_counter()
path = load("bench_ext", paths, extra_include_paths=[sys.argv[2]], is_python_module=False, verbose=False)
t2 = time.perf_counter()
""" + _REPEAT.format(call='load("bench_ext", paths, extra_include_paths=[sys.argv[2]], is_python_module=False, '
                          'verbose=False)') + """
print(json.dumps({"call": t2 - t1, "repeat": rep, "value": value}))
"""


def run(code: str, paths: list[Path], include: Path, env: dict[str, str], repeat: int = 0) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, json.dumps([str(p) for p in paths]), str(include),
                          str(repeat)], capture_output=True, text=True, env={**base_env(), **env}, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_json_argv(code: str, *argv: str) -> object:
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=base_env(),
                         timeout=120)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def ninja_ccache(work: Path, paths: list[Path], include: Path) -> dict[str, float] | None:
    """ninja with ccache as the compiler launcher: a clean rebuild with a warm ccache."""
    if not shutil.which("ccache") or not shutil.which("ninja"):
        return None
    build = work / "ninja"
    build.mkdir()
    rules = [f"rule cxx\n  command = ccache c++ -fPIC -O2 -I{include} -MD -MF $out.d -c $in -o $out\n"
             f"  depfile = $out.d\n  deps = gcc\n",
             "rule link\n  command = c++ -shared $in -o $out\n"]
    objs = []
    for p in paths:
        rules.append(f"build {p.stem}.o: cxx {p}\n")
        objs.append(f"{p.stem}.o")
    rules.append(f"build libx.so: link {' '.join(objs)}\n")
    (build / "build.ninja").write_text("".join(rules))
    env = {**base_env(), "CCACHE_DIR": str(work / "ccache")}
    res = {}
    for label in ("cold", "warm_ccache_clean_build"):
        for o in build.glob("*.o"):
            o.unlink()
        t = time.perf_counter()
        subprocess.run(["ninja", "-j", JOBS], cwd=build, env=env, check=True, capture_output=True)
        res[label] = time.perf_counter() - t
    return res


def bench_tree(work: Path) -> dict[str, dict[str, float]]:
    paths = make_project(work / "proj")
    include = work / "proj" / "include"
    envs = {"abicache": {"ABICACHE_DIR": str(work / "ac"), "MAX_JOBS": JOBS, "ABICACHE_PROGRESS": "0"},
            # torch prepends ccache to its compiler when ccache is installed: plain ninja here (the
            # ccache row below is its own comparison), or a second cold build would be ccache's hit
            "torch": {"TORCH_EXTENSIONS_DIR": str(work / "te"), "MAX_JOBS": JOBS, "TORCH_NO_COMPILER_WRAPPER": "1"}}
    codes = {"abicache": ABICACHE, "torch": TORCH}
    res: dict[str, dict[str, float]] = {k: {} for k in codes}
    # Cold builds in COLD_ROUNDS rounds that alternate the order (abicache first, then torch first),
    # both stores wiped between rounds: the machine's drift and the page cache favour neither tool.
    colds: dict[str, list[float]] = {tool: [] for tool in codes}
    for round_ in range(COLD_ROUNDS):
        if round_:
            for folder in ("ac", "te"):
                shutil.rmtree(work / folder, ignore_errors=True)
        for tool in (list(codes) if round_ % 2 == 0 else list(reversed(codes))):
            colds[tool].append(run(codes[tool], paths, include, envs[tool])["call"])
    for tool in codes:  # then hits: a warm-up, 5 fresh processes (median), 200 in-process
        res[tool]["cold"] = statistics.mean(colds[tool])
        res[tool]["cold_runs"] = colds[tool]
    for tool in codes:
        run(codes[tool], paths, include, envs[tool])
        fresh = [run(codes[tool], paths, include, envs[tool]) for _ in range(5)]
        res[tool]["fresh_hit"] = statistics.median(r["call"] for r in fresh)
        if tool == "abicache":
            res[tool]["fresh_lookup"] = statistics.median(r["lookup"] for r in fresh)
        res[tool]["repeat_hit"] = run(codes[tool], paths, include, envs[tool], repeat=200)["repeat"]
    time.sleep(1.1)  # a new mtime for ninja
    paths[5].write_text(paths[5].read_text().replace("x + COMMON", "x + 1 + COMMON"))
    for tool in codes:
        res[tool]["one_source"] = run(codes[tool], paths, include, envs[tool])["call"]
    time.sleep(1.1)
    (include / "extra.h").write_text("#pragma once\n#define EXTRA 2\n")
    for tool in codes:
        got = run(codes[tool], paths, include, envs[tool])
        res[tool]["one_header"] = got["call"]
        res[tool]["stale_after_header_edit"] = float(got["value"] != 3)  # f0(1) = 1 + EXTRA
    res["ccache"] = ninja_ccache(work, paths, include) or {}
    run(CC, paths, include, envs["abicache"])  # cold
    run(CC, paths, include, envs["abicache"])  # first hit stamps the header witnesses
    hits = [run(CC, paths, include, envs["abicache"]) for _ in range(7)]
    res["abicache"]["cc_fresh_hit"] = statistics.median(h["call"] for h in hits)
    res["abicache"]["cc_bare_load"] = statistics.median(float(run_json_argv(BARE, hits[0]["path"]))
                                                        for _ in range(7))
    res["abicache"]["recorded_deps"] = float(_recorded(work / "ac"))
    return res


def _recorded(store: Path) -> int:
    from abicache import Cache

    best = 0
    for vdir in Cache(store).store.iter_variant_dirs():
        try:
            m = Cache(store).store.read_manifest(vdir)  # files read one by one, and in system groups
            best = max(best, len(m.deps) + sum(len(g.paths()) for g in getattr(m, "system", ())))
        except Exception:  # noqa: BLE001
            continue
    return best


PYBIND = '#include <torch/extension.h>\nint64_t add(int64_t a, int64_t b) { return a + b; }\n'


def bench_pybind(work: Path) -> dict[str, float]:
    """A torch pybind extension, cold: torch's load_inline, abicache without and with the shared PCH."""
    env_t = {"TORCH_EXTENSIONS_DIR": str(work / "te2"), "TORCH_NO_COMPILER_WRAPPER": "1"}
    env_a = {"ABICACHE_DIR": str(work / "ac2"), "ABICACHE_PROGRESS": "0"}
    code = """
import json, time, sys
import {mod} as m
t = time.perf_counter()
ext = m.load_inline(sys.argv[1], [{src!r}], functions=["add"]{extra})
assert ext.add(2, 3) == 5
print(json.dumps(time.perf_counter() - t))
"""
    torch_load = code.format(mod="torch.utils.cpp_extension", src=PYBIND, extra="")
    ours = code.format(mod="abicache.torch", src=PYBIND, extra="")
    ours_pch = code.format(mod="abicache.torch", src=PYBIND, extra=", use_pch=True")
    res = {"torch_cold": float(run_json(torch_load.replace("sys.argv[1]", "'tp1'"), env_t))}
    res["abicache_cold"] = float(run_json(ours.replace("sys.argv[1]", "'ap1'"), env_a))
    res["abicache_pch_first"] = float(run_json(ours_pch.replace("sys.argv[1]", "'ap2'"), env_a))  # makes the PCH
    res["abicache_pch_present"] = float(run_json(ours_pch.replace("sys.argv[1]", "'ap3'"), env_a))
    return res


def report(tree: dict[str, dict[str, float]], pybind: dict[str, float] | None) -> None:
    from rich.console import Console
    from rich.table import Table

    a, t, c = tree["abicache"], tree["torch"], tree.get("ccache", {})

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} s"

    table = Table(title=f"Source trees: {UNITS} units, {HEADERS} headers, MAX_JOBS={JOBS} (one run)",
                  title_justify="left")
    for col in ("measure", "abicache", "torch load (ninja)", "abicache / torch", "target"):
        table.add_column(col)
    rows = [(f"cold build (mean of {COLD_ROUNDS}, alternating order)", "cold", "<= 1.0x"),
            ("one source edited", "one_source", "<= 1.2x"),
            ("one header edited (3 includers)", "one_header", "")]
    for label, key, target in rows:
        table.add_row(label, s(a[key]), s(t[key]), f"{a[key] / t[key]:.3f}x", target)
        if key == "cold":
            ratios = [x / y for x, y in zip(a["cold_runs"], t["cold_runs"])]
            table.add_row("  each round", " ".join(f"{x:.2f}" for x in a["cold_runs"]),
                          " ".join(f"{y:.2f}" for y in t["cold_runs"]), f"{min(ratios):.3f}-{max(ratios):.3f}x", "")
            spread = 1.96 * statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else 0.0
            table.add_row("  the rounds' ratios: mean, 95% interval", "", "",
                          f"{statistics.mean(ratios):.3f}x +- {spread:.3f}", "")
    table.add_row("fresh-process hit, torch extension: lookup and header check", f"{a['fresh_lookup'] * 1e3:.2f} ms",
                  "", "", "< 3 ms")
    table.add_row("fresh-process hit, the tree as a C++ library (cc.load_library, ctypes)",
                  f"{a['cc_fresh_hit'] * 1e3:.2f} ms", "", "", "< 3 ms")
    table.add_row("  of which any loader pays: ctypes.CDLL of that library, fresh process",
                  f"{a['cc_bare_load'] * 1e3:.2f} ms", "", "", "")
    table.add_row("fresh-process hit: load(), torch.ops.load_library included", f"{a['fresh_hit'] * 1e3:.2f} ms",
                  f"{t['fresh_hit'] * 1e3:.2f} ms", f"{a['fresh_hit'] / t['fresh_hit']:.2f}x", "")
    table.add_row("repeated in-process hit", f"{a['repeat_hit'] * 1e6:.0f} us", f"{t['repeat_hit'] * 1e6:.0f} us",
                  f"{a['repeat_hit'] / t['repeat_hit']:.2f}x", "< 150 us")
    table.add_row("headers recorded per hit", f"{a['recorded_deps']:.0f}", "", "", "")
    table.add_row("stale result after the header edit", "yes" if a["stale_after_header_edit"] else "no",
                  "yes" if t["stale_after_header_edit"] else "no", "", "no")
    if c:
        table.add_row("ninja + ccache: cold / clean rebuild, warm ccache", "", f"{s(c['cold'])} / "
                      f"{s(c['warm_ccache_clean_build'])}", "", "")
    if pybind:
        table.add_row("torch pybind extension, cold", s(pybind["abicache_cold"]), s(pybind["torch_cold"]),
                      f"{pybind['abicache_cold'] / pybind['torch_cold']:.2f}x", "")
        table.add_row("  the same, abicache making the shared PCH", s(pybind["abicache_pch_first"]), "", "", "")
        table.add_row("  the same, with the shared PCH present", s(pybind["abicache_pch_present"]), "",
                      f"{pybind['abicache_pch_present'] / pybind['torch_cold']:.2f}x", "< 8 s")
    Console(width=160).print(table)


def bench_hits_against(work: Path, other_src: Path, rounds: int = 7) -> dict[str, dict[str, float]]:
    """The hit path only, this checkout against another's (its src/ folder) side by
    side: each builds the tree into its own store, then fresh-process hits (the
    torch extension's load after import torch, then its full lookup again; the tree as a
    C++ library) and
    200 in-process hits alternate between the two, `rounds` times."""
    paths = make_project(work / "proj")
    include = work / "proj" / "include"
    sides = {"this": Path(__file__).resolve().parents[1] / "src", "other": other_src.resolve()}
    envs = {side: {"ABICACHE_DIR": str(work / f"ac-{side}"), "MAX_JOBS": JOBS, "ABICACHE_PROGRESS": "0",
                   "PYTHONPATH": str(src)} for side, src in sides.items()}
    got: dict[str, dict[str, list[float]]] = {side: {"load": [], "load_whole": [], "lookup": [], "cc": [],
                                                     "cc_whole": [], "repeat": []} for side in sides}
    for side in sides:
        run(ABICACHE, paths, include, envs[side])  # cold
        run(CC, paths, include, envs[side])
        run(ABICACHE, paths, include, envs[side])  # the first hit stamps the witnesses
        run(CC, paths, include, envs[side])
    for round_ in range(rounds):
        for side in (list(sides) if round_ % 2 == 0 else list(reversed(sides))):
            torch_hit = run(ABICACHE, paths, include, envs[side])
            got[side]["load"].append(torch_hit["call"])
            got[side]["load_whole"].append(torch_hit["import"] + torch_hit["call"])
            got[side]["lookup"].append(torch_hit["lookup"])
            cc_hit = run(CC, paths, include, envs[side])
            got[side]["cc"].append(cc_hit["call"])
            got[side]["cc_whole"].append(cc_hit["import"] + cc_hit["call"])
            got[side]["repeat"].append(run(ABICACHE, paths, include, envs[side], repeat=200)["repeat"])
    res = {side: {k: statistics.median(v) for k, v in got[side].items()} for side in sides}
    # each round's two runs are next to each other: the median of their ratios sees through a
    # machine that drifts between two speeds across rounds better than the ratio of the medians
    res["paired"] = {k: statistics.median(a / b for a, b in zip(got["this"][k], got["other"][k]) if b)
                     for k in got["this"]}
    for side in sides:
        res[side]["recorded_deps"] = float(_recorded(work / f"ac-{side}"))
    return res


def report_hits(res: dict[str, dict[str, float]], other: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Hit path: this checkout against {other} ({JOBS} jobs, medians, alternating rounds)")
    for column in ("measure", "this", "other", "ratio", "paired by round"):
        table.add_column(column)
    rows = [("fresh-process hit, torch extension after import torch: the load", "load", 1e3, "ms"),
            ("  the same with importing abicache.torch (what the process pays)", "load_whole", 1e3, "ms"),
            ("  then the full lookup alone (key, lookup, header check)", "lookup", 1e3, "ms"),
            ("fresh-process hit, the tree as a C++ library (cc.load_library)", "cc", 1e3, "ms"),
            ("  the same with importing abicache.cc", "cc_whole", 1e3, "ms"),
            ("repeated in-process hit (load), 200 headers", "repeat", 1e6, "us")]
    for label, k, scale, unit in rows:
        a, b = res["this"][k], res["other"][k]
        table.add_row(label, f"{a * scale:.2f} {unit}", f"{b * scale:.2f} {unit}", f"{a / b:.2f}x",
                      f"{res['paired'][k]:.2f}x")
    table.add_row("files recorded per entry (most)", f"{res['this']['recorded_deps']:.0f}",
                  f"{res['other']['recorded_deps']:.0f}", "", "")
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-torch-pybind", action="store_true", help="skip the torch/extension.h builds")
    parser.add_argument("--hits-against", type=Path, metavar="SRC",
                        help="only the hit path, side by side with another checkout's src/ (e.g. a git worktree "
                             "of the previous commit)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds of --hits-against (7)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="abicache-bench-build-"))
    if args.hits_against is not None:
        try:
            hits = bench_hits_against(work, args.hits_against, args.rounds)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        report_hits(hits, args.hits_against)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "build_hits.json").write_text(json.dumps({"hits": hits, "other": str(args.hits_against),
                                                             "when": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))
        return
    try:
        tree = bench_tree(work)
        pybind = None if args.no_torch_pybind else bench_pybind(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(tree, pybind)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "build.json").write_text(json.dumps({"tree": tree, "pybind": pybind, "jobs": JOBS,
                                                    "when": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))


if __name__ == "__main__":
    main()
