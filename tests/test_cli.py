from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import time
import textwrap
from pathlib import Path

import pytest

from abicache import Cache, cc
from abicache.cli import main
from abicache.env import Facts
from conftest import SRC, need, writer


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "abicache.cli.program", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def cli_json(capsys, *args: str):
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_demo_builds_then_hits(root: Path, capsys) -> None:
    need("c++")
    first = cli_json(capsys, "demo", "--root", str(root))
    assert first["results"] == {"dot([1,2,3],[4,5,6])": 32, "triple(14)": 42}
    assert [a["first_hit"] for a in first["artifacts"]] == [False, False]
    assert [a["second_hit"] for a in first["artifacts"]] == [True, True]
    again = cli_json(capsys, "demo", "--root", str(root))
    assert [a["first_hit"] for a in again["artifacts"]] == [True, True]
    assert "python.abi3 >= 3.10" in again["artifacts"][1]["requirements"]


def test_demo_prints_tables(root: Path) -> None:
    need("c++")
    out = run_cli("demo", "--root", str(root))
    assert out.returncode == 0, out.stderr
    assert "dot([1,2,3], [4,5,6]) = 32" in out.stdout and "hit in" in out.stdout
    assert "built, cached and loaded" in out.stdout
    again = run_cli("demo", "--root", str(root))  # all hits: the title says so
    assert "found in the cache and loaded" in again.stdout and "built, cached" not in again.stdout


def test_ls_show_stats(root: Path, capsys) -> None:
    cache = Cache(root)
    art = cache.get_or_build("t", "thing", {"flags": ["-O2"]}, writer({"a": "1", "b": "1"}))
    rows = cli_json(capsys, "ls", "--root", str(root))
    assert [(r["kind"], r["name"], r["key"]) for r in rows] == [("t", "thing", art.key)]
    shown = cli_json(capsys, "show", art.key[:10], "--root", str(root))
    assert shown[0]["inputs"]["flags"] == ["-O2"]
    stats = cli_json(capsys, "stats", "--root", str(root))
    assert stats["entries"] == 1 and stats["blobs"] == 1  # two identical files, one blob
    assert stats["logical_bytes"] == 2 and stats["stored_bytes"] == 1
    assert main(["ls", "--root", str(root)]) == 0
    assert "thing" in capsys.readouterr().out


def test_show_unknown_key_exits_nonzero(root: Path, capsys) -> None:
    assert main(["show", "deadbeef", "--root", str(root)]) == 2
    assert "no entry has a key starting with 'deadbeef'" in capsys.readouterr().err


def test_explain_names_a_changed_flag_and_a_changed_fact(root: Path, capsys) -> None:
    need("c++")
    src = ['extern "C" int f() { return 1; }']
    cc.build_library("explained", src, cflags=["-O2"], cache=Cache(root))
    cc.build_library("explained", src, cflags=["-O3"], cache=Cache(root))
    doc = cli_json(capsys, "explain", "explained", "--root", str(root))
    assert [d["what"] for d in doc[0]["candidates"][0]["differences"]] == ["flags"]
    assert doc[0]["candidates"][0]["differences"][0] == {"what": "flags", "entry": "-O2", "wanted": "-O3"}
    # A fact: the compiler identity changes (as after a compiler upgrade).
    upgraded = Cache(root, facts=Facts().with_overrides({"compiler.cxx": "gcc version 99.1.0"}))
    cc.build_library("explained", src, cflags=["-O3"], cache=upgraded)
    assert main(["explain", "explained", "--root", str(root)]) == 0
    text = capsys.readouterr().out
    assert "tools.compiler.cxx: gcc version 12" in text or "tools.compiler.cxx: " in text
    assert "-> gcc version 99.1.0" in text


def test_verify_and_gc(root: Path, capsys) -> None:
    cache = Cache(root)
    art = cache.get_or_build("t", "x", {}, writer({"f": b"0" * 100}))
    clean = cli_json(capsys, "verify", "--full", "--root", str(root))
    assert clean["clean"] is True and clean["bytes_hashed"] == 100  # each stored byte read once (it read twice)
    art.file().chmod(0o644)
    art.file().write_bytes(b"1" * 100)
    art.file().chmod(0o444)
    assert main(["verify", "--full", "--root", str(root), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["clean"] is False and all("sha256" in p["reason"] for p in report["problems"])
    assert sorted(p["where"].split("/")[0] for p in report["problems"]) == ["blobs", "t"]  # the blob, its entry
    cache.get_or_build("t", "y", {}, writer({"f": b"2" * 100}))
    gc = cli_json(capsys, "gc", "--max-size", "0", "--root", str(root))
    assert gc["entries_removed"] == 1 and gc["bytes_after"] == 0


def test_env_lists_facts_and_settings(capsys) -> None:
    doc = cli_json(capsys, "env")
    assert doc["facts"]["python.implementation"] == "cpython"
    assert "ABICACHE_DIR" in doc["settings"]


def test_usage_errors_exit_2_with_help() -> None:
    out = run_cli("ls", "--bogus")
    assert out.returncode == 2 and "unrecognized arguments: --bogus" in out.stderr
    assert "abicache --help" in out.stderr
    out = run_cli("gc", "--max-size", "lots")
    assert out.returncode == 2 and "'lots' is not a size" in out.stderr


def test_bad_settings_and_roots_are_clear_errors(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "abicache.cli.program", "ls"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_VERIFY_AGE": "soon"})
    assert out.returncode == 2 and "ABICACHE_VERIFY_AGE='soon' is not a number of seconds" in out.stderr
    assert "Traceback" not in out.stderr
    open_root = tmp_path / "open"
    open_root.mkdir()
    open_root.chmod(0o777)
    out = run_cli("ls", "--root", str(open_root))
    assert out.returncode == 2 and "is writable by others" in out.stderr and "Traceback" not in out.stderr


def test_audit_of_a_non_binary_says_so_and_fails(tmp_path: Path) -> None:
    """It said "no requirements: loads anywhere" of README.md or an empty file."""
    for content in ("# a text file\n", ""):
        path = tmp_path / "file.txt"
        path.write_text(content)
        done = run_cli("audit", str(path))
        assert done.returncode == 2, done.stdout + done.stderr
        assert "not a binary abicache reads" in done.stdout and "loads anywhere" not in done.stdout


def test_assuming_an_unknown_fact_is_an_error_listing_the_facts() -> None:
    done = run_cli("audit", "--assume", "gpu.archs=sm_90", sys.executable)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "no fact is named 'gpu.archs'" in done.stderr and "gpu.arch" in done.stderr


def test_an_unknown_tool_name_is_an_error_not_a_none_in_the_key(cache: Cache) -> None:
    import pytest

    from abicache.errors import UsageError

    with pytest.raises(UsageError, match="tools: no fact is named 'compiler.cpp'.*compiler.cxx"):
        cache.get_or_build("t", "x", {"sources": {"a": "b"}, "tools": ["compiler.cpp"]}, writer({"f": "x"}))


def test_stub_with_a_relative_out_folder(tmp_path: Path) -> None:
    """README: `abicache stub ... --out stub/` failed: the compiler ran inside the folder."""
    done = subprocess.run([sys.executable, "-m", "abicache", "stub", "cudart", "--functions", "cudaMalloc",
                           "--out", "stub/", "--json"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    if done.returncode != 0 and "no cuda_runtime_api.h found" in done.stderr:
        import pytest

        pytest.skip("no CUDA runtime headers here")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "stub" / "libabicache_cudart_stub.so").is_file()


def test_explain_says_hit_for_an_entry_that_hits_and_a_miss_exits_1(root: Path, capsys) -> None:
    """It printed "miss" for an entry that had just hit, and exited 0 on a miss."""
    cache = Cache(root)
    cache.get_or_build("t.data", "ok", {"sources": {"a": "1"}}, writer({"f.txt": "x"}))
    assert cache.get_or_build("t.data", "ok", {"sources": {"a": "1"}}, writer({"f.txt": "x"})).hit
    assert main(["explain", "ok", "--root", str(root)]) == 0
    assert "t.data 'ok': hit" in capsys.readouterr().out
    elsewhere = Cache(root, facts=Facts().with_overrides({"platform.machine": "riscv64"}))
    elsewhere.get_or_build("t.data", "riscv", {"sources": {"a": "2"}}, writer({"f.txt": "y"}),
                           requires=["platform.machine in riscv64"])
    code = main(["explain", "riscv", "--root", str(root)])
    out = capsys.readouterr().out
    assert code == 1 and "t.data 'riscv': miss" in out and "platform.machine" in out, out


def test_ls_of_an_unknown_kind_lists_the_kinds(root: Path, capsys) -> None:
    Cache(root).get_or_build("mine.thing", "x", {"flags": ["-O2"]}, writer({"a": "1"}))
    assert main(["ls", "--kind", "torch.extension", "--root", str(root)]) == 2
    said = capsys.readouterr().err
    assert "no kind 'torch.extension'" in said and "mine.thing" in said and "torch.pybind" in said
    assert main(["ls", "--kind", "cuda.ptx", "--root", str(root)]) == 0  # a kind abicache writes: none yet


def test_every_kind_the_frontends_write_is_listed() -> None:
    """FRONTEND_KINDS is what `ls --kind` accepts before any entry exists: read the source for the
    kinds it names, so a new frontend cannot be forgotten."""
    import re

    from abicache.cli.commands import FRONTEND_KINDS

    from abicache.cuda.compile import OUTPUTS

    written = {f"cuda.{output}" for output in OUTPUTS}
    for path in (SRC / "abicache").rglob("*.py"):
        text = path.read_text()
        written |= set(re.findall(r'(?:Plan|get_or_build)\("([a-z_.]+)"', text))
        written |= set(re.findall(r'^(?:FILE_)?KIND = "([a-z_.]+)"', text, re.M))
        if path.name == "torch.py":
            written |= {f"torch.{k}" for k in re.findall(r'"(pybind|classic|executable)"', text)}
    assert written <= set(FRONTEND_KINDS), written - set(FRONTEND_KINDS)
    assert {"triton", "triton.file", "cc.library", "torch.stable"} <= written  # the patterns still find them


def test_the_package_namespace_is_clean() -> None:
    import abicache

    assert "annotations" not in dir(abicache)


def test_a_bad_remote_setting_leaves_local_hits_working_and_env_flags_it(tmp_path: Path) -> None:
    need("c++")
    code = ("import abicache\nlib = abicache.cc.load_library('add', ['extern \"C\" int add(int a, int b) "
            "{ return a + b; }'])\nprint(lib.add(2, 3))\n")
    env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(tmp_path / "s"), "ABICACHE_REMOTE": "ftp://x"}
    for _ in range(2):  # a build, then a hit: neither is stopped by the setting
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "5", out.stderr
        assert out.stderr.count("ABICACHE_REMOTE is ignored, local cache only") == 1
        assert out.stderr.startswith("abicache: ") and "AbicacheWarning" not in out.stderr  # its own format
    shown = subprocess.run([sys.executable, "-m", "abicache.cli.program", "env", "--json"], capture_output=True,
                           text=True, env={**env, "ABICACHE_LOCK_TIMEOUT": "forever"}, timeout=120)
    assert shown.returncode == 1 and "AbicacheWarning" not in shown.stderr
    problems = json.loads(shown.stdout)["problems"]
    assert set(problems) == {"ABICACHE_REMOTE", "ABICACHE_LOCK_TIMEOUT"} and "unknown scheme 'ftp'" in \
        problems["ABICACHE_REMOTE"]


def test_verify_and_gc_leave_a_running_build_alone(root: Path, capsys) -> None:
    """A stage in tmp/ whose builder is alive is 'in progress', not a leftover, and gc keeps it
    however old it is; a dead builder's stage is a leftover that gc removes."""
    import time as clock

    cache = Cache(root)
    cache.get_or_build("t", "x", {}, writer({"f": b"0"}))
    tmp = cache.store.layout.tmp
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live, dead = tmp / f"{running.pid}-abc", tmp / "999999999-def"
        for stage in (live, dead):
            stage.mkdir()
            old = clock.time() - 7 * 86400
            os.utime(stage, (old, old))
        report = cli_json(capsys, "verify", "--root", str(root))
        assert (report["building"], report["leftovers"]) == (1, 1)
        cli_json(capsys, "gc", "--root", str(root))
        assert live.exists() and not dead.exists()
    finally:
        running.kill()
        running.wait()


def test_ls_fits_an_80_column_terminal(root: Path, monkeypatch) -> None:
    """Platform floors are counted, not listed; the variant column goes; rows do not wrap."""
    import io

    from rich.console import Console

    from abicache.cli import render

    need("c++")
    cc.build_library("add", ['extern "C" int add(int a, int b) { return a + b; }'], cache=Cache(root))
    screen = io.StringIO()
    monkeypatch.setattr(render, "_console", lambda: Console(file=screen, width=80, soft_wrap=False))
    assert main(["ls", "--root", str(root)]) == 0
    lines = screen.getvalue().splitlines()
    row = next(line for line in lines if "cc.library" in line)
    assert "variant" not in screen.getvalue() and re.search(r"platform \(\d\)", row)
    assert all(len(line) <= 80 for line in lines) and "KiB" in row and "ago" in row  # one line per entry


def test_env_flags_a_bad_observer_or_check_setting(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(tmp_path / "s"),
           "ABICACHE_OBSERVE": "maybe", "ABICACHE_CHECK": "often"}
    shown = subprocess.run([sys.executable, "-m", "abicache.cli.program", "env", "--json"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert shown.returncode == 1
    problems = json.loads(shown.stdout)["problems"]
    assert set(problems) == {"ABICACHE_OBSERVE", "ABICACHE_CHECK"} and "whole number" in problems["ABICACHE_CHECK"]


def test_a_command_whose_extra_is_not_installed_names_the_pip_command(tmp_path: Path) -> None:
    """`abicache keys generate` after `pip install abicache` (no [remote] extra): one line
    naming the extra, exit 2, no ModuleNotFoundError traceback."""
    code = textwrap.dedent("""
        import sys
        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "cryptography":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Missing())
        from abicache.cli.program import main
        sys.exit(main(sys.argv[1:]))
    """)
    done = subprocess.run([sys.executable, "-c", code, "keys", "generate", str(tmp_path / "k")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "pip install 'abicache[remote]'" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_bad_remote_setting_is_the_remote_commands_one_error(tmp_path: Path) -> None:
    """`abicache remote` with ABICACHE_REMOTE=ftp://x said "ignored", then "set ABICACHE_REMOTE"."""
    done = subprocess.run([sys.executable, "-m", "abicache", "remote", "--root", str(tmp_path)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_REMOTE": "ftp://x"},
                          timeout=60)
    assert done.returncode == 2 and done.stderr.count("abicache") == 1, done.stderr
    assert "unknown scheme 'ftp'" in done.stderr and "ignored" not in done.stderr


COUNTING = textwrap.dedent("""
    import sys
    from abicache import Cache
    cache = Cache(sys.argv[1], remote=False)
    for n in range(int(sys.argv[2])):
        cache.get_or_build("test", f"k{n % 3}", {"extra": {"n": n % 3}}, lambda out: (out / "f").write_text("x"))
    try:
        cache.get_or_build("test", "broken", {"extra": {}}, lambda out: 1 / 0)
    except ZeroDivisionError:
        pass
""")


def test_stats_count_hits_misses_and_errors_of_concurrent_processes(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """4 processes at once, 10 lookups of 3 keys each and one failing build: 3 misses in all
    (one build per key, whoever won), 37 hits, 4 errors; --zero starts again; a hit writes nothing."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [subprocess.Popen([sys.executable, "-c", COUNTING, str(tmp_path / "s"), "10"], env=env) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert main(["stats", "--root", str(tmp_path / "s"), "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert (counts["hits_local"], counts["misses"], counts["builds"], counts["errors"]) == (37, 7, 3, 4), counts
    assert counts["hit_rate"] == round(37 / 44, 4)
    before = time.time()
    assert main(["stats", "--root", str(tmp_path / "s"), "--zero"]) == 0
    capsys.readouterr()
    assert main(["stats", "--root", str(tmp_path / "s"), "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts["misses"] == 0 and before - 1 <= counts["zeroed_at"] == counts["since"] <= time.time() + 1
    assert main(["stats", "--root", str(tmp_path / "s")]) == 0
    assert "zeroed " + time.strftime("%Y-%m-%d", time.localtime(counts["zeroed_at"])) in capsys.readouterr().out


FORKING = textwrap.dedent("""
    import os, sys
    from abicache import Cache
    cache = Cache(sys.argv[1], remote=False)
    for _ in range(3):  # a build, then two hits counted in memory
        cache.get_or_build("test", "k", {"extra": {}}, lambda out: (out / "f").write_text("x"))
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a child that ends normally: its exit handlers run
    assert os.waitpid(pid, 0)[1] == 0
""")


def test_a_forked_child_does_not_write_its_parents_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The counts a process has not written yet are its own to write at its exit: a child
    forked then (and ending normally) wrote them too, and every hit counted twice."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", FORKING, str(tmp_path / "s")], env=env, check=True, timeout=120)
    assert main(["stats", "--root", str(tmp_path / "s"), "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert (counts["hits_local"], counts["misses"], counts["builds"]) == (2, 1, 1), counts


def test_ls_at_80_columns_keeps_keys_whole_and_hides_the_engines_entries(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from abicache.cli import render

    root = tmp_path / "store"
    cache = Cache(root)
    for name in ("a-rather-long-library-name-one", "a-rather-long-library-name-two"):
        cc.build_library(name, ['extern "C" int f() { return 1; }', 'extern "C" int g() { return 2; }'], cache=cache)
    monkeypatch.setattr(render, "_console", lambda: Console(width=80, soft_wrap=False))
    assert main(["ls", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    keys = [m.key[:12] for _, m in __import__("abicache.cli.commands", fromlist=["x"]).manifests_of(cache)
            if m.kind == "cc.library"]
    assert all(k in out for k in keys), out  # each on one line, whole: copyable
    assert "cc.object" not in out and "--all lists them" in out
    assert main(["ls", "--root", str(root), "--all"]) == 0
    assert "cc.object" in capsys.readouterr().out


def test_a_long_listing_is_a_line_an_entry_and_matches_the_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Above render.PLAIN_ROWS rows `ls` prints aligned plain text (rich takes 0.4 ms a row):
    one line per entry, its short key whole; --json lists the same entries, with every field."""
    from abicache.cli import render

    root = tmp_path / "store"
    cache = Cache(root, remote=False)
    count = render.PLAIN_ROWS + 20
    made = [cache.get_or_build("t", f"entry-{n:04d}", {"extra": {"n": n}}, lambda out: (out / "f").write_bytes(b"x"))
            for n in range(count)]
    assert main(["ls", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{count} entries in {root}" and lines[1].split()[:3] == ["kind", "name", "key"]
    rows = lines[3:]
    assert len(rows) == count and all(row.split()[2] == art.key[:12] for row, art in zip(rows, made)), rows[:3]
    assert main(["ls", "--root", str(root), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [e["key"] for e in listed] == [a.key for a in made]
    first = listed[0]
    assert first["path"] == str(made[0].path) and first["files"] == ["f"] and first["size"] == 1
    assert set(first) == {"kind", "name", "key", "variant", "path", "size", "files", "requirements", "created",
                          "last_used"}


def test_explain_last_says_why_each_recent_miss_missed(root: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Every miss is noted (log/misses.jsonl, two files of bounded size); `explain --last N`
    compares each with the entries of its name that were there then, not those built since."""
    from abicache.core import explain

    cache = Cache(root)
    code = 'extern "C" int f() { return 1; }'
    cc.build_library("m", [code], cflags=["-DA=1"], cache=cache)
    cc.build_library("m", [code], cflags=["-DA=2"], cache=cache)
    cc.build_library("m", [code], cflags=["-DA=2"], cache=cache)  # a hit: not noted
    assert main(["explain", "--last", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count(" missed (key ") == 2 and "flags: -DA=1 -> -DA=2" in out, out
    assert "no other entry" in out.split(" missed (key ")[1]  # the first miss: nothing was there yet
    assert main(["explain", "--last", "1", "--json", "--root", str(root)]) == 0
    (last,) = json.loads(capsys.readouterr().out)
    assert [d["what"] for d in last["candidates"][0]["differences"]] == ["flags"] and not last["hit"]
    assert main(["stats", "--json", "--root", str(root)]) == 0
    assert [m["name"] for m in json.loads(capsys.readouterr().out)["last_misses"]] == ["m", "m"]
    assert main(["gc", "--all", "--root", str(root)]) == 0  # the neighbours go: the second miss had one
    capsys.readouterr()
    assert main(["explain", "--last", "1", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "1 other entry with this kind and name was in the cache when it missed; none is now" in out, out
    assert "no other entry" not in out
    from abicache.store import logs

    monkeypatch.setattr(logs, "MAX_BYTES", 2000)
    for n in range(40):
        explain.record_miss(cache.store, "t", f"n{n}", "ab" * 32, {"flags": ["-x" * 50]})
    logs = sorted((root / "v3" / "log").glob("misses*.jsonl"))
    assert len(logs) == 2 and all(p.stat().st_size < 2000 + 400 for p in logs)
    assert [m["name"] for m in explain.last_misses(cache.store, 3)] == ["n37", "n38", "n39"]
    assert main(["explain", "--root", str(root)]) == 2  # neither a name nor --last


def test_config_files_and_their_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The environment, then the store's abicache.toml, then the user's config.toml, then the
    default; `config set` refuses a value its setting would refuse (keeping the old one);
    an unknown key is flagged by `config list` (exit 1) and `abicache env`."""
    from abicache.settings import config, settings_file

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("ABICACHE_DIR", str(tmp_path / "store"))
    monkeypatch.delenv("ABICACHE_MAX_SIZE", raising=False)
    settings_file.forget()

    def get() -> dict:
        capsys.readouterr()  # what the commands before said
        assert main(["config", "get", "max_size", "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    assert get()["from"] == "default" and config.size("ABICACHE_MAX_SIZE") is None
    assert main(["config", "set", "max-size", "10G"]) == 0
    assert get() == {"name": "ABICACHE_MAX_SIZE", "value": "10G", "from": str(settings_file.user_file())}
    assert config.size("ABICACHE_MAX_SIZE") == 10 << 30
    assert main(["config", "set", "ABICACHE_MAX_SIZE", "2G", "--store"]) == 0
    assert get()["value"] == "2G" and get()["from"] == str(tmp_path / "store" / "abicache.toml")
    assert main(["config", "set", "--store", "max_size", "3G"]) == 0  # the option first, as users type it
    capsys.readouterr()
    assert main(["config", "--json", "get", "max_size"]) == 0 and json.loads(capsys.readouterr().out)["value"] == "3G"
    assert main(["config", "set", "max_size", "2G", "--store"]) == 0
    monkeypatch.setenv("ABICACHE_MAX_SIZE", "5G")
    assert get()["from"] == "environment" and config.size("ABICACHE_MAX_SIZE") == 5 << 30
    monkeypatch.delenv("ABICACHE_MAX_SIZE")
    assert main(["config", "set", "max_size", "banana", "--store"]) == 2
    assert "not a size" in capsys.readouterr().err and get()["value"] == "2G"  # the old value kept
    assert main(["config", "unset", "max_size", "--store"]) == 0
    capsys.readouterr()
    assert get()["value"] == "10G"
    settings_file.user_file().write_text(settings_file.user_file().read_text() + 'maxsize = "1G"\n')
    settings_file.forget()
    assert main(["config", "list"]) == 1
    assert "maxsize" in capsys.readouterr().out
    assert main(["config", "get", "nope"]) == 2 and "not a setting" in capsys.readouterr().err
    settings_file.forget()


def test_every_command_has_a_description_and_an_example() -> None:
    import argparse

    from abicache.cli.program import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    lacking = [name for name, command in sub.choices.items()
               if not command.description or "example" not in (command.epilog or "")]
    assert lacking == []


def test_a_command_alone_parses_as_among_all() -> None:
    """main() makes only the parser of the command it runs: COMMANDS names every command,
    and each one's parser made alone is the one made among all (its help, its arguments)."""
    import argparse

    from abicache.cli.program import COMMANDS, build_parser

    def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    every = commands(build_parser())
    assert tuple(every) == COMMANDS
    for name in COMMANDS:
        alone = commands(build_parser(name))
        assert list(alone) == [name]
        assert alone[name].format_help() == every[name].format_help()


def test_an_empty_store_says_so_and_one_entry_is_one_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No empty tables on an empty store, and no "1 entries"."""
    root = tmp_path / "s"
    assert main(["ls", "--root", str(root)]) == 0
    assert capsys.readouterr().out.strip() == f"no entries in {root} (a build or a hit there makes one)"
    assert main(["stats", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "0 entries" in out and "by kind" not in out
    Cache(root).get_or_build("t", "k", {"extra": {}}, writer({"f": b"x"}))
    assert main(["ls", "--root", str(root)]) == 0
    assert re.match(r"1 entry in\s", capsys.readouterr().out)  # the title wraps before a long path
    assert main(["stats", "--root", str(root)]) == 0
    assert ": 1 entry, 1 blob," in capsys.readouterr().out
    assert main(["verify", "--root", str(root)]) == 0
    assert "verified 1 entry, 0 blobs," in capsys.readouterr().out  # quick: blobs are hashed by --full
    assert main(["verify", "--full", "--root", str(root)]) == 0
    assert "verified 1 entry, 1 blob," in capsys.readouterr().out
