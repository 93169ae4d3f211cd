"""What the build observer costs a compile: one `<regex>` unit compiled by g++, unobserved and
observed (engine/observe.c preloaded, its trace parsed), best of N alternating rounds; with
--against SRC, also observed by another checkout's observer (its src/, e.g. a git worktree
of the previous commit), in the same rounds.

    python3 bench/observer.py [--rounds 8] [--against /tmp/prev/src]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
UNIT = '#include <regex>\n#include <string>\nbool f(const std::string& s) { return std::regex_match(s, std::regex("[a-z]+")); }\n'


#: one compile in a process of the checkout's own (PYTHONPATH), timed there: argv[1] the work folder,
#: argv[2] "observed" or "unobserved"
CHILD = """
import inspect, os, subprocess, sys, time
from pathlib import Path
from abicache.engine import observe
work = Path(sys.argv[1])
argv = ["g++", "-O2", "-c", str(work / "unit.cpp"), "-o", str(work / "unit.o")]
library = observe.library(work / ("tools-" + os.environ["SIDE"])) if sys.argv[2] == "observed" else None
started = time.perf_counter()
if library is None:
    subprocess.run(argv, check=True)
else:
    with observe.watching(library, str(work)) as session:
        subprocess.run(argv, check=True, env={**os.environ, **session.env}, pass_fds=session.fds)
        takes = inspect.signature(session.result).parameters
        seen = session.result(argv, str(work)) if "command" in takes else session.result()
    assert seen.programs, "the observer did not report"
print(time.perf_counter() - started)
"""


def _compile(work: Path, src: Path, side: str, mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, str(work), mode], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(src), "SIDE": side}, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--against", type=Path, metavar="SRC", help="another checkout's src/ to compare with")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="abicache-bench-observer-"))
    (work / "unit.cpp").write_text(UNIT)
    sides = {"this": ROOT / "src", **({"other": args.against.resolve()} if args.against else {})}
    for side, src in sides.items():
        _compile(work, src, side, "observed")  # the observer compiled once per side, before timing
    times: dict[str, list[float]] = {"unobserved": [], **{f"observed ({side})": [] for side in sides}}
    for _ in range(args.rounds):
        times["unobserved"].append(_compile(work, ROOT / "src", "this", "unobserved"))
        for side, src in sides.items():
            times[f"observed ({side})"].append(_compile(work, src, side, "observed"))
    best = {k: min(v) for k, v in times.items()}
    for label, value in best.items():
        print(f"{label:20s} {value:.3f} s  {value / best['unobserved']:.3f}x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "observer.json").write_text(json.dumps({"best_seconds": best, "rounds": args.rounds,
                                                       "when": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))


if __name__ == "__main__":
    main()
