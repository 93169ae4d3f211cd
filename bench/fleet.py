"""A simulated fleet on one SeaweedFS: N machines (separate processes, separate
local roots) each ask for the same K artifacts (C++ libraries compiled by g++),
each in its own random order, load each one and call it.

Runs, side by side in one go:
- no remote: every machine builds everything (what a fleet without a shared
  cache pays: N x K builds);
- shared remote, leases off (ABICACHE_REMOTE_LEASE=0): machines that ask for
  one key at once each build it;
- shared remote (the default): builds must equal K;
- the server killed (SIGKILL) and frozen (SIGSTOP) half-way through the time the
  shared run took:
  every machine must finish, from its own builds;
- one machine's compiler hung (its first compiler process gets SIGSTOP: alive,
  lease renewed, no progress): every other machine must finish within the
  shared run's time plus ABICACHE_LEASE_STUCK (60 s) and a margin.

Reported per run: builds, wrong loads (a library returning another's value),
bytes moved up and down, p50/p99 time from asking to a called function, the
slowest machine's wall time. Exits 1 if builds != K in the shared run, or any
run has a wrong load or a machine that did not finish.

    python bench/fleet.py [--nodes 4] [--artifacts 16]

`--cmake`: the compiler launcher's fleet (issue 50) instead: N machines, each a clone of one
CMake project at its own path under one base folder (ABICACHE_BASE_DIR) and a store of its
own, configure it with the launcher's native front as CMAKE_{C,CXX}_COMPILER_LAUNCHER and run
`ninja` at the same moment against one SeaweedFS with leases: every unit must be compiled once
in the whole fleet (builds = the project's compiles), and every machine must end with the same
objects. The project: a generated tree of 60 units, or `--sdist` as bench/launcher.py takes it
(`--sdist llama-cpp-python==0.3.36 --subdir vendor/llama.cpp --cmake-arg=...`).

`--one-path`: every machine sees its clone at one path (a mount namespace of its own, as CI
machines check out at one path; needs root): a unity build's generated sources include their
files by absolute path, so clones at different paths compile those units each (as with ccache).

    python bench/fleet.py --cmake [--nodes 4] [--jobs 2] [--one-path] [--sdist ... --subdir ... --cmake-arg=...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

RESULTS = ROOT / "bench" / "results"


def source(i: int) -> str:
    """Artifact i: a little C++ (a few tenths of a second of g++) whose answer names it."""
    return f"""
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>
extern "C" int answer(int x) {{
    std::vector<int> v(16);
    std::iota(v.begin(), v.end(), x);
    std::string s = std::to_string(std::accumulate(v.begin(), v.end(), 0));
    return x * 1000 + {i} + static_cast<int>(s.size()) * 0;
}}
"""


# ---- one machine -------------------------------------------------------------------


def node(root: str, url: str, seed: int, k: int, start_at: float) -> None:
    import ctypes

    import abicache

    cache = abicache.Cache(root, remote=url or False)
    order = list(range(k))
    random.Random(seed).shuffle(order)
    time.sleep(max(0.0, start_at - time.time()))  # the fleet starts together
    began, rows = time.monotonic(), []
    for i in order:
        start = time.monotonic()
        art = abicache.cc.build_library(f"fleet{i}", [source(i)], cache=cache)
        lib = ctypes.CDLL(str(art.file()))
        got = lib.answer(7)
        rows.append({"i": i, "origin": art.origin, "seconds": time.monotonic() - start, "ok": got == 7000 + i})
    stats = dict(cache.remote.stats) if cache.remote is not None else {}
    print(json.dumps({"rows": rows, "wall": time.monotonic() - began, "stats": stats,
                      "down": bool(cache.remote and cache.remote.down)}))


# ---- the fleet -----------------------------------------------------------------------


def run(label: str, work: Path, url: str, nodes: int, k: int, env: dict[str, str],
        stop: tuple[object, int, float] | None = None, hang: bool = False) -> dict:
    """One run of the whole fleet; stop = (server process, signal, fraction of the way in);
    hang: machine 0's first compiler is stopped, and machine 0 left out of the results."""
    start_at = time.time() + 1.5  # after every interpreter has started
    procs = [subprocess.Popen([sys.executable, __file__, "--node", str(work / label / f"m{n}"), url, str(n), str(k),
                               str(start_at)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **env}) for n in range(nodes)]
    if stop is not None:
        proc, sig, seconds = stop
        time.sleep(max(0.0, start_at - time.time()) + seconds)
        os.kill(proc.pid, sig)  # type: ignore[attr-defined]
    hung = _hang_first_compiler(procs[0].pid) if hang else None
    outs = []
    for p in procs[1:] if hang else procs:
        out, err = p.communicate(timeout=900)
        if p.returncode != 0:
            outs.append({"failed": err[-2000:]})
        else:
            outs.append(json.loads(out.strip().splitlines()[-1]))
    if hang:
        procs[0].kill()
        procs[0].communicate()
        if hung is not None and not hung.is_set():
            outs.append({"failed": "machine 0's compiler was never caught to be stopped"})
    return summarize(label, outs, k)


def _hang_first_compiler(pid: int) -> object:
    """SIGSTOP the first compiler process below pid, from a thread; its Event is set once done."""
    import threading

    done = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for child in _descendants(pid):
                try:
                    name = Path(f"/proc/{child}/comm").read_text().strip()
                except OSError:
                    continue
                if name in ("cc1plus", "cc1"):
                    os.kill(child, signal.SIGSTOP)
                    done.set()
                    return
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()
    return done


def _descendants(pid: int) -> list[int]:
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            parents[int(name)] = int(stat[stat.rfind(b")") + 2:].split()[1])
    found, frontier = [], [pid]
    while frontier:
        up = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == up]
        found += kids
        frontier += kids
    return found


def summarize(label: str, outs: list[dict], k: int) -> dict:
    done = [o for o in outs if "rows" in o]
    rows = [r for o in done for r in o["rows"]]
    times = sorted(r["seconds"] for r in rows)
    return {
        "run": label,
        "machines": len(outs),
        "finished": sum(len(o["rows"]) == k for o in done),
        "builds": sum(r["origin"] == "built" for r in rows),
        "fetched": sum(r["origin"] == "remote" for r in rows),
        "wrong_loads": sum(not r["ok"] for r in rows),
        "bytes_up": sum(o["stats"].get("bytes_up", 0) for o in done),
        "bytes_down": sum(o["stats"].get("bytes_down", 0) for o in done),
        "p50_s": statistics.median(times) if times else None,
        "p99_s": times[min(len(times) - 1, int(0.99 * len(times)))] if times else None,
        "slowest_machine_s": max((o["wall"] for o in done), default=None),
        "saw_remote_down": sum(o["down"] for o in done),
        "errors": [o["failed"] for o in outs if "failed" in o],
    }


def cmake_fleet(nodes: int, jobs: int, sdist: str | None, subdir: str, cmake_args: list[str],
                one_path: bool = False) -> int:
    """The launcher's fleet (module docstring, --cmake); 1 where a unit was compiled twice, a
    build failed or two machines' objects differ. one_path: each machine sees its clone at one
    path (a mount namespace of its own, as CI machines check out at one path: a unity build's
    generated sources name their files by absolute path)."""
    import servers

    sys.path.insert(0, str(ROOT / "bench"))
    import launcher

    work = Path(tempfile.mkdtemp(prefix="abicache-fleet-cmake-"))
    base = work / "base"
    common = base / "checkout"  # with one_path: where every machine sees its own clone
    source = launcher.sdist(sdist, work / "sdist", subdir) if sdist else launcher.generated(work / "gen")
    env = {**os.environ, **servers.CREDENTIALS, "PYTHONPATH": str(ROOT / "src"), "ABICACHE_PROGRESS": "0",
           "ABICACHE_BASE_DIR": str(base)}
    machines = []
    for m in range(nodes):  # each its clone at its own path, its own store and front
        clone = base / f"machine{m}" / "clone"
        top = source.parents[len(Path(subdir).parts) - 1] if subdir else source  # the release, subdir inside
        shutil.copytree(top, clone, symlinks=True)
        project = clone / subdir if subdir else clone
        store = {**env, "ABICACHE_DIR": str(base / f"machine{m}" / "store")}
        front = subprocess.run([sys.executable, "-m", "abicache", "launcher"], env=store, capture_output=True,
                               text=True, check=True).stdout.strip()
        machines.append((project, store, front))
    common.mkdir()
    go = work / "go"
    with servers.seaweedfs_s3() as endpoint:
        url = servers.s3_url(endpoint)  # one prefix for the fleet (each call names another)
        procs = []
        for m, (project, store, front) in enumerate(machines):
            store["ABICACHE_REMOTE"] = url
            seen = common / subdir if one_path else project  # the path this machine builds at
            script = "\n".join([
                "set -e",
                f"mount --bind '{project.parents[len(Path(subdir).parts) - 1] if subdir else project}' '{common}'"
                if one_path else ":",
                f"cd '{seen}'",
                " ".join(["cmake", "-S", ".", "-B", "build", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                          f"'-DCMAKE_C_COMPILER_LAUNCHER={front}'", f"'-DCMAKE_CXX_COMPILER_LAUNCHER={front}'",
                          *(f"'{a}'" for a in cmake_args), ">", f"'{work}/cmake{m}.log'", "2>&1"]),
                f"touch '{work}/ready{m}'",
                f"while [ ! -e '{go}' ]; do sleep 0.05; done",  # the fleet starts together
                f"exec ninja -C build -j{jobs}"])
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script] if one_path else \
                ["sh", "-c", script]
            procs.append(subprocess.Popen(argv, env={**store, "PWD": str(seen)}, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT))
        while not all((work / f"ready{m}").exists() for m in range(nodes)):
            if any(p.poll() not in (None, 0) for p in procs):
                logs = [(work / f"cmake{m}.log").read_text(errors="replace")[-1500:] for m in range(nodes)
                        if (work / f"cmake{m}.log").exists()]
                sys.exit(f"bench/fleet: a machine failed before its build: {logs}")
            time.sleep(0.1)
        start = time.monotonic()
        go.touch()
        walls, failed = [], []
        for proc in procs:
            out, _ = proc.communicate(timeout=3600)
            walls.append(time.monotonic() - start)
            if proc.returncode != 0:
                failed.append(out.decode(errors="replace")[-1500:])
    units = len([line for line in subprocess.run(["ninja", "-C", str(machines[0][0] / "build"), "-t", "commands"],
                                                 capture_output=True, text=True, check=True).stdout.splitlines()
                 if " -c " in line])
    counts = [json.loads(subprocess.run([sys.executable, "-m", "abicache", "stats", "--json"], env=store,
                                        capture_output=True, text=True, check=True).stdout)["counts"]
              for _, store, _ in machines]
    builds = sum(c.get("builds", 0) for c in counts)
    objects: dict[str, set[bytes]] = {}
    for project, _, _ in machines:
        for obj in (project / "build").rglob("*.o"):
            objects.setdefault(str(obj.relative_to(project / "build")), set()).add(obj.read_bytes())
    differing = sorted(name for name, made in objects.items() if len(made) > 1)
    label = (sdist or "a generated tree of 60 units") + (", every clone at one path" if one_path else "")
    print(f"Fleet: {nodes} machines build {label} at once (CMake + ninja -j{jobs}, the launcher's front, one "
          f"SeaweedFS with leases; target: builds = compiles = {units})")
    print(f"  builds in the fleet {builds} (per machine: {[c.get('builds', 0) for c in counts]}), "
          f"fetched from the remote {sum(c.get('hits_remote', 0) for c in counts)}")
    print(f"  wall: the slowest machine {max(walls):.1f} s, the fastest {min(walls):.1f} s; "
          f"objects that differ between machines: {len(differing)}; failed builds: {len(failed)}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fleet_cmake.json").write_text(json.dumps(
        {"nodes": nodes, "project": label, "compiles": units, "builds": builds, "walls_s": walls,
         "counts": counts, "differing": differing, "failed": failed}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    for text in failed:
        print(text, file=sys.stderr)
    return 0 if builds == units and not differing and not failed else 1


def main() -> int:
    import servers

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--artifacts", type=int, default=16)
    parser.add_argument("--cmake", action="store_true", help="the compiler launcher's fleet (module docstring)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--sdist", help="with --cmake: a PyPI source release (bench/launcher.py)")
    parser.add_argument("--subdir", default="")
    parser.add_argument("--cmake-arg", action="append", default=[])
    parser.add_argument("--one-path", action="store_true",
                        help="with --cmake: every clone seen at one path (unshare --mount, needs root)")
    args = parser.parse_args()
    if args.cmake:
        return cmake_fleet(args.nodes, args.jobs, args.sdist, args.subdir, args.cmake_arg, args.one_path)
    n, k = args.nodes, args.artifacts
    os.environ.update(servers.CREDENTIALS, ABICACHE_PROGRESS="0")
    work = Path(tempfile.mkdtemp(prefix="abicache-fleet-"))
    quiet = {"PYTHONWARNINGS": "ignore"}  # the one "remote is not usable" line per machine, expected below
    results = [run("no remote", work, "", n, k, quiet)]
    shared_wall = 0.0
    for label, env in (("shared, leases off", {"ABICACHE_REMOTE_LEASE": "0"}), ("shared", {})):
        with servers.seaweedfs_s3() as endpoint:
            results.append(run(label, work, servers.s3_url(endpoint), n, k, {**quiet, **env}))
    shared_wall = results[-1]["slowest_machine_s"] or 1.0
    with servers.seaweedfs_s3() as endpoint:  # the others wait ABICACHE_LEASE_STUCK (60 s), then build it
        results.append(run("one machine's compiler hung", work, servers.s3_url(endpoint), n, k, quiet, hang=True))
    for label, sig in (("server killed mid-run", signal.SIGKILL), ("server frozen mid-run", signal.SIGSTOP)):
        with servers.seaweedfs_server() as (endpoint, proc):
            try:
                results.append(run(label, work, servers.s3_url(endpoint), n, k, quiet, (proc, sig, shared_wall / 2)))
            finally:
                if sig == signal.SIGSTOP:
                    proc.kill()
    show(results, n, k)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fleet.json").write_text(json.dumps({"nodes": n, "artifacts": k, "runs": results}, indent=1))
    shared = next(r for r in results if r["run"] == "shared")
    bad = [r["run"] for r in results if r["wrong_loads"] or r["finished"] != r["machines"] or r["errors"]]
    hung = next(r for r in results if r["run"] == "one machine's compiler hung")
    if (hung["slowest_machine_s"] or 1e9) > shared_wall + 60 + 30:  # the stuck time, and a margin
        bad.append(f"{hung['run']}: the others took {hung['slowest_machine_s']:.0f} s")
    if shared["builds"] != k or bad:
        print(f"fleet: FAILED (shared run built {shared['builds']} of K={k}; runs with a wrong load or an "
              f"unfinished machine: {bad or 'none'})", file=sys.stderr)
        for r in results:
            for e in r["errors"]:
                print(f"--- {r['run']}:\n{e}", file=sys.stderr)
        return 1
    return 0


def show(results: list[dict], n: int, k: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Fleet: {n} machines x {k} C++ libraries, each in its own random order, one SeaweedFS "
                        f"(target: builds = K = {k} when shared)", title_justify="left")
    for col in ("run", "builds", "fetched", "wrong loads", "finished", "moved up / down", "p50", "p99",
                "slowest machine"):
        table.add_column(col)
    for r in results:
        table.add_row(r["run"], str(r["builds"]), str(r["fetched"]), str(r["wrong_loads"]),
                      f"{r['finished']}/{r['machines']}", f"{r['bytes_up'] / 1e6:.2f} / {r['bytes_down'] / 1e6:.2f} MB",
                      _ms(r["p50_s"]), _ms(r["p99_s"]), _ms(r["slowest_machine_s"]))
    Console(width=150).print(table)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--node":
        root, url, seed, k, start_at = sys.argv[2:7]
        node(root, url, int(seed), int(k), float(start_at))
    else:
        sys.exit(main())
