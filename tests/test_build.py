"""The build engine on real source trees, with real compilers: the key is
everything the compiler read, sources compile where they live, translation
units are parallel jobs cached as objects.

Compiles are counted through a wrapper script set as $CXX that logs every
command before it runs the real compiler.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from abicache import Cache, cc
from abicache.engine import depfile, scratch
from abicache.store import deps as depcheck
from conftest import SRC, alive, need, run_py

LIB = '#include "helper.h"\n#include "api.h"\nextern "C" int answer() { return helper() + API; }\n'


@pytest.fixture(autouse=True)
def _fresh_memory() -> None:
    depcheck.forget()  # what this process remembers of header hashes


@pytest.fixture
def project(tmp_path: Path) -> Path:
    need("c++")
    root = tmp_path / "proj"
    (root / "csrc").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "csrc" / "lib.cpp").write_text(LIB)
    (root / "csrc" / "helper.h").write_text("inline int helper() { return 41; }\n")
    (root / "include" / "api.h").write_text("#define API 1\n")
    return root


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$CXX logs each command line to the returned file, then runs c++."""
    log = tmp_path / "compiles.log"
    wrapper = tmp_path / "counting-c++"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec c++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    log.write_text("")
    return log


def _edit(path: Path, text: str) -> None:
    path.write_text(text)


LOAD = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from abicache import Cache, cc
    os.chdir(sys.argv[1])
    flags = [sys.argv[3]]
    lib = cc.load_library("x", [Path("csrc/lib.cpp")], cflags=flags, cache=Cache(sys.argv[2]))
    print(lib.answer())
""")


@pytest.mark.parametrize("include", ["relative", "absolute"])
def test_a_header_edit_rebuilds_in_a_new_process(project: Path, tmp_path: Path, include: str) -> None:
    store = tmp_path / "store"
    flag = "-Iinclude" if include == "relative" else f"-I{project / 'include'}"

    def answer() -> int:
        done = subprocess.run(
            [sys.executable, "-c", LOAD, str(project), str(store), flag], capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    assert answer() == 42
    assert answer() == 42  # a hit
    _edit(project / "csrc" / "helper.h", "inline int helper() { return 98; }\n")  # a sibling header
    assert answer() == 99
    _edit(project / "include" / "api.h", "#define API 2\n")  # through the include path
    assert answer() == 100
    _edit(project / "include" / "api.h", "#define API 1\n")
    _edit(project / "csrc" / "helper.h", "inline int helper() { return 41; }\n")
    assert answer() == 42  # the first build holds these bytes again: a hit, not a build
    entries = list(Cache(store).store.iter_variant_dirs())
    assert len(entries) == 3


def test_a_header_edit_rebuilds_in_the_same_process(project: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    cache = Cache(tmp_path / "store")
    src = [Path("csrc/lib.cpp")]
    assert cc.load_library("x", src, cflags=["-Iinclude"], cache=cache).answer() == 42
    _edit(project / "include" / "api.h", "#define API 5\n")
    assert cc.load_library("x", src, cflags=["-Iinclude"], cache=cache).answer() == 46
    art = cc.build_library("x", src, cflags=["-Iinclude"], cache=cache)
    project_deps = [d for d in art.manifest.deps if d.base != "abs"]  # the rest: system headers, link inputs
    assert art.hit and {d.path for d in project_deps} == {"helper.h", "api.h"}
    assert {d.base for d in project_deps} == {"src", "inc0"}


def test_explain_names_the_changed_header(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    cache = Cache(tmp_path / "store")
    cc.build_library("x", [Path("csrc/lib.cpp")], cflags=["-Iinclude"], cache=cache)
    _edit(project / "include" / "api.h", "#define API 7\n")
    plan = cc.library_plan("x", [Path("csrc/lib.cpp")], cflags=["-Iinclude"])
    text = str(cache.explain(plan.kind, plan.name, plan.inputs, plan.bases))
    assert "dependency inc0/api.h" in text, text
    cc.build_library("x", [Path("csrc/lib.cpp")], cflags=["-Iinclude"], cache=cache)
    done = subprocess.run([sys.executable, "-m", "abicache", "explain", "x", "--root", str(cache.root)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert "dependency inc0/api.h" in done.stdout, done.stdout + done.stderr


def test_two_clones_share_one_entry(project: Path, tmp_path: Path, counted: Path) -> None:
    clone = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(project, clone)
    cache = Cache(tmp_path / "store")
    a = cc.build_library("x", [project / "csrc" / "lib.cpp"], cflags=[f"-I{project / 'include'}"], cache=cache)
    b = cc.build_library("x", [clone / "csrc" / "lib.cpp"], cflags=[f"-I{clone / 'include'}"], cache=cache)
    assert b.hit and b.path == a.path
    assert len([line for line in counted.read_text().splitlines() if " -o " in line]) == 1
    for dep in a.manifest.deps:  # the project's files by base (absolute: system files, the compiler wrapper)
        assert str(project) not in dep.path and str(clone) not in dep.path
    for group in a.manifest.absent:
        assert str(project) not in group.folder


def test_inline_sources_still_work_and_record_no_project_file(tmp_path: Path) -> None:
    need("c++")
    art = cc.build_library("inl", ['extern "C" int v() { return 3; }'], cache=Cache(tmp_path / "s"))
    assert not art.hit
    # what the driver and the linker read of the system (crt files, libc's linker script), nothing of scratch
    assert all(d.base == "abs" and scratch.PREFIX not in d.path for d in art.manifest.deps)


# ---- translation units as jobs -----------------------------------------------------------------


def _eight(root: Path) -> list[Path]:
    (root / "inc").mkdir(parents=True, exist_ok=True)
    (root / "inc" / "shared.h").write_text("#define SHARED 10\n")
    (root / "inc" / "other.h").write_text("#define OTHER 1\n")
    paths = []
    for i in range(8):
        header = "shared.h" if i < 3 else "other.h"
        macro = "SHARED" if i < 3 else "OTHER"
        path = root / f"u{i}.cpp"
        path.write_text(f'#include "{header}"\nextern "C" int f{i}() {{ return {i} + {macro}; }}\n')
        paths.append(path)
    return paths


def _compiles(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if " -c " in f" {line} "]


def _units_compiled(log: Path) -> list[str]:
    return sorted(next(w for w in reversed(line.split()) if w.endswith(".cpp")).rsplit("/", 1)[-1]
                  for line in _compiles(log))


def test_editing_one_of_eight_sources_compiles_one(tmp_path: Path, counted: Path) -> None:
    paths = _eight(tmp_path / "p")
    cache = Cache(tmp_path / "store")
    lib = cc.load_library("eight", paths, cflags=[f"-I{tmp_path / 'p' / 'inc'}"], cache=cache)
    assert [getattr(lib, f"f{i}")() for i in range(8)] == [10, 11, 12, 4, 5, 6, 7, 8]
    assert _units_compiled(counted) == [f"u{i}.cpp" for i in range(8)]
    counted.write_text("")
    paths[5].write_text('#include "other.h"\nextern "C" int f5() { return 500; }\n')
    lib = cc.load_library("eight", paths, cflags=[f"-I{tmp_path / 'p' / 'inc'}"], cache=cache)
    assert lib.f5() == 500 and lib.f4() == 5
    assert _units_compiled(counted) == ["u5.cpp"]
    assert sum(1 for line in counted.read_text().splitlines() if " -shared " in f" {line} ") == 1  # one link


def test_gc_while_a_build_links_leaves_the_objects_it_handed_over(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`abicache gc --max-size 0` runs (as documented: beside running processes) just as a
    rebuild's linker starts: the object entries handed to that linker stay until it is done."""
    paths = _eight(tmp_path / "p")
    store = tmp_path / "store"
    gc_log = tmp_path / "gc.json"
    wrapper = tmp_path / "gc-then-c++"
    wrapper.write_text(f"""#!/bin/sh
case " $* " in *" -c "*) ;; *) PYTHONPATH={SRC} {sys.executable} -m abicache gc --max-size 0 --root {store} \\
    --json > {gc_log} ;; esac
exec c++ "$@"
""")
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    flags = [f"-I{tmp_path / 'p' / 'inc'}"]
    cc.load_library("eight", paths, cflags=flags, cache=Cache(store))
    paths[5].write_text('#include "other.h"\nextern "C" int f5() { return 500; }\n')
    lib = cc.load_library("eight", paths, cflags=flags, cache=Cache(store))  # 7 object hits, gc at the link
    assert lib.f5() == 500 and lib.f4() == 5
    import json

    report = json.loads(gc_log.read_text())
    assert report["in_use"] >= 7, report  # the seven objects the linker was given were left alone
    assert report["entries_removed"] >= 1  # and gc did evict what nobody used (the first build's library)


INTERRUPTED = textwrap.dedent("""
    import signal, sys
    # as at a terminal: a suite run in a background job (`cmd &` in a script) hands its
    # children SIGINT ignored, and Python then never raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from pathlib import Path
    from abicache import Cache, cc
    units = [Path(sys.argv[1]) / f"u{i}.cpp" for i in range(4)]
    cc.load_library("four", units, cache=Cache(sys.argv[2], remote=False))
""")


def _twenty_second_build(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """A 4-unit build whose compilers take 20 s, two at once, started and waited for until both
    run: (the build's process, the file its compilers' pids are written to)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"u{i}.cpp").write_text(f'extern "C" int f{i}() {{ return {i}; }}\n')
    pids = tmp_path / "pids"
    slow = tmp_path / "slow-c++"
    # only a compile is slow (the tool probes before it are not: the signal must find compilers running)
    slow.write_text(f'#!/bin/sh\ncase " $* " in *" -c "*) echo $$ >> {pids}; sleep 20 ;; esac\nexec c++ "$@"\n')
    slow.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(SRC), "CXX": str(slow), "MAX_JOBS": "2", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(src), str(tmp_path / "store")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 30
    while not (pids.exists() and len(pids.read_text().split()) >= 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids.exists(), "no compiler started"
    return proc, pids


def _ended(proc: subprocess.Popen[str], sig: str) -> str:
    """The build's stderr once it ended; where it did not within 30 s, its threads' stacks
    (faulthandler, on SIGABRT) in the failure."""
    try:
        return proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        pytest.fail(f"the build went on for 30 s after {sig}; where its threads were:\n{proc.communicate()[1][-6000:]}")


def _still_running(pids: Path) -> list[str]:
    return [pid for pid in pids.read_text().split() if Path(f"/proc/{pid}").exists()]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupted_build_stops_every_compiler_at_once(tmp_path: Path, sig: str) -> None:
    """Ctrl-C (SIGINT) or SIGTERM in a 4-unit build whose compilers take 20 s: the process
    ends within a few seconds, every compiler is gone, one line says so, no BuildError,
    and the store holds nothing partial."""
    proc, pids = _twenty_second_build(tmp_path)
    sent = time.monotonic()
    proc.send_signal(getattr(signal, sig))
    err = _ended(proc, sig)
    took = time.monotonic() - sent
    assert took < 3.0, f"the build went on for {took:.1f} s after {sig}"
    assert _still_running(pids) == [], "compilers left running"
    if sig == "SIGINT":
        assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, err  # as Python ends on it
        assert err.count("abicache: interrupted") == 1 and "BuildError" not in err, err
        assert "/engine/" not in err and err.count('  File "') <= 8, err  # the user's frames and the API's
    else:
        assert proc.returncode == 128 + signal.SIGTERM and "terminated" in err, err
    from abicache.store.verify import verify_store

    cache = Cache(tmp_path / "store", remote=False)
    assert verify_store(cache.store, full=True).clean
    assert not any(cache.store.layout.tmp.iterdir()) if cache.store.layout.tmp.exists() else True


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_a_compilers_thread_receives_stops_the_build_at_once(tmp_path: Path, sig: str) -> None:
    """The kernel hands a process's signal to any thread that does not block it; Python runs
    the handler in the main thread only when that thread runs again. One delivered to a thread
    waiting on a compiler left the main thread asleep until the compilers were done (20 s,
    found by the suite under load). Delivered here to every thread but the main one (tgkill)."""
    proc, pids = _twenty_second_build(tmp_path)
    libc = ctypes.CDLL(None, use_errno=True)
    others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
    assert others, "the build runs no thread besides the main one"
    sent = time.monotonic()
    for tid in others:  # each thread once: whichever the kernel would have chosen
        libc.tgkill(proc.pid, tid, getattr(signal, sig))
    err = _ended(proc, sig)
    took = time.monotonic() - sent
    assert took < 3.0, f"the build went on for {took:.1f} s after {sig}: {err[-1500:]}"
    assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGTERM), err
    assert _still_running(pids) == [], "compilers left running"


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_no_more_than_max_jobs_compilers_run_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      jobs: str) -> None:
    """The pool has twice MAX_JOBS workers (bookkeeping overlaps compiles), yet at
    most MAX_JOBS compilers run: each compile holds a marker file while it runs.
    (The include-list probe, `-E -v` of an empty input, runs beside the first
    compiles and is not counted: it reads no source.)"""
    running, peak = tmp_path / "running", tmp_path / "peak.log"
    running.mkdir()
    wrapper = tmp_path / "tracking-c++"
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" -E -v -"*) exec c++ "$@";; esac\n'
                       f'touch "{running}/$$"\nls "{running}" | wc -l >> "{peak}"\nsleep 0.3\n'
                       f'c++ "$@"; rc=$?\nrm -f "{running}/$$"\nexit $rc\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("MAX_JOBS", jobs)
    paths = _eight(tmp_path / "p")
    lib = cc.load_library("eight", paths, cflags=[f"-I{tmp_path / 'p' / 'inc'}"], cache=Cache(tmp_path / "store"))
    assert lib.f3() == 4
    seen = [int(n) for n in peak.read_text().split()]
    assert len(seen) >= 9 and max(seen) == int(jobs), seen  # 8 units, the link (and identity probes)


def test_a_header_in_three_of_eight_compiles_three(tmp_path: Path, counted: Path) -> None:
    paths = _eight(tmp_path / "p")
    cache = Cache(tmp_path / "store")
    flags = [f"-I{tmp_path / 'p' / 'inc'}"]
    cc.build_library("eight", paths, cflags=flags, cache=cache)
    counted.write_text("")
    (tmp_path / "p" / "inc" / "shared.h").write_text("#define SHARED 20\n")
    art = cc.build_library("eight", paths, cflags=flags, cache=cache)
    assert not art.hit
    assert _units_compiled(counted) == ["u0.cpp", "u1.cpp", "u2.cpp"]
    lib = cc.load_library("eight", paths, cflags=flags, cache=cache)
    assert [lib.f0(), lib.f2(), lib.f3()] == [20, 22, 4]


def test_a_unit_shared_by_two_libraries_is_compiled_once(tmp_path: Path, counted: Path) -> None:
    paths = _eight(tmp_path / "p")
    cache = Cache(tmp_path / "store")
    flags = [f"-I{tmp_path / 'p' / 'inc'}"]
    cc.build_library("first", paths[:4], cflags=flags, cache=cache)
    counted.write_text("")
    cc.build_library("second", paths[2:6], cflags=flags, cache=cache)
    assert _units_compiled(counted) == ["u4.cpp", "u5.cpp"]


def test_max_jobs_and_progress_lines(tmp_path: Path) -> None:
    need("c++")
    paths = _eight(tmp_path / "p")
    code = textwrap.dedent(f"""
        from pathlib import Path
        from abicache import Cache, cc
        paths = [Path(p) for p in {[str(p) for p in paths]!r}]
        cc.build_library("eight", paths, cflags=["-I{tmp_path / 'p' / 'inc'}"], cache=Cache(STORE))
    """)
    done = run_py(code.replace("STORE", repr(str(tmp_path / "s"))), env={"MAX_JOBS": "3", "ABICACHE_PROGRESS": "1"})
    assert done.returncode == 0, done.stderr
    assert "8/8 units" in done.stderr, done.stderr
    bad = run_py(code.replace("STORE", repr(str(tmp_path / "t"))), env={"MAX_JOBS": "lots"})
    assert bad.returncode != 0 and "MAX_JOBS='lots'" in bad.stderr


# ---- crashes and races -------------------------------------------------------------------------

SLOW_BUILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from abicache import Cache, cc
    paths = [Path(p) for p in sys.argv[3:]]
    cc.build_library("eight", paths, cflags=["-I" + sys.argv[2]], cache=Cache(sys.argv[1], lock_timeout=120))
    print("built")
""")


def _slow_wrapper(tmp_path: Path, log: Path) -> Path:
    wrapper = tmp_path / "slow-c++"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nsleep 0.3\nexec c++ "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def _slow_build(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """(argv of a process building the 8 units with a slow compiler, its env, the compile log)."""
    need("c++")
    paths = _eight(tmp_path / "p")
    log = tmp_path / "log"
    log.write_text("")
    env = {**os.environ, "PYTHONPATH": str(SRC), "CXX": str(_slow_wrapper(tmp_path, log))}
    argv = [sys.executable, "-c", SLOW_BUILD, str(tmp_path / "store"), str(tmp_path / "p" / "inc"),
            *map(str, paths)]
    return argv, env, log


def test_sigkill_during_a_parallel_build_leaves_nothing_partial(tmp_path: Path) -> None:
    import faultlib

    argv, env, _ = _slow_build(tmp_path)
    store, temp = tmp_path / "store", tmp_path / "tmp"
    temp.mkdir()
    env["TMPDIR"] = str(temp)
    for delay in (0.5, 0.9, 1.3, 1.7):
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)  # the builder
        proc.wait()
        assert faultlib.partial_entries(Cache(store)) == []
    # the commands it started died with it (observe.c), but what they started (the wrapper's sleep,
    # cc1plus, as) finishes its step, writing into its scratch folder: they end first (a folder
    # written to lately is not swept)
    deadline = time.monotonic() + 30
    if shutil.which("pkill") is None:
        time.sleep(5)  # each takes ~0.5 s
    while shutil.which("pkill") and subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)]).returncode == 0 \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    left = list(temp.glob(f"{scratch.PREFIX}*"))
    assert left, "no killed build left its scratch folder: nothing for the next build to sweep"
    # as if all this was a while ago: a folder just written to is not swept (scratch.GRACE), nor
    # the temporary folder again soon after a sweep (scratch.EVERY: the killed builds' own)
    for path in temp.iterdir():
        os.utime(path, (time.time() - 2 * scratch.EVERY,) * 2)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and "built" in done.stdout, done.stderr
    assert faultlib.partial_entries(Cache(store)) == []
    # the next build of this user (another library: that one may be a hit now) sweeps them; its own is removed
    code = 'extern "C" int other() { return 5; }'
    other = run_py(f"from abicache import Cache, cc; cc.build_library('other', [{code!r}], cache=Cache({str(store)!r}))",
                   env={**env, "CXX": "c++"})
    assert other.returncode == 0, other.stderr
    assert sorted(p.name for p in temp.glob(f"{scratch.PREFIX}*")) == []


def _running(marker: bytes) -> list[int]:
    """The processes of this machine whose command line holds marker."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker in f.read():
                    found.append(int(entry))
        except OSError:
            pass  # gone since
    return found


def _gone_within(marker: bytes, seconds: float) -> list[int]:
    """The processes with marker left after seconds, or [] once none has been for a while: a
    process in the middle of an exec shows no command line for an instant."""
    deadline, empty = time.monotonic() + seconds, 0
    while empty < 5 and time.monotonic() < deadline:
        empty = 0 if _running(marker) else empty + 1
        time.sleep(0.05)
    return _running(marker)


def _wait_for(path: Path, seconds: float = 30) -> str:
    """What path holds once it is there (written whole: put by a rename)."""
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return path.read_text() if path.exists() else ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's (prctl)")
def test_the_compiler_a_builder_started_dies_with_it_when_sigkill_ends_it(tmp_path: Path) -> None:
    """A builder killed by SIGKILL (the OOM killer, a scheduler's timeout) runs no cleanup, and its
    compilers run in sessions of their own: the command it started is killed with it (observe.c
    started), where it ran on for as long as it took (here a compile that would take 2 minutes)."""
    need("c++")
    paths = _eight(tmp_path / "p")
    marker = f"abicache-hanging-compile-{os.urandom(6).hex()}"
    wrapper = tmp_path / "hanging-c++"  # a unit's compile hangs; the compiler's probes are c++'s own
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" -c "*) exec "{sys.executable}" -c "import time; '
                       f'time.sleep(120)" {marker} ;; esac\nexec c++ "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(SRC), "CXX": str(wrapper)}
    argv = [sys.executable, "-c", SLOW_BUILD, str(tmp_path / "store"), str(tmp_path / "p" / "inc"), *map(str, paths)]
    with open(tmp_path / "stderr", "wb") as err:
        proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while not _running(marker.encode()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _running(marker.encode()), (tmp_path / "stderr").read_text()
        os.killpg(proc.pid, signal.SIGKILL)  # the builder, not its compilers' sessions
        proc.wait()
        # a compile its observer had not entered yet dies as it does: on a loaded machine, when it
        # gets the CPU (the wait ends as soon as none is left; one that lived on would for 2 minutes)
        assert _gone_within(marker.encode(), 60) == [], "a compile outlived the builder that SIGKILL ended"
    finally:
        for pid in _running(marker.encode()):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def _put(path: Path, text: str) -> str:
    """Python code that writes text to path whole (a reader never sees it half written)."""
    return f"open({str(path)!r} + '.part', 'w').write({text}); os.rename({str(path)!r} + '.part', {str(path)!r})"


def _survive(flag: Path) -> str:
    """A program that says it runs (its observer let it), then waits to be killed."""
    return f"open({str(flag)!r}, 'w').close(); import time; time.sleep(120)"


#: when the command goes on: once its builder is reaped (no such process), or while it waits to be (a
#: zombie, which still answers kill(): its parent, a shell or a scheduler, has not waited for it yet)
_ORPHANED = {"reaped": "os.path.exists(f'/proc/{builder}')", "unreaped": "os.getppid() == builder"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's (prctl)")
@pytest.mark.parametrize("builder_is", sorted(_ORPHANED))
def test_a_command_whose_builder_died_as_it_started_it_dies_too(tmp_path: Path, builder_is: str) -> None:
    """The builder killed between its fork and the command's first instruction: the command,
    orphaned before the observer could tie it to its parent, still dies (observe.c start).
    CI once saw one such compile outlive the test above; here the window is held open."""
    need("cc")
    from abicache.engine import observe

    library = observe.library(tmp_path / "tools")
    assert library is not None
    marker = f"abicache-orphaned-compile-{os.urandom(6).hex()}"
    execing, survived = tmp_path / "execing", tmp_path / "survived"
    # the command, unobserved until it execs (as a fork of abicache is), waits to be orphaned
    command = (f"import os, sys, time\nbuilder = int(sys.argv[1])\n"
               f"while {_ORPHANED[builder_is]}: time.sleep(0.01)\n"
               f"{_put(execing, 'str(os.getpid())')}\n"
               f"os.execve(sys.executable, [sys.executable, '-c', {_survive(survived)!r}, {marker!r}],"
               f" {{**os.environ, 'LD_PRELOAD': {str(library)!r}}})\n")
    builder = (f"import os, subprocess, sys\n"
               f"subprocess.Popen([sys.executable, '-c', {command!r}, str(os.getpid())], start_new_session=True,"
               f" env={{**os.environ, {observe.PARENT_VARIABLE!r}: str(os.getpid())}})\n")
    proc = subprocess.Popen([sys.executable, "-c", builder])
    try:
        if builder_is == "reaped":
            assert proc.wait(timeout=60) == 0
        command_pid = int(_wait_for(execing) or 0)
        assert command_pid, "the command was never orphaned"
        deadline = time.monotonic() + 120  # what decides is which comes first, not a time
        while alive(command_pid) and not survived.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not survived.exists(), "a command outlived the builder that died as it started"
        assert not alive(command_pid)
        assert proc.wait(timeout=60) == 0
    finally:
        for pid in _running(marker.encode()):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def _started(pid: int) -> int:
    """A process's start time: /proc/<pid>/stat's 22nd field, clock ticks since boot."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[19])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's (prctl)")
@pytest.mark.parametrize("started", ["then", "another time"])
def test_an_orphaned_command_knows_its_builder_by_its_start_not_its_pid_alone(tmp_path: Path, started: str) -> None:
    """The builder's pid, reused by another process in the moment before an orphaned command's
    observer looks (pid_max is 32768 here): ABICACHE_TRACE_PARENT holds the builder's start time
    too, and a live process of that pid started at another time is not the builder. Here the
    pid is a live process's that is not the command's parent, as an orphan's builder is."""
    need("cc")
    from abicache.engine import observe

    library = observe.library(tmp_path / "tools")
    assert library is not None
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        began = _started(other.pid) + (0 if started == "then" else 1)
        done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "LD_PRELOAD": str(library),
                                   observe.PARENT_VARIABLE: f"{other.pid}:{began}"})
        if started == "then":  # its builder lives: it runs
            assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
        else:  # its builder is gone, its pid another's
            assert done.returncode == -signal.SIGKILL
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/<pid>/stat is Linux's")
def test_the_builder_is_named_by_its_pid_and_its_start() -> None:
    from abicache.engine import observe

    assert observe.parent_value() == f"{os.getpid()}:{_started(os.getpid())}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's (prctl)")
def test_a_daemon_the_command_started_runs_its_own_commands_after_the_builder_is_gone(tmp_path: Path) -> None:
    """A compiler cache's server, started by a build's compile, serves later builds: what it
    starts after that build's abicache has ended is no orphaned command and runs."""
    need("cc")
    from abicache.engine import observe

    library = observe.library(tmp_path / "tools")
    assert library is not None
    marker = f"abicache-daemons-compile-{os.urandom(6).hex()}"
    ready, served, survived = tmp_path / "ready", tmp_path / "served", tmp_path / "survived"
    report = _put(served, "f'{p.pid} {p.poll()}'")  # the daemon's compile: its pid, and its exit code (None: runs)
    # the command forks a daemon (its own session), which, once the builder is gone, runs a compile
    daemon = (f"import os, subprocess, sys, time\nbuilder = int(sys.argv[1])\n"
              f"if os.fork() == 0:\n"
              f"    os.setsid()\n"
              f"    while os.path.exists(f'/proc/{{builder}}'): time.sleep(0.01)\n"
              f"    p = subprocess.Popen([sys.executable, '-c', {_survive(survived)!r}, {marker!r}])\n"
              f"    while p.poll() is None and not os.path.exists({str(survived)!r}): time.sleep(0.01)\n"
              f"    {report}\n"
              f"    os._exit(0)\n"
              f"open({str(ready)!r}, 'w').close()\n"
              f"time.sleep(120)\n")
    builder = (f"import os, subprocess, sys, time\n"
               f"env = {{**os.environ, 'LD_PRELOAD': {str(library)!r}, {observe.PARENT_VARIABLE!r}: str(os.getpid())}}\n"
               f"subprocess.Popen([sys.executable, '-c', {daemon!r}, str(os.getpid())], start_new_session=True, env=env)\n"
               f"while not os.path.exists({str(ready)!r}): time.sleep(0.01)\n")
    try:
        subprocess.run([sys.executable, "-c", builder], check=True, timeout=60)
        pid, _, code = _wait_for(served, 120).partition(" ")
        assert code == "None" and survived.exists(), "the daemon's compile was killed as the builder's orphan"
        assert int(pid) in _running(marker.encode())
    finally:
        for pid in _running(marker.encode()):
            os.kill(pid, signal.SIGKILL)


def test_eight_processes_racing_compile_each_object_once(tmp_path: Path) -> None:
    argv, env, log = _slow_build(tmp_path)
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) for _ in range(8)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs) and all("built" in o for o in outs)
    assert _units_compiled(log) == [f"u{i}.cpp" for i in range(8)]


# ---- other compilers --------------------------------------------------------------------------------

NV = '#include "k.h"\n__global__ void kern(int* x) { x[0] = K; }\n'


@pytest.mark.parametrize("include", ["relative", "absolute"])
def test_nvcc_compile_rebuilds_on_a_header_edit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, include: str) -> None:
    from abicache import cuda

    from abicache.env import probes

    if probes.nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "k.h").write_text("#define K 3\n")
    opts = ["-Iinc"] if include == "relative" else [f"-I{tmp_path / 'inc'}"]
    cache = Cache(tmp_path / "store")
    first = cuda.compile(NV, arch="sm_90", options=opts, cache=cache)
    assert cuda.compile(NV, arch="sm_90", options=opts, cache=cache).artifact.hit
    (tmp_path / "inc" / "k.h").write_text("#define K 4\n")
    second = cuda.compile(NV, arch="sm_90", options=opts, cache=cache)  # same process
    assert not second.artifact.hit and second.data != first.data
    again = run_py(f"""
import os; os.chdir({str(tmp_path)!r})
from abicache import Cache, cuda
print(cuda.compile({NV!r}, arch="sm_90", options={opts!r}, cache=Cache({str(tmp_path / 'store')!r})).artifact.hit)
""")
    assert again.returncode == 0 and again.stdout.strip() == "True", again.stderr


TORCH_LOAD = textwrap.dedent("""
    import ctypes, os, sys
    from pathlib import Path
    import abicache.torch as at
    from abicache import Cache
    os.chdir(sys.argv[1])
    path = at.load("plain", [Path("csrc/lib.cpp")], extra_include_paths=[sys.argv[3]], is_python_module=False,
                   cache=Cache(sys.argv[2]))
    print(ctypes.CDLL(str(path)).answer())
""")


def test_torch_load_rebuilds_on_a_header_edit(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corpus import torch_root

    torch_root()
    import ctypes

    import abicache.torch as at

    def fresh(include: str) -> int:
        done = subprocess.run([sys.executable, "-c", TORCH_LOAD, str(project), str(tmp_path / "store"), include],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=300)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.strip().splitlines()[-1])

    assert fresh("include") == 42
    _edit(project / "include" / "api.h", "#define API 3\n")
    assert fresh(str(project / "include")) == 44  # absolute include path: the same base
    monkeypatch.chdir(project)
    cache = Cache(tmp_path / "store")
    path = at.load("plain", [Path("csrc/lib.cpp")], extra_include_paths=["include"], is_python_module=False,
                   cache=cache)
    assert ctypes.CDLL(str(path)).answer() == 44
    _edit(project / "csrc" / "helper.h", "inline int helper() { return 1; }\n")
    path = at.load("plain", [Path("csrc/lib.cpp")], extra_include_paths=["include"], is_python_module=False,
                   cache=cache)
    assert ctypes.CDLL(str(path)).answer() == 4  # same process, new code


# ---- depfiles ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("observe", ["1", "0"])
def test_header_names_with_a_tab_or_a_line_break_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      observe: str) -> None:
    """A tab is spelled in a dependency file, a line break is not: the first is recorded (a
    hit next time), the second builds and loads but is not cached, with a warning; neither crashes."""
    import warnings

    monkeypatch.setenv("ABICACHE_OBSERVE", observe)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "we\tird.h").write_text("#define V 3\n")
    (tmp_path / "lib.cpp").write_text('#include "we\tird.h"\nextern "C" int v() { return V; }\n')
    cache = Cache(tmp_path / "store")
    assert cc.load_library("tab", [Path("lib.cpp")], cflags=["-Iinc"], cache=cache).v() == 3
    assert cc.load_library("tab", [Path("lib.cpp")], cflags=["-Iinc"], cache=Cache(tmp_path / "store")).v() == 3
    assert len(cache.store.keys_named("cc.library", "tab")) == 1
    (tmp_path / "inc" / "we\tird.h").write_text("#define V 4\n")
    assert cc.load_library("tab", [Path("lib.cpp")], cflags=["-Iinc"], cache=Cache(tmp_path / "store")).v() == 4
    odd = tmp_path / "d\nir"
    odd.mkdir()
    (odd / "w.h").write_text("#define W 5\n")
    (tmp_path / "nl.cpp").write_text('#include "w.h"\nextern "C" int w() { return W; }\n')
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        lib = cc.load_library("nl", [Path("nl.cpp")], cflags=[f"-I{odd}"], cache=Cache(tmp_path / "store"))
    assert lib.w() == 5
    assert any("line break" in str(w.message) and "not cached" in str(w.message) for w in said), \
        [str(w.message) for w in said]


def test_a_source_whose_name_is_not_utf8_builds_and_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file name of Latin-1 bytes, as the compiler takes it: built and loaded, no
    UnicodeEncodeError (the key hashed it as text), and cached: the second call is a hit (the
    compiler looks for `<name>.gch`, recorded by its bytes)."""
    import warnings

    monkeypatch.chdir(tmp_path)
    name = os.fsdecode(b"caf\xe9.cpp")
    Path(name).write_text('extern "C" int f() { return 7; }\n')
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert cc.build_library("latin", [Path(name)], cache=Cache(tmp_path / "store")).origin == "built"
        again = cc.build_library("latin", [Path(name)], cache=Cache(tmp_path / "store"))
    assert (again.origin, again.hit) == ("local", True)
    assert not [str(w.message) for w in said if "not cached" in str(w.message)]


def test_a_header_whose_name_is_not_utf8_is_cached_and_its_edit_seen(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths are bytes: a header named in Latin-1 is recorded by its name and bytes (it was
    never cached), and an edit of it rebuilds, in a new Cache and in the same one."""
    monkeypatch.chdir(tmp_path)
    inc = os.fsdecode(b"inc-\xe9")
    Path(inc).mkdir()
    header = Path(inc, os.fsdecode(b"v\xe9.h"))
    header.write_text("#define V 1\n")
    Path("x.cpp").write_bytes(b'#include "v\xe9.h"\nextern "C" int f() { return V; }\n')
    cache = Cache(tmp_path / "store")
    assert cc.load_library("odd", [Path("x.cpp")], cflags=[f"-I{inc}"], cache=cache).f() == 1
    hit = cc.build_library("odd", [Path("x.cpp")], cflags=[f"-I{inc}"], cache=Cache(tmp_path / "store"))
    assert (hit.origin, hit.hit) == ("local", True)
    recorded = [d.path for d in hit.manifest.deps]
    assert any(os.fsencode(p).endswith(b"v\xe9.h") for p in recorded), recorded
    time.sleep(0.05)
    header.write_text("#define V 2\n")
    assert cc.load_library("odd", [Path("x.cpp")], cflags=[f"-I{inc}"], cache=cache).f() == 2
    assert cc.load_library("odd", [Path("x.cpp")], cflags=[f"-I{inc}"], cache=Cache(tmp_path / "store")).f() == 2


def test_depfile_syntax(tmp_path: Path) -> None:
    text = "out.o: src/a.cpp /usr/include/stdio.h \\\n  inc/my\\ header.h $$dollar.h\n\nsrc/x.h:\n"
    assert depfile.parse(text) == ["src/a.cpp", "/usr/include/stdio.h", "inc/my header.h", "$dollar.h"]
    assert depfile.parse("a.o b.o: x.c y.h\nx.c:\n") == ["x.c", "y.h"]
    assert depfile.parse("a.cubin : a.cu \\\n    k.h\n") == ["a.cu", "k.h"]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab./: \t-_+C", max_size=60))
def test_depfile_lines_without_escapes_split_as_the_full_parser_reads_them(line: str) -> None:
    """The fast path (no backslash, no '$') agrees with the escape-aware parser."""
    assert depfile._prerequisites(line) == depfile._escaped(line)


def test_depfile_matches_what_gcc_wrote(tmp_path: Path) -> None:
    need("c++")
    (tmp_path / "dir with space").mkdir()
    (tmp_path / "dir with space" / "h.h").write_text("#define H 1\n")
    (tmp_path / "a.cpp").write_text('#include "h.h"\nint a = H;\n')
    subprocess.run(["c++", "-c", "a.cpp", "-o", "a.o", "-I", "dir with space", "-MD", "-MF", "a.d"],
                   cwd=tmp_path, check=True)
    found = depfile.read(tmp_path / "a.d")
    assert found[0] == "a.cpp" and "dir with space/h.h" in found


# ---- a fleet --------------------------------------------------------------------------------------------


def test_a_remote_entry_with_headers_serves_another_checkout(project: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Machine A builds from its checkout and uploads; machine B, with the same
    bytes at another path, hits through the remote; after B edits a header, B
    builds (the recorded header is checked against B's own files)."""
    import servers

    why = servers.redis_available()
    if why:
        pytest.skip(why)
    clone = tmp_path / "machine-b" / "src-checkout"
    shutil.copytree(project, clone)
    with servers.redis_server() as server:
        url = server.url()
        a = Cache(tmp_path / "A", remote=url)
        built = cc.build_library("x", [project / "csrc" / "lib.cpp"], cflags=[f"-I{project / 'include'}"], cache=a)
        assert built.origin == "built" and built.manifest.deps
        b = Cache(tmp_path / "B", remote=url)
        fetched = cc.build_library("x", [clone / "csrc" / "lib.cpp"], cflags=[f"-I{clone / 'include'}"], cache=b)
        assert fetched.origin == "remote"
        _edit(clone / "include" / "api.h", "#define API 9\n")
        depcheck.forget()
        rebuilt = cc.build_library("x", [clone / "csrc" / "lib.cpp"], cflags=[f"-I{clone / 'include'}"],
                                   cache=Cache(tmp_path / "B", remote=url))
        assert rebuilt.origin == "built" and rebuilt.variant != fetched.variant
        import ctypes

        assert ctypes.CDLL(str(rebuilt.file())).answer() == 50
