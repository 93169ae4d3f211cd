"""Big stores and many kernels (issue 31, the half that needs no GPU).

1. Stores of 10^2 .. 10^5 small entries (every tenth key with three variants, one per GPU arch):
   a fresh-process hit (timed inside the process, import excluded), a repeated in-process hit,
   `ls` (beside its floor: a bare walk of the entry folders, a stat each), `gc` with nothing to
   do and evicting 10%, `verify`, `verify --full`, and the bytes on disk per entry beyond the
   artifacts' own. A hit must not grow with the store (10^5 <= 1.2x
   of 10^2); `ls` and `gc` linear at worst.
2. Many kernels: a fresh process loads 1, 10, 100 and 1,000 distinct C libraries from the store
   (`cc.load_library`, found and dlopen'ed), against the floor: `ctypes.CDLL` of the same files
   by path. The cost per library must stay flat (<= 1.2x from 10 to 1,000).

Every figure is the median of --runs fresh processes where it is a per-process figure; the
timed processes are a clean venv's interpreter (bench/common.clean_python).
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

from common import base_env, clean_python, run_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SRC = str(ROOT / "src")
ARCHS = ("sm_80", "sm_90", "sm_100")

FILL = """
import sys
sys.path.insert(0, {src!r})
from abicache import Cache
from abicache.env import Facts
root, count = {root!r}, {count}
plain = Cache(root, remote=False)
for n in range(count):
    write = lambda out, n=n: (out / "lib.so").write_bytes(n.to_bytes(8, "little") * 64)
    if n % 10:
        plain.get_or_build("bench", f"e{{n}}", {{"extra": {{"n": n}}}}, write)
        continue
    for arch in {archs!r}:
        gpu = Cache(root, remote=False, facts=Facts().with_overrides({{"gpu.arch": arch}}))
        gpu.get_or_build("bench", f"e{{n}}", {{"extra": {{"n": n}}}}, write, [f"gpu.arch ~= {{arch}}"])
print(0)
"""
HIT = """
import json, sys, time
sys.path.insert(0, {src!r})
from abicache import Cache
from abicache.env import Facts
cache = Cache({root!r}, remote=False, facts=Facts().with_overrides({{"gpu.arch": "sm_90"}}))
def never(out):
    raise AssertionError("built: a miss")
start = time.perf_counter()
for n in {keys!r}:
    cache.get_or_build("bench", f"e{{n}}", {{"extra": {{"n": n}}}}, never)
first = (time.perf_counter() - start) / {nkeys}
start = time.perf_counter()
for _ in range(2000):
    cache.get_or_build("bench", "e0", {{"extra": {{"n": 0}}}}, never)
print(json.dumps({{"fresh_ms": first * 1e3, "repeat_us": (time.perf_counter() - start) / 2000 * 1e6}}))
"""
KERNELS_FILL = """
import sys
sys.path.insert(0, {src!r})
from abicache import Cache, cc
cache = Cache({root!r}, remote=False)
for n in range({count}):
    cc.build_library(f"k{{n}}", [f'extern "C" int k{{n}}(int a) {{{{ return a + {{n}}; }}}}'], cache=cache)
print(0)
"""
KERNELS_LOAD = """
import json, sys, time
sys.path.insert(0, {src!r})
start = time.perf_counter()
from abicache import Cache, cc
cache = Cache({root!r}, remote=False)
for n in range({count}):
    lib = cc.load_library(f"k{{n}}", [f'extern "C" int k{{n}}(int a) {{{{ return a + {{n}}; }}}}'], cache=cache)
    assert getattr(lib, f"k{{n}}")(1) == 1 + n
print(json.dumps({{"ms": (time.perf_counter() - start) * 1e3}}))
"""
KERNELS_FLOOR = """
import ctypes, json, time
paths = json.load(open({paths!r}))[:{count}]
start = time.perf_counter()
for n, path in enumerate(paths):
    assert getattr(ctypes.CDLL(path), f"k{{n}}")(1) == 1 + n
print(json.dumps({{"ms": (time.perf_counter() - start) * 1e3}}))
"""

# The floor of `ls --json`: a fresh interpreter that lists every entry folder and stats each one
# (its last use), printing a line a folder; no manifest read, nothing checked.
LS_FLOOR = """
import json, os, sys
entries = os.path.join({root!r}, "v3", "entries")
out = []
for kind in sorted(os.listdir(entries)):
    for prefix in os.scandir(os.path.join(entries, kind)):
        for entry in os.scandir(prefix.path):
            if entry.is_dir(follow_symlinks=False):
                out.append(json.dumps({{"kind": kind, "entry": entry.name, "used": entry.stat().st_mtime}}))
sys.stdout.write("\\n".join(out))
"""


PYTHON = sys.executable  # main() puts a clean venv's here


def cli(root: Path, *argv: str) -> float:
    start = time.perf_counter()
    # this tree's abicache, installed or not; a command that fails is no measure (it once timed
    # "No module named abicache" at 0.04 s)
    done = subprocess.run([PYTHON, "-m", "abicache", *argv, "--root", str(root), "--json"],
                          env={**base_env(), "PYTHONPATH": SRC}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        raise RuntimeError(f"abicache {' '.join(argv)} failed: {done.stderr.decode()[-2000:]}")
    return time.perf_counter() - start


def first_ls(root: Path, work: Path, runs: int) -> float:
    """The first `ls` of a store just filled (it takes the publishers' logs into its memo), each
    run from the listing folder as the fill left it."""
    listing, kept = root / "v3" / "listing", work / "listing-as-filled"
    shutil.copytree(listing, kept)
    times = []
    for _ in range(runs):
        shutil.rmtree(listing)
        shutil.copytree(kept, listing)
        times.append(cli(root, "ls"))
    shutil.rmtree(kept)
    return statistics.median(times)


def floor(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([PYTHON, "-c", code], env=base_env(), stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def disk(root: Path) -> int:
    seen: dict[tuple[int, int], int] = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())


def bench_store(work: Path, count: int, runs: int) -> dict[str, float]:
    root = work / f"store-{count}"
    env = {"ABICACHE_PROGRESS": "0"}
    run_json(FILL.format(src=SRC, root=str(root), count=count, archs=ARCHS), env, timeout=7200)
    # 20 keys across the store, half with three variants (every tenth key) and half with one at
    # every size: a hit of a key with three variants reads three manifests
    step = max(1, count // 20)
    keys = [i * step + (5 if i % 2 and (i * step) % 10 == 0 else 0) for i in range(20)]
    keys = [n for n in keys if n < count]
    hits = [run_json(HIT.format(src=SRC, root=str(root), keys=keys, nkeys=len(keys)), env, python=PYTHON)
            for _ in range(runs)]
    variants = count + 2 * len(range(0, count, 10))
    res = {"entries": count, "variants": variants,
           "fresh_hit_ms": statistics.median(h["fresh_ms"] for h in hits),
           "repeat_hit_us": statistics.median(h["repeat_us"] for h in hits),
           "ls_first_s": first_ls(root, work, runs)}
    res["ls_s"] = statistics.median(cli(root, "ls") for _ in range(3))  # reads the memo
    res["ls_floor_s"] = statistics.median(floor(LS_FLOOR.format(root=str(root))) for _ in range(3))
    res["gc_s"] = cli(root, "gc", "--max-size", "1T")
    res["verify_s"] = cli(root, "verify")
    res["verify_full_s"] = cli(root, "verify", "--full")
    res["bytes_per_entry"] = (disk(root) - variants * 4096) / variants
    size = disk(root)
    res["gc_evict10_s"] = cli(root, "gc", "--max-size", str(int(size * 0.9)))
    shutil.rmtree(root, ignore_errors=True)
    return res


def bench_kernels(work: Path, counts: list[int], runs: int) -> list[dict[str, float]]:
    root = work / "kernels"
    env = {"ABICACHE_PROGRESS": "0"}
    run_json(KERNELS_FILL.format(src=SRC, root=str(root), count=max(counts)), env, timeout=7200)
    sys.path.insert(0, SRC)
    from abicache.store.manifest_names import read_any
    paths = {}
    for vdir in root.glob("v3/entries/cc.library/*/*.*"):
        manifest = json.loads(read_any(str(vdir), 1 << 22))  # a file, or kept in its folder's names
        paths[int(manifest["name"][1:])] = str(vdir / next(iter(manifest["files"])))
    listed = work / "kernel-paths.json"  # a file: a thousand paths are too long for one argument
    listed.write_text(json.dumps([paths[n] for n in range(max(counts))]))
    out = []
    for count in counts:
        ours = statistics.median(run_json(KERNELS_LOAD.format(src=SRC, root=str(root), count=count), env,
                                          python=PYTHON)["ms"] for _ in range(runs))
        floor = statistics.median(run_json(KERNELS_FLOOR.format(paths=str(listed), count=count), env,
                                           python=PYTHON)["ms"] for _ in range(runs))
        out.append({"kernels": count, "abicache_ms": ours, "floor_ms": floor, "per_kernel_ms": ours / count})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,10000,100000", help="store sizes (entries)")
    parser.add_argument("--kernels", default="1,10,100,1000", help="libraries loaded by one process")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", SRC], check=True, stdout=subprocess.DEVNULL,
                   env=base_env())
    work = Path(tempfile.mkdtemp(prefix="abicache-bench-scale-"))
    global PYTHON
    try:
        PYTHON = clean_python(work / "venv")
        stores = []
        for n in (int(n) for n in args.sizes.split(",") if n):
            stores.append(bench_store(work, n, args.runs))
            print(json.dumps(stores[-1]), flush=True)  # a long run says what it has so far
        counts = [int(n) for n in args.kernels.split(",") if n]
        kernels = bench_kernels(work, counts, args.runs) if counts else []  # --kernels "": the stores only
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(stores, kernels)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps({"stores": stores, "kernels": kernels,
                                                   "when": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))


def report(stores: list[dict[str, float]], kernels: list[dict[str, float]]) -> None:
    print("stores (entries; every tenth key has three variants)")
    print(f"{'entries':>8} {'fresh hit':>10} {'repeat hit':>11} {'ls first':>8} {'ls':>7} {'ls floor':>8} {'gc':>7} {'gc -10%':>8} "
          f"{'verify':>7} {'--full':>7} {'KiB/entry':>9}")
    for s in stores:
        print(f"{s['entries']:>8} {s['fresh_hit_ms']:>8.3f}ms {s['repeat_hit_us']:>9.2f}us "
              f"{s.get('ls_first_s', s['ls_s']):>7.2f}s {s['ls_s']:>6.2f}s {s.get('ls_floor_s', float('nan')):>7.2f}s "
              f"{s['gc_s']:>6.2f}s {s['gc_evict10_s']:>7.2f}s {s['verify_s']:>6.2f}s {s['verify_full_s']:>6.2f}s "
              f"{s['bytes_per_entry'] / 1024:>9.1f}")
    for s in stores:
        if "ls_floor_s" in s:
            print(f"{s['entries']:>8} entries: the first ls {s['ls_first_s'] / s['ls_floor_s']:.2f}x its floor, "
                  f"the next {s['ls_s'] / s['ls_floor_s']:.2f}x (target: the first < 0.5 s at 10^4)")
    if len(stores) > 1:
        print(f"fresh hit, largest / smallest store: {stores[-1]['fresh_hit_ms'] / stores[0]['fresh_hit_ms']:.2f}x "
              "(target <= 1.2x)")
    print("\nmany libraries loaded by one fresh process (cc.load_library vs ctypes.CDLL by path)")
    for k in kernels:
        print(f"{k['kernels']:>6} libraries: {k['abicache_ms']:>9.1f} ms ({k['per_kernel_ms']:.3f} ms each), "
              f"floor {k['floor_ms']:>8.1f} ms, {k['abicache_ms'] / k['floor_ms']:.2f}x")
    if len(kernels) > 2:
        print(f"per library, {kernels[-1]['kernels']} / {kernels[1]['kernels']}: "
              f"{kernels[-1]['per_kernel_ms'] / kernels[1]['per_kernel_ms']:.2f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
