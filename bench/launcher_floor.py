"""What a compiler launcher's hit may cost (issue 50, item 5: "measure, then choose").

One C++ unit (`<map>`, `<string>`, `<vector>`, `-O2 -c`, with `-MD`), each command run in
a fresh process, alternating, wall time, medians:

- `g++` alone: the compile a miss pays;
- `ccache g++`, a direct-mode hit (its own fresh CCACHE_DIR, primed once);
- the Python floors of a launcher written in Python (a clean venv's interpreter):
  `python -S -c pass`, `python -c pass`, and importing the launcher's command-line reader
  (`abicache.launcher.command`);
- the floor of a native front (a C program this script compiles, a stand-in for the
  launcher's hit, not the launcher): read a record naming the unit's witnesses (every
  header its depfile lists, the source and the compiler), stat each, copy the object to
  the output and write the depfile, as a hit must.

Target (issue 50): the launcher's hit <= 1.5x ccache's.

    python3 bench/launcher_floor.py [--runs 21]
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

from common import base_env, clean_python

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "launcher_floor.json"
UNIT = """#include <map>
#include <string>
#include <vector>
int count(const std::vector<std::string> &words) {
    std::map<std::string, int> seen;
    for (const auto &w : words) seen[w]++;
    return (int)seen.size();
}
"""
# The native front's floor: what its hit must do at the least, with no hashing (witnesses
# are compared by stat, as hit records are): read the record, stat every witness, copy the
# object, write the depfile.
FRONT = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
static int copy(const char *from, const char *to) {
    int in = open(from, O_RDONLY | O_CLOEXEC), out;
    char buf[1 << 16];
    ssize_t n;
    if (in < 0) return -1;
    out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) { close(in); return -1; }
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n) { n = -1; break; }
    close(in); close(out);
    return n < 0 ? -1 : 0;
}
int main(int argc, char **argv) {  /* record object depfile-copy output depfile */
    FILE *f = fopen(argv[1], "r");
    char line[4096];
    struct stat st;
    long long ino, size, mtime;
    if (!f) return 2;
    while (fgets(line, sizeof line, f)) {
        char *path = strchr(line, ' ');
        if (!path || sscanf(line, "%lld:%lld:%lld", &ino, &size, &mtime) != 3) return 2;
        path[strcspn(path, "\n")] = 0;
        if (stat(path + 1, &st) || (long long)st.st_ino != ino || (long long)st.st_size != size
            || (long long)st.st_mtim.tv_sec != mtime) return 1;  /* moved: a miss */
    }
    fclose(f);
    return copy(argv[2], argv[4]) || copy(argv[3], argv[5]);
}
"""


def wall_ms(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1e3


def witnesses(depfile: Path, cwd: Path, compiler: str) -> list[str]:
    text = depfile.read_text().replace("\\\n", " ")
    paths = text.split(":", 1)[1].split()
    return [os.path.normpath(os.path.join(cwd, p)) for p in paths] + [compiler]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    gxx, ccache = shutil.which("g++"), shutil.which("ccache")
    if gxx is None:
        sys.exit("bench/launcher_floor: g++ not found")
    work = Path(tempfile.mkdtemp(prefix="abicache-bench-launcher-"))
    try:
        (work / "unit.cpp").write_text(UNIT)
        (work / "front.c").write_text(FRONT)
        subprocess.run(["cc", "-O2", "-o", "front", "front.c"], cwd=work, check=True)
        env = {**base_env(), "CCACHE_DIR": str(work / "ccache"), "CCACHE_NOHASHDIR": "1"}
        compile_words = ["-O2", "-c", "unit.cpp", "-o", "unit.o", "-MD", "-MF", "unit.d"]
        subprocess.run([gxx, *compile_words], cwd=work, check=True)
        real_gxx = os.path.realpath(gxx)
        record = work / "record"
        lines = []
        for path in witnesses(work / "unit.d", work, real_gxx):
            st = os.stat(path)
            lines.append(f"{st.st_ino}:{st.st_size}:{int(st.st_mtime)} {path}\n")
        record.write_text("".join(lines))
        shutil.copy(work / "unit.o", work / "kept.o")
        shutil.copy(work / "unit.d", work / "kept.d")
        python = clean_python(work / "venv")
        argvs = {
            "g++ alone (a miss's compile)": [gxx, *compile_words],
            "python -S -c pass": [python, "-S", "-c", "pass"],
            "python -c pass": [python, "-c", "pass"],
            "python: import abicache.launcher.command": [python, "-c", "import abicache.launcher.command"],
            "native front's floor (stat the witnesses, copy 2 files)":
                [str(work / "front"), str(record), "kept.o", "kept.d", "out.o", "out.d"],
        }
        if ccache:
            subprocess.run([ccache, gxx, *compile_words], cwd=work, env=env, check=True)  # primes it
            argvs["ccache g++, direct-mode hit"] = [ccache, gxx, *compile_words]
        else:
            print("bench/launcher_floor: ccache not found; its row is left out", file=sys.stderr)
        env["PYTHONPATH"] = str(ROOT / "src")
        subprocess.run([python, "-m", "compileall", "-q", str(ROOT / "src" / "abicache")], check=True, env=env)
        for argv in argvs.values():
            wall_ms(argv, work, env)  # warm the page cache
        times: dict[str, list[float]] = {name: [] for name in argvs}
        for _ in range(args.runs):
            for name, argv in argvs.items():
                times[name].append(wall_ms(argv, work, env))
        medians = {name: statistics.median(t) for name, t in times.items()}
        floor = medians.get("ccache g++, direct-mode hit")
        print(f"one C++ unit, wall time, medians of {args.runs} alternating runs ({len(lines)} witnesses)")
        for name, ms in medians.items():
            ratio = f"   {ms / floor:5.2f}x ccache's hit" if floor else ""
            print(f"  {name:58} {ms:8.2f} ms{ratio}")
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps({"runs": args.runs, "witnesses": len(lines), "medians_ms": medians},
                                      indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
