"""Hit records (src/abicache/hits/): a call's next process loads the file its record names,
and only while everything the full lookup consulted stands as it did; anything that moved
sends it the full way, which answers as it always did and records again."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from abicache import Cache, cc
from abicache import hits
from abicache.hits import record, tally, writer
from conftest import need, run_py

SRC = 'extern "C" int answer() { return 7; }'
HEADER_SRC = '#include "answer.h"\nextern "C" int answer() { return ANSWER; }'


def _load(root: Path, sources: object = (SRC,), **kw: object) -> tuple[bool, object]:
    """(whether a record served it, the library) for a call made as a new process makes it:
    nothing in this process's memo, a Cache not used yet."""
    cc._loaded.clear()
    lib = cc.load_library("answer", list(sources), cache=Cache(root), **kw)  # type: ignore[arg-type]
    held = next(v for k, v in cc._loaded.items() if k[1] == "answer")[0]
    return type(held).__name__ == "Served", lib


def _recorded(root: Path, sources: object = (SRC,), **kw: object) -> None:
    """Hits until the record is written: a build's witnesses settle a tick after it."""
    for _ in range(50):
        time.sleep(0.03)
        served, _ = _load(root, sources, **kw)
        if served:
            return
    raise AssertionError("no hit record was written")


def _built(root: Path) -> Path:
    """A library in the store and its record. In the test itself, not a fixture: pytest sets
    PYTEST_CURRENT_TEST anew for each phase, and the environment is part of a record's name."""
    need("c++")
    cc.build_library("answer", [SRC], cache=Cache(root))
    _recorded(root)
    return root


@pytest.mark.parametrize("variable", ["TORCH_CUDA_ARCH_LIST", "CXX", "ABICACHE_TEST_ANYTHING"])
def test_the_memo_serves_no_call_after_the_environment_changed(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                               variable: str) -> None:
    """In one process, a call after any variable changed (one that steers a build, the
    compiler, or one no list names) asks the store again, as a record's name would: the
    memo holds the environment it was made in. The same build: the library loaded before."""
    built = _built(root)
    _, lib = _load(built)
    asked: list[str] = []
    real = cc.build_library
    monkeypatch.setattr(cc, "build_library", lambda *a, **k: asked.append("lookup") or real(*a, **k))
    assert cc.load_library("answer", [SRC], cache=Cache(built)) is lib and not asked  # the memo
    monkeypatch.setenv(variable, os.environ.get(variable, "") + " ")
    if variable == "CXX":
        monkeypatch.setenv("CXX", need("c++"))
    assert cc.load_library("answer", [SRC], cache=Cache(built)) is lib and asked == ["lookup"]
    assert cc.load_library("answer", [SRC], cache=Cache(built)) is lib and asked == ["lookup"]  # the memo again


def test_the_default_stores_memo_follows_abicache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No cache given: the memo's store is ABICACHE_DIR's (read from os.environ's own table,
    cc.py _where). Set to one folder, another, then the first again in one process: each
    call loads that store's library, the last from the memo (each store its own entry)."""
    need("c++")
    monkeypatch.delenv("ABICACHE_DIR", raising=False)
    first, second = tmp_path / "first store", tmp_path / "second store"
    monkeypatch.setenv("ABICACHE_DIR", str(first))
    lib = cc.load_library("answer", [SRC])
    assert lib._name.startswith(str(first))  # type: ignore[attr-defined]
    monkeypatch.setenv("ABICACHE_DIR", str(second))
    assert cc.load_library("answer", [SRC])._name.startswith(str(second))  # type: ignore[attr-defined]
    asked: list[str] = []
    real = cc.build_library
    monkeypatch.setattr(cc, "build_library", lambda *a, **k: asked.append("lookup") or real(*a, **k))
    monkeypatch.setenv("ABICACHE_DIR", str(first))  # the first store's entry, made in this very environment
    assert cc.load_library("answer", [SRC]) is lib and not asked


def test_the_layout_names_match_the_store() -> None:
    from abicache.store import counters, layout, logs

    assert hits.LAYOUT == layout.LAYOUT_VERSION
    assert (tally._LOG, tally._MAX_BYTES) == (counters.LOG, logs.MAX_BYTES)


def test_a_record_serves_the_next_call_and_the_library_is_the_stores(root: Path) -> None:
    built = _built(root)
    served, lib = _load(built)
    assert served and lib.answer() == 7  # type: ignore[attr-defined]
    assert lib._name.startswith(os.path.realpath(built))  # type: ignore[attr-defined]


def test_a_fresh_process_served_imports_none_of_the_store_and_is_counted(root: Path) -> None:
    """Each process here is made the same way (the environment is part of a record's name):
    the first looks the entry up and records it, the next is served."""
    need("c++")
    code = ("import sys, json\n"
            "before = set(sys.modules)\n"
            "from abicache import Cache, cc\n"
            f"lib = cc.load_library('answer', [{SRC!r}], cache=Cache({str(root)!r}))\n"
            "print(json.dumps([lib.answer(), sorted(m for m in ('pathlib', 're', 'json', 'typing', 'enum',"
            " 'abicache.core.getting', 'abicache.store.local') if m in sys.modules and m not in before)]))")
    outs = []
    for _ in range(6):
        out = run_py(code)
        assert out.returncode == 0, out.stderr
        outs.append(json.loads(out.stdout))
        if outs[-1] == [7, []]:
            break
    assert outs[0][1] != [] and outs[-1] == [7, []], outs  # the first looked it up; a later one was served
    counted = [json.loads(line) for line in (root / "v3" / "log" / "stats.jsonl").read_text().splitlines()]
    assert sum(line.get("hits_local", 0) for line in counted) == len(outs) - 1  # the first built it


@pytest.mark.parametrize("served", [False, True], ids=["full lookup", "served by its record"])
def test_a_store_removed_before_the_process_exits_is_not_made_again_by_its_counts(root: Path, served: bool) -> None:
    """The hits a process counts are written as it exits (tally.py, store/counters.py): into
    the store's log where the store is still there, never by making its folders again (a
    script or a test that removed its store last found it back, holding log/stats.jsonl)."""
    need("c++")
    code = ("import shutil, sys\n"
            "from abicache import Cache, cc\n"
            f"lib = cc.load_library('answer', [{SRC!r}], cache=Cache({str(root)!r}))\n"
            "assert lib.answer() == 7\n"
            "served = 'abicache.core.getting' not in sys.modules\n"
            f"if served or not {served}:\n"
            f"    shutil.rmtree({str(root)!r})\n"
            "print(served)\n")
    for _ in range(6):  # served: until a process is (the first looks the entry up and records it)
        out = run_py(code)
        assert out.returncode == 0, out.stderr
        if out.stdout.strip() == "True" or not served:
            break
    assert out.stdout.strip() == str(served), out.stdout
    assert not root.exists(), sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("change", ["chmod the library", "rewrite the library", "an environment variable",
                                    "the working directory", "a config file", "a compiler earlier on PATH",
                                    "the store's folder others may write", "the record group-writable",
                                    "the record of another"])
def test_what_moved_sends_the_call_the_full_way(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               change: str) -> None:
    built = _built(root)
    lib_file = next((built / "v3" / "entries" / "cc.library").glob("*/*.*/libanswer.so"))
    records = list(Path(hits.folder(os.path.realpath(built))).iterdir())
    if change == "chmod the library":
        os.chmod(lib_file, 0o555)  # its ctime moves: the full check hashes it again
    elif change == "rewrite the library":  # a byte written over itself (not truncated: this process maps it)
        os.chmod(lib_file, 0o755)
        with open(lib_file, "r+b") as f:
            first = f.read(1)
            f.seek(0)
            f.write(first)
        os.chmod(lib_file, 0o555)
    elif change == "an environment variable":
        monkeypatch.setenv("CPATH", str(tmp_path))
    elif change == "the working directory":
        monkeypatch.chdir(tmp_path)
    elif change == "a config file":
        folder = tmp_path / "config-home" / "abicache"
        folder.mkdir(parents=True)
        (folder / "config.toml").write_text('verify_age = "1d"\n')
    elif change == "a compiler earlier on PATH":
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        os.symlink(need("c++"), bin_dir / "c++")
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        served, _ = _load(built)  # another PATH is another record: none yet
        assert not served
        _recorded(built)
        (bin_dir / "c++").unlink()  # the one PATH finds is another file now (the same compiler behind it)
        (bin_dir / "c++").write_text(f'#!/bin/sh\nexec {need("c++")} "$@"\n')
        os.chmod(bin_dir / "c++", 0o755)
    elif change == "the store's folder others may write":
        os.chmod(built, 0o777)
        from abicache.errors import UntrustedRootError
        from abicache.store import local

        local._ENSURED.clear()  # a process checks a root once: as a new process would
        with pytest.raises(UntrustedRootError):
            _load(built)
        return
    elif change == "the record group-writable":
        for r in records:
            os.chmod(r, 0o660)
    elif change == "the record of another":
        for r in records:  # a record this user did not write names a file this user never checked
            os.chown(r, 65534, 65534) if os.geteuid() == 0 else pytest.skip("needs root to give a file away")
    served, lib = _load(built)
    assert not served
    assert lib.answer() == 7  # type: ignore[attr-defined]


def _header_project(root: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    """A source that includes a header beside it, built into root."""
    need("c++")
    project = tmp_path / "project"
    project.mkdir()
    (project / "answer.h").write_text("#define ANSWER 7\n")
    (project / "answer.cpp").write_text(HEADER_SRC)
    sources = [project / "answer.cpp"]
    cc.build_library("answer", sources, cache=Cache(root))
    return project, sources


def test_a_header_edit_is_a_rebuild_not_a_record(root: Path, tmp_path: Path) -> None:
    project, sources = _header_project(root, tmp_path)
    _recorded(root, sources)
    (project / "answer.h").write_text("#define ANSWER 8\n")
    served, lib = _load(root, sources)
    assert not served and lib.answer() == 8  # type: ignore[attr-defined]


def test_a_header_that_appears_in_front_is_a_rebuild(root: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A path the build looked for and did not find (the working directory comes first in
    the quoted include search here): once it is there, the record stands for nothing."""
    need("c++")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "answer.h").write_text("#define ANSWER 7\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    flags = ["-I.", f"-I{inc}"]
    cc.build_library("answer", [HEADER_SRC], cache=Cache(root), cflags=flags)
    _recorded(root, [HEADER_SRC], cflags=flags)
    (work / "answer.h").write_text("#define ANSWER 9\n")
    served, lib = _load(root, [HEADER_SRC], cflags=flags)
    assert not served and lib.answer() == 9  # type: ignore[attr-defined]


def test_a_served_call_arms_the_watch_the_next_call_asks(root: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49: the call a record serves arms the in-process watch, so the process's next
    call checks no witness again (arming it there cost the second call 1.4 ms); an edit after
    the served call is still seen by the next one."""
    project, sources = _header_project(root, tmp_path)
    _recorded(root, sources)
    served, lib = _load(root, sources)
    assert served and lib.answer() == 7  # type: ignore[attr-defined]
    held = next(v for k, v in cc._loaded.items() if k[1] == "answer")[0]
    assert held._watch is not None and held._watch.marks  # armed by the first call
    checks: list[int] = []
    real_hold = record._hold
    monkeypatch.setattr(record, "_hold", lambda w: checks.append(len(w)) or real_hold(w))
    again = cc.load_library("answer", sources, cache=Cache(root))
    assert again is lib and checks == []  # the watch answered: nothing stat'ed again
    (project / "answer.h").write_text("#define ANSWER 8\n")
    assert cc.load_library("answer", sources, cache=Cache(root)).answer() == 8  # type: ignore[attr-defined]


def test_the_served_call_asks_its_watch_once_and_a_change_it_saw_is_the_next_calls(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The served call asks the watch it armed once, after the load (its first ask's cold
    costs are not the second call's); an edit that ask, or any early one, drained is still
    the next call's miss. A watch without inotify is not asked: that would make its
    witnesses' stat fallback, whose tuples set off a collection after `import torch`."""
    from abicache.store import watch

    project, sources = _header_project(root, tmp_path)
    _recorded(root, sources)
    asked: list[bool] = []
    real_unchanged = watch.Watch.unchanged
    monkeypatch.setattr(watch.Watch, "unchanged", lambda self: asked.append(real_unchanged(self)) or asked[-1])
    served, lib = _load(root, sources)
    assert served and asked == [True]
    held = next(v for k, v in cc._loaded.items() if k[1] == "answer")[0]
    (project / "answer.h").write_text("#define ANSWER 8\n")
    held.warm()
    assert asked[-1] is False  # the ask saw the edit (and drained its event) ...
    assert cc.load_library("answer", sources, cache=Cache(root)).answer() == 8  # type: ignore[attr-defined]
    _built(root)  # ... and the next call did too; now a library of no header
    monkeypatch.setattr(watch, "_shared", lambda: None)  # no inotify instance to be had
    asked.clear()
    served, lib = _load(root)
    held = next(v for k, v in cc._loaded.items() if k[1] == "answer")[0]
    assert served and lib.answer() == 7 and asked == []  # type: ignore[attr-defined]
    assert held._watch.marks is None and held._watch.files is None  # no fallback made for it


def test_the_second_call_after_a_full_lookup_stands_on_the_record_it_wrote(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose first call took the full lookup (no record for its environment yet)
    wrote one: its second call is served by that record, checked and armed in one native
    call each where a native check is built (a torch extension's: 10 ms to ~3.5 ms), not by
    the lookup's own witnesses in Python; the module is the one already loaded, and an edit
    after it is still the next call's rebuild."""
    from abicache.core.artifact import Artifact
    from abicache.hits import Served
    from abicache.store import deps

    project, sources = _header_project(root, tmp_path)
    _recorded(root, sources)
    for attempt in range(40):  # a record the lookup wrote, not one left for the process's exit
        monkeypatch.setenv("ABICACHE_TEST_RUN", f"{attempt}")  # a record's name holds the environment
        cc._loaded.clear()
        lib = cc.load_library("answer", sources, cache=Cache(root))
        if not writer._later:
            break
        writer._later.clear()
        time.sleep(0.05)
    held = next(v for k, v in cc._loaded.items() if k[1] == "answer")[0]
    assert isinstance(held, Artifact) and held.watch is not None and held.watch.watch is None  # none armed
    checks: list[int] = []
    real_first_changed = deps.first_changed
    monkeypatch.setattr(deps, "first_changed", lambda *a, **k: checks.append(1) or real_first_changed(*a, **k))
    again = cc.load_library("answer", sources, cache=Cache(root))
    held = next(v for k, v in cc._loaded.items() if k[1] == "answer")[0]
    assert again is lib and isinstance(held, Served) and checks == []  # the lookup's witnesses: not asked
    (project / "answer.h").write_text("#define ANSWER 8\n")
    assert cc.load_library("answer", sources, cache=Cache(root)).answer() == 8  # type: ignore[attr-defined]


AT_EXIT = """
import atexit, pathlib, sys
from abicache import Cache, cc
project, root = pathlib.Path(sys.argv[1]), sys.argv[2]
sources = [project / "answer.cpp"]
def later():  # registered before abicache's own: run after it closed its watch
    print("before", cc.load_library("answer", sources, cache=Cache(root)).answer())
    (project / "answer.h").write_text("#define ANSWER 8\\n")
    print("after", cc.load_library("answer", sources, cache=Cache(root)).answer())
if sys.argv[3] == "exit":
    atexit.register(later)
print("first", cc.load_library("answer", sources, cache=Cache(root)).answer())
print(type(next(iter(cc._loaded.values()))[0]).__name__)
"""


def test_a_call_after_the_watch_closed_at_exit_is_still_answered(root: Path, tmp_path: Path) -> None:
    """abicache closes its watch when the interpreter exits (on a thread of its own, so that
    the kernel's wait for the watches to go overlaps the interpreter's own shutdown: ~12 ms
    of a served process's wall time); an exit handler registered before it runs after it, and
    a call there is answered by stat, an edit seen, never an error on the closed descriptor."""
    import subprocess

    project, _ = _header_project(root, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(cc.__file__).parents[1])}  # one environment: one record
    run = lambda mode: subprocess.run([sys.executable, "-c", AT_EXIT, str(project), str(root), mode],  # noqa: E731
                                      capture_output=True, text=True, env=env, timeout=300)
    for _ in range(20):  # until a record serves the first call (a build's is written at its exit)
        if run("prime").stdout.split()[-1:] == ["Served"]:
            break
        time.sleep(0.05)
    done = run("exit")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split() == ["first", "7", "Served", "before", "7", "after", "8"]


def test_a_record_expires_with_the_verify_age(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need("c++")
    monkeypatch.setenv("ABICACHE_VERIFY_AGE", "3")
    _built(root)
    time.sleep(3.2)
    served, lib = _load(root)
    assert not served and lib.answer() == 7  # type: ignore[attr-defined]


def test_a_served_hit_touches_its_entry_as_a_lookup_would(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need("c++")
    monkeypatch.setenv("ABICACHE_TOUCH_INTERVAL", "1")
    _built(root)
    entry = next((root / "v3" / "entries" / "cc.library").glob("*/*.*"))
    time.sleep(1.1)
    before = entry.stat().st_mtime
    served, _ = _load(root)
    assert served and entry.stat().st_mtime > before
    served, _ = _load(root)
    assert served  # the touch left the record standing


@pytest.mark.parametrize("case", ["settings given", "ABICACHE_CHECK", "an unknown ABICACHE_ variable"])
def test_no_record_is_written_for_what_a_record_cannot_witness(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 case: str) -> None:
    need("c++")
    make = lambda: Cache(root)  # noqa: E731
    if case == "settings given":
        make = lambda: Cache(root, verify_age=100)  # noqa: E731
    elif case == "ABICACHE_CHECK":
        monkeypatch.setenv("ABICACHE_CHECK", "0")
        monkeypatch.setattr("abicache.frontends.cc_plans.checking", lambda: True)
    else:
        monkeypatch.setenv("ABICACHE_ROOOT", "x")
    cc.build_library("answer", [SRC], cache=make())
    time.sleep(0.1)
    cc._loaded.clear()
    writer._noted.clear()
    cc.load_library("answer", [SRC], cache=make())
    folder = Path(hits.folder(os.path.realpath(root)))
    assert not folder.exists() or list(folder.iterdir()) == []


STATS = """
import json, os
from abicache import cc
cc.load_library("answer", [{src!r}])
"""


def test_stats_say_which_hits_a_record_served_and_why_a_lookup_wrote_none(root: Path) -> None:
    """`abicache stats` (as ccache -s tells direct hits from preprocessed ones): the local hits
    its records served, and each full lookup that wrote no record, by its reason (no path in
    it). A CUDA extension on a GPU fleet was never served by a record, and nothing said so."""
    need("c++")
    env = {"ABICACHE_DIR": str(root)}
    for _ in range(8):
        assert run_py(STATS.format(src=SRC), env=env).returncode == 0
    run_py(STATS.format(src=SRC), env={**env, "ABICACHE_ROOOT": "x"})  # a variable that is no setting
    counts = json.loads(run_py("import sys; from abicache.cli.program import main; sys.exit(main(['stats', '--json']))",
                               env=env).stdout)["counts"]
    assert counts["hits_local"] >= 1 and 1 <= counts["hits_record"] <= counts["hits_local"]
    assert counts["unrecorded_by_reason"].get("an ABICACHE_* variable that is no setting") == 1
    assert all("/" not in reason for reason in counts["unrecorded_by_reason"])
    text = run_py("from abicache.cli.program import main; main(['stats'])", env=env).stdout
    assert f"served by a hit record (no store opened): {counts['hits_record']} of the" in text
    assert "full lookups that wrote no hit record: " in text


def test_a_record_of_the_default_store_needs_a_config_file_without_dir(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ABICACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert hits.default_root() == str(tmp_path / "cache" / "abicache")
    config = tmp_path / "config-home" / "abicache" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('max_size = "10G"\n')
    assert hits.default_root() == str(tmp_path / "cache" / "abicache")
    config.write_text(f'dir = "{tmp_path}/elsewhere"\n')
    assert hits.default_root() is None
    config.write_text('"\\u0064ir" = "/elsewhere"\n')
    assert hits.default_root() is None


def test_the_name_holds_the_call_the_store_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    call = hits.call_of("cc.library", "x", [SRC], lang=None, cflags=["-O3"], ldflags=())
    assert call is not None
    first = hits.name(call, "/s")
    assert hits.name(call, "/s") == first
    assert hits.name(call, "/t") != first
    assert hits.name(hits.call_of("cc.library", "x", [SRC], lang=None, cflags=["-O2"], ldflags=()), "/s") != first
    monkeypatch.setenv("ABICACHE_TEST_ANYTHING", "1")
    assert hits.name(call, "/s") != first
    assert hits.call_of("cc.library", "x", [object()]) is None  # not a source a record can name


def test_the_name_is_the_same_with_hashlib_loaded_or_not() -> None:
    """A process that imported hashlib (torch does) names a record with it, one that did not
    with values/digest.py's choice: the same name, so the one's record serves the other."""
    code = ("import sys{first}\nfrom abicache import hits\n"
            "print('hashlib' in sys.modules, hits.name(b'the call', '/s'))")
    names = {}
    for first in ("", "; import hashlib"):
        out = run_py(code.format(first=first), env={"ABICACHE_TEST_SAME": "1"})
        assert out.returncode == 0, out.stderr
        loaded, named = out.stdout.split()
        names[loaded] = named
    assert set(names) == {"True", "False"} and names["True"] == names["False"], names


def test_a_damaged_record_serves_nothing(root: Path) -> None:
    built = _built(root)
    for r in Path(hits.folder(os.path.realpath(built))).iterdir():
        data = r.read_bytes()
        os.chmod(r, 0o600)
        r.write_bytes(data[: len(data) // 2])
    served, lib = _load(built)
    assert not served and lib.answer() == 7  # type: ignore[attr-defined]


def test_gc_removes_records_it_has_no_use_for(root: Path) -> None:
    built = _built(root)
    from abicache.store import gc

    folder = Path(hits.folder(os.path.realpath(built)))
    old = folder / ("0" * 64)
    old.write_bytes(b"abicache-hit 1 0 0\n")
    os.utime(old, (time.time() - 30 * 86400,) * 2)
    gc.collect_garbage(Cache(built).store)
    assert not old.exists()
    assert any(folder.iterdir())  # a record in use stays


def test_a_record_is_private_to_its_writer(root: Path) -> None:
    built = _built(root)
    for r in Path(hits.folder(os.path.realpath(built))).iterdir():
        assert stat.S_IMODE(r.stat().st_mode) == 0o600
    assert sys.platform != "linux" or os.stat(hits.folder(os.path.realpath(built))).st_uid == os.geteuid()


def test_an_edit_between_the_lookup_and_its_record_is_not_recorded(root: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is written after its lookup: a header edited in between must not be taken
    for the header the lookup found current (the stamp's witnesses vouch for what is recorded)."""
    project, sources = _header_project(root, tmp_path)
    time.sleep(0.1)
    real_write = writer._write

    def edit_then_write(*args: object) -> object:
        (project / "answer.h").write_text("#define ANSWER 8\n")
        time.sleep(0.05)  # settled: only the stamp's verdict tells it from what the lookup saw
        return real_write(*args)

    monkeypatch.setattr(writer, "_write", edit_then_write)
    served, lib = _load(root, sources)
    assert not served and lib.answer() == 7  # type: ignore[attr-defined]  # what that lookup found
    monkeypatch.setattr(writer, "_write", real_write)
    served, lib = _load(root, sources)
    assert not served and lib.answer() == 8  # type: ignore[attr-defined]


def test_a_cache_used_for_several_libraries_records_each_and_one_changed_records_none(root: Path) -> None:
    """One Cache for two libraries: the first call opens it, and the second is recorded too
    (written as the process exits, once its build's witnesses settled and its stamp vouches);
    a Cache with a setting changed by hand is served by no record."""
    need("c++")
    code = ("import json, sys\n"
            "from abicache import Cache, cc\n"
            f"cache = Cache({str(root)!r})\n"
            "CHANGE\n"
            f"libs = [cc.load_library(n, [f'extern \"C\" int answer() {{{{ return {{v}}; }}}}'], cache=cache)"
            " for n, v in (('answer', 7), ('other', 6))]\n"
            "print(json.dumps([type(held[0]).__name__ for held in cc._loaded.values()]))")
    runs = [json.loads(run_py(code.replace("CHANGE", "")).stdout) for _ in range(3)]
    assert runs[0] == ["Artifact", "Artifact"] and runs[-1] == ["Served", "Served"], runs
    changed = run_py(code.replace("CHANGE", "cache.touch_interval = 0"))
    assert json.loads(changed.stdout) == ["Artifact", "Artifact"], changed.stderr


def test_a_cpp_library_is_served_only_with_the_cpp_runtime_it_was_judged_with(root: Path, tmp_path: Path) -> None:
    """A C++ library's requirements name libstdc++'s versions: its record witnesses the
    runtime the process loads. A process that loaded another copy first is judged in full."""
    need("c++")
    from abicache.native.loaded import libstdcxx_path

    system = libstdcxx_path()
    if system is None:
        pytest.skip("no libstdc++ in this process")
    src = '#include <string>\nextern "C" int answer() { return (int)std::to_string(7).size() + 6; }'
    code = ("import ctypes, json, sys\nPRELOAD\n"
            "from abicache import Cache, cc\n"
            f"lib = cc.load_library('cxx', [{src!r}], cache=Cache({str(root)!r}))\n"
            "print(json.dumps([lib.answer(), type(next(iter(cc._loaded.values()))[0]).__name__]))")
    runs = [json.loads(run_py(code.replace("PRELOAD", "")).stdout) for _ in range(3)]
    assert runs[-1] == [7, "Served"], runs
    copy = tmp_path / "libstdc++.so.6"
    copy.write_bytes(Path(system).read_bytes())
    other = run_py(code.replace("PRELOAD", f"ctypes.CDLL({str(copy)!r}, mode=ctypes.RTLD_GLOBAL)"))
    assert json.loads(other.stdout) == [7, "Artifact"], other.stderr


def test_a_forked_child_does_not_count_its_parents_served_hits_again(tmp_path: Path) -> None:
    """Neither the counts nor the hits a served call left to count at exit (hits/__init__.py _count)."""
    tally._pending.clear()
    earlier, cc._served[:] = list(cc._served), []  # this worker's earlier tests' served calls
    entry = str(tmp_path / "v3" / "entries" / "cc.library" / "ab" / "abcd.ef")
    tally.count(str(tmp_path), 1.0, entry)
    cc._served.append((str(tmp_path), 1.0, entry))
    pid = os.fork()
    if pid == 0:
        os._exit(0 if not tally._pending and not cc._served else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert tally._pending[str(tmp_path), "cc.library"][0] == 1 and len(cc._served) == 1
    tally._pending.clear()
    cc._served[:] = earlier


def test_a_working_directory_removed_is_no_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert hits.name(b"call", "/s") is None  # no name, no record: the full lookup decides
