"""The in-process watch a served hit arms, as root plans it and as a user who may not write the
system's folders plans it (issue 49).

The headers a real unit reads (`g++ -M` of one that includes the whole C++ standard library
and Python.h): store/watch.py's plan of them as this process makes it, and as a user who may
not write the system's folders makes it (as root: a forked child that drops to nobody, since
root may write anywhere; otherwise this user's plan is that one already). Each plan is armed on
a fresh inotify instance by witness.c's one call (hits/native.py, the library built in a scratch
folder, as a hit arms a record's plan), the two alternating; watches and medians.

    python3 bench/watch_plan.py [--rounds 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from abicache.hits import native  # noqa: E402
from abicache.store import inotify, watch  # noqa: E402

UNIT = "#include <bits/stdc++.h>\n#include <Python.h>\nint main() { return 0; }\n"


def headers(compiler: str) -> list[str]:
    """The files a compile of UNIT reads, as the compiler lists them."""
    out = subprocess.run([compiler, "-M", "-x", "c++", f"-I{sysconfig.get_paths()['include']}", "-"], input=UNIT,
                         capture_output=True, text=True, check=True).stdout
    words = out.replace("\\\n", " ").split()
    return sorted({os.path.realpath(w) if not os.path.isabs(w) else w for w in words[1:] if w != "-"})


def as_nobody(files: list[str]) -> dict[str, int]:
    """store/watch.py's plan of files made by a process of nobody (root: after dropping to it)."""
    watch.masks()  # inotify and what the plan needs are imported before the drop
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, json.dumps(watch.plan(files)).encode())
        except OSError as e:
            os.write(write, json.dumps(f"could not plan as nobody: {e}").encode())
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 20):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    said = json.loads(b"".join(chunks))
    if isinstance(said, str):
        sys.exit(f"watch_plan: {said}")
    return dict(said)


def arm_ms(found: native.Native, plan: dict[str, int]) -> float:
    events = inotify.Inotify()
    try:
        paths = sorted(plan)
        start = time.perf_counter()
        assert found.arm(events.fd, paths, [plan[p] for p in paths]) is not None
        return (time.perf_counter() - start) * 1e3
    finally:
        events.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        sys.exit("watch_plan: no C++ compiler (g++ or c++) on PATH")
    files = headers(compiler)
    plans = {"this process": dict(watch.plan(files))}
    if os.geteuid() == 0:
        plans["a user who may not write the system's folders (nobody)"] = as_nobody(files)
    with tempfile.TemporaryDirectory() as tools:
        library = native.build(tools, "cc")
        found = native.holder(library) if library else None
        if found is None:
            sys.exit("watch_plan: witness.c could not be built with cc")
        times: dict[str, list[float]] = {name: [] for name in plans}
        for _ in range(args.rounds):
            for name, plan in plans.items():
                times[name].append(arm_ms(found, plan))
    rows = {name: {"watches": len(plan), "arm_ms": statistics.median(times[name])} for name, plan in plans.items()}
    if args.json:
        print(json.dumps({"files": len(files), "rounds": args.rounds, "plans": rows}))
        return
    print(f"{len(files)} files read by one unit; each plan armed {args.rounds} times (witness.c), medians")
    for name, row in rows.items():
        print(f"  {name:55s} {row['watches']:4d} watches  {row['arm_ms']:.3f} ms")


if __name__ == "__main__":
    main()
