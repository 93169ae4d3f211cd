"""A fresh process's hit against its floor (issue 49): the whole process, cpu time.

A C library already in the store, loaded by a script that imports `abicache.cc` and calls
`cc.load_library`, against the same file loaded by `ctypes.CDLL` by path and against
`python -c pass`: each a fresh interpreter of a clean venv (`--without-pip`: no `.pth` of
this machine imports pathlib, re or typing first), run in alternating order, the medians of
user + system time of each child (`resource.getrusage`). With `--against OTHER/src`, the same
hit by another checkout's abicache in the same rounds (`git worktree add /tmp/prev <commit>`).
Target: hit / `ctypes.CDLL` <= 1.5x. Also prints what the hit imports (modules abicache adds).

    python3 bench/hit_floor.py [--runs 25] [--against /tmp/prev/src]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import base_env

ROOT = Path(__file__).resolve().parents[1]
SOURCE = 'extern "C" int answer() { return 7; }'

HIT = """
import sys
sys.path.insert(0, sys.argv[1])
from abicache import Cache, cc
assert cc.load_library("floorlib", [{source!r}], cache=Cache({store!r})).answer() == 7
"""
MODULES = """
import json, sys
before = set(sys.modules)
sys.path.insert(0, sys.argv[1])
from abicache import Cache, cc
cc.load_library("floorlib", [{source!r}], cache=Cache({store!r}))
added = sorted(m for m in sys.modules if m not in before)
print(json.dumps([len([m for m in added if m.startswith("abicache")]), [m for m in added if not m.startswith("abicache")]]))
"""


def cpu_ms(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=base_env())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--against", help="another checkout's src/ folder, measured in the same rounds")
    args = parser.parse_args()
    trees = {"abicache": str(ROOT / "src")}
    if args.against:
        trees["against"] = str(Path(args.against).resolve())
    work = Path(tempfile.mkdtemp(prefix="abicache-bench-floor-"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], check=True)
        python = str(work / "venv" / "bin" / "python")
        store = str(work / "store")
        for tree in trees.values():
            subprocess.run([sys.executable, "-m", "compileall", "-q", tree], check=True, env=base_env())
            subprocess.run([python, "-c", HIT.format(source=SOURCE, store=store), tree], check=True,
                           env=base_env())  # builds it (the first tree), or finds it
        lib = next((work / "store").rglob("*.so"))
        argvs = {"python -c pass": [python, "-c", "pass"],
                 "ctypes.CDLL by path": [python, "-c", f"import ctypes; ctypes.CDLL({str(lib)!r}).answer()"]}
        for name, tree in trees.items():
            argvs[f"hit: {name}"] = [python, "-c", HIT.format(source=SOURCE, store=store), tree]
        for argv in argvs.values():  # warm the page cache and the .pyc
            cpu_ms(argv)
        times: dict[str, list[float]] = {name: [] for name in argvs}
        for _ in range(args.runs):
            for name, argv in argvs.items():
                times[name].append(cpu_ms(argv))
        medians = {name: statistics.median(v) for name, v in times.items()}
        floor = medians["ctypes.CDLL by path"]
        print(f"fresh process, cpu time (user + system), medians of {args.runs} alternating runs, clean venv "
              f"({sys.version.split()[0]})")
        for name, ms in medians.items():
            print(f"  {name:24s} {ms:7.1f} ms   {ms / floor:5.2f}x ctypes.CDLL" +
                  ("   (target <= 1.5x)" if name == "hit: abicache" else ""))
        for name, tree in trees.items():
            out = subprocess.run([python, "-c", MODULES.format(source=SOURCE, store=store), tree], check=True,
                                 capture_output=True, text=True, env=base_env()).stdout
            ours, stdlib = json.loads(out)
            print(f"  {name}: the hit imports {ours} abicache modules and {len(stdlib)} others: {' '.join(stdlib)}")
        out_dir = ROOT / "bench" / "results"
        out_dir.mkdir(exist_ok=True)
        (out_dir / "hit_floor.json").write_text(json.dumps({"runs": args.runs, "medians_ms": medians}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
