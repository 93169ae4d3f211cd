"""A hit is what a fresh build here would make: everything that steers a build
is an input (the compiler command's words, the compiler's environment, system
headers, headers looked for and not found, files the driver, assembler and
linker read, symbolic links on the way) — in a new process and in the same one.

Each test builds with the real compiler, changes one thing a fresh build would
see, and asks again: the answer must be the fresh build's.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from abicache import Cache, cc
from abicache.errors import AbicacheWarning
from conftest import SRC, need

#: builds and calls f() in a fresh process; prints {"value", "origin"}
CHILD = textwrap.dedent("""
    import ctypes, json, sys, warnings
    from pathlib import Path
    from abicache import Cache, cc
    spec = json.loads(sys.argv[1])
    sources = [Path(s) if spec.get("paths") else s for s in spec["sources"]]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        lang = {"lang": spec["lang"]} if spec.get("lang") else {}
        art = cc.build_library(spec["name"], sources, cflags=spec.get("cflags", []), ldflags=spec.get("ldflags", []),
                               cache=Cache(spec["root"]), **lang)
    lib = ctypes.CDLL(str(art.file()))
    print(json.dumps({"value": lib.f(), "origin": art.origin, "warnings": [str(w.message) for w in seen]}))
""")


def fresh(root: Path, sources: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
          drop: tuple[str, ...] = (), name: str = "x", **spec: object) -> dict:
    """One build-and-call in a new process (sources: file paths, relative to cwd)."""
    full = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    for variable in drop:
        full.pop(variable, None)
    arg = json.dumps({"root": str(root), "name": name, "sources": sources, "paths": True, **spec})
    done = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True, env=full,
                          cwd=cwd, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def write(path: Path, text: str) -> Path:
    """Write a file as an editor would: a new inode, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp~")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def header(value: int) -> str:
    return f"#pragma once\n#define VALUE {value}\n"


UNIT = '#include "v.h"\nextern "C" int f() { return VALUE; }\n'


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    p = tmp_path / "proj"
    (p / "src").mkdir(parents=True)
    write(p / "src" / "x.cpp", UNIT)
    return p


# ---- the compiler command: every word of $CXX, a wrapper resolved ----------------------------

ABI = '#include <string>\nextern "C" int f() { return _GLIBCXX_USE_CXX11_ABI; }\n'


def test_words_after_the_compiler_in_cxx_are_in_the_key(proj: Path, tmp_path: Path) -> None:
    write(proj / "src" / "x.cpp", ABI)
    old_abi = fresh(tmp_path / "store", ["src/x.cpp"], cwd=proj, env={"CXX": "c++ -D_GLIBCXX_USE_CXX11_ABI=0"})
    assert old_abi["value"] == 0
    plain = fresh(tmp_path / "store", ["src/x.cpp"], cwd=proj, drop=("CXX",))
    assert (plain["value"], plain["origin"]) == (1, "built")
    again = fresh(tmp_path / "store", ["src/x.cpp"], cwd=proj, env={"CXX": "c++ -D_GLIBCXX_USE_CXX11_ABI=0"})
    assert (again["value"], again["origin"]) == (0, "local")


WHICH = 'extern "C" int f() {\n#ifdef __clang__\n return 2;\n#else\n return 1;\n#endif\n}\n'


def test_the_compiler_behind_a_wrapper_is_the_one_identified(proj: Path, tmp_path: Path) -> None:
    need("ccache")
    clang = need("clang++")
    write(proj / "src" / "x.cpp", WHICH)
    env = {"CCACHE_DIR": str(tmp_path / "ccache")}
    gnu = fresh(tmp_path / "store", ["src/x.cpp"], cwd=proj, env={**env, "CXX": f"ccache {need('g++')}"})
    llvm = fresh(tmp_path / "store", ["src/x.cpp"], cwd=proj, env={**env, "CXX": f"ccache {clang}"})
    assert (gnu["value"], llvm["value"], llvm["origin"]) == (1, 2, "built")


def test_cxx_changed_in_one_process_rebuilds(proj: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(proj / "src" / "x.cpp", ABI)
    monkeypatch.chdir(proj)
    cache = Cache(tmp_path / "store")
    monkeypatch.setenv("CXX", "c++ -D_GLIBCXX_USE_CXX11_ABI=0")
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 0
    monkeypatch.delenv("CXX")
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 1


# ---- the compiler's environment ------------------------------------------------------------

@pytest.mark.parametrize("variable", ["CPATH", "CPLUS_INCLUDE_PATH"])
def test_a_header_found_through_an_include_variable(variable: str, proj: Path, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    write(one / "v.h", header(1))
    write(two / "v.h", header(2))
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=proj, env={variable: str(one)})["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=proj, env={variable: str(two)})["value"] == 2  # another folder
    write(one / "v.h", header(3))
    assert fresh(store, ["src/x.cpp"], cwd=proj, env={variable: str(one)})["value"] == 3  # an edit there
    assert fresh(store, ["src/x.cpp"], cwd=proj, env={variable: str(one)})["origin"] == "local"


def test_cpath_changed_in_one_process_rebuilds(proj: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    write(one / "v.h", header(1))
    write(two / "v.h", header(2))
    monkeypatch.chdir(proj)
    cache = Cache(tmp_path / "store")
    monkeypatch.setenv("CPATH", str(one))
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 1
    monkeypatch.setenv("CPATH", str(two))
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 2


def test_c_include_path_steers_a_c_source(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    write(proj / "x.c", '#include "v.h"\nint f(void) { return VALUE; }\n')
    one, two = tmp_path / "one", tmp_path / "two"
    write(one / "v.h", header(1))
    write(two / "v.h", header(2))
    store = tmp_path / "store"
    assert fresh(store, ["x.c"], cwd=proj, env={"C_INCLUDE_PATH": str(one)})["value"] == 1
    assert fresh(store, ["x.c"], cwd=proj, env={"C_INCLUDE_PATH": str(two)})["value"] == 2


def test_library_path_steers_the_link(proj: Path, tmp_path: Path) -> None:
    """-lvalue found through LIBRARY_PATH: another folder's archive is another build."""
    for value in (1, 2):
        folder = tmp_path / f"lib{value}"
        folder.mkdir()
        obj = folder / "v.o"
        subprocess.run(["cc", "-fPIC", "-c", "-x", "c", "-", "-o", str(obj)], check=True,
                       input=f"int value(void) {{ return {value}; }}\n", text=True)
        subprocess.run(["ar", "rcs", str(folder / "libvalue.a"), str(obj)], check=True)
    write(proj / "src" / "x.cpp", 'extern "C" int value();\nextern "C" int f() { return value(); }\n')
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=proj, env={"LIBRARY_PATH": str(tmp_path / "lib1")},
                 ldflags=["-lvalue"])["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=proj, env={"LIBRARY_PATH": str(tmp_path / "lib2")},
                 ldflags=["-lvalue"])["value"] == 2


def test_source_date_epoch_steers_date(proj: Path, tmp_path: Path) -> None:
    write(proj / "src" / "x.cpp", 'extern "C" int f() { return __DATE__[10] - \'0\'; }\n')  # the year's last digit
    store = tmp_path / "store"
    y2001 = fresh(store, ["src/x.cpp"], cwd=proj, env={"SOURCE_DATE_EPOCH": "1000000000"})
    y2009 = fresh(store, ["src/x.cpp"], cwd=proj, env={"SOURCE_DATE_EPOCH": "1234567890"})
    assert (y2001["value"], y2009["value"]) == (1, 9)


def test_one_process_with_cpath_does_not_hide_that_folder_from_later_ones(proj: Path, tmp_path: Path) -> None:
    """The search list was memoized per compiler binary: a folder once on CPATH
    stayed 'the compiler's' for every later user of the store, even with -I."""
    inc = tmp_path / "inc"
    write(inc / "v.h", header(1))
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=proj, env={"CPATH": str(inc)})["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=[f"-I{inc}"])["value"] == 1
    write(inc / "v.h", header(2))
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=[f"-I{inc}"])["value"] == 2


# ---- system headers ---------------------------------------------------------------------

def test_a_header_in_an_isystem_folder_is_tracked(proj: Path, tmp_path: Path) -> None:
    dev = tmp_path / "usr-include"  # a -dev package's headers
    write(dev / "v.h", header(1))
    write(proj / "src" / "x.cpp", UNIT.replace('"v.h"', "<v.h>"))
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-isystem", str(dev)])["value"] == 1
    write(dev / "v.h", header(2))  # the package upgraded
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-isystem", str(dev)])["value"] == 2


def test_a_header_the_compiler_searches_through_its_specs_is_tracked(proj: Path, tmp_path: Path) -> None:
    """A folder the driver adds itself (a specs file, as a distribution's compiler
    carries): its headers are system headers, and tracked, as the specs file is."""
    dev = tmp_path / "system"
    write(dev / "v.h", header(1))
    specs = write(tmp_path / "extra.specs", f"*cpp:\n+ -isystem {dev}\n\n")
    write(proj / "src" / "x.cpp", UNIT.replace('"v.h"', "<v.h>"))
    store = tmp_path / "store"
    flags = [f"-specs={specs}"]
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=flags)["value"] == 1
    write(dev / "v.h", header(2))
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=flags)["value"] == 2
    write(specs, f"*cpp:\n+ -isystem {dev} -DVALUE_OFFSET=1\n\n")  # the specs file itself
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=flags)["origin"] == "built"


def test_system_headers_can_be_left_to_the_compiler_by_an_explicit_setting(proj: Path, tmp_path: Path) -> None:
    write(proj / "src" / "x.cpp", '#include <vector>\nextern "C" int f() { return 1; }\n')
    strict = cc.build_library("x", [proj / "src" / "x.cpp"], cache=Cache(tmp_path / "a"))
    assert any("vector" in g.names.split("\n") for g in strict.manifest.system)
    os.environ["ABICACHE_SLOPPINESS"] = "system_headers"
    try:
        sloppy = cc.build_library("x", [proj / "src" / "x.cpp"], cache=Cache(tmp_path / "b"))
    finally:
        del os.environ["ABICACHE_SLOPPINESS"]
    assert not any("vector" in g.names.split("\n") for g in sloppy.manifest.system)


def test_a_package_upgrade_in_a_system_folder_rebuilds(proj: Path, tmp_path: Path) -> None:
    """Files in system folders (/usr, /opt, ...) are one group a folder, witnessed
    by the folder: a package manager renames the new file into place."""
    try:
        folder = Path(tempfile.mkdtemp(prefix="abicache-test-", dir="/opt")) / "include"
    except OSError:
        pytest.skip("/opt is not writable here: no stand-in for a distribution's package")
    try:
        write(folder / "v.h", header(1))
        write(proj / "src" / "x.cpp", UNIT.replace('"v.h"', "<v.h>"))
        store = tmp_path / "store"
        env = {"CPATH": str(folder)}
        first = fresh(store, ["src/x.cpp"], cwd=proj, env=env)
        assert first["value"] == 1
        assert fresh(store, ["src/x.cpp"], cwd=proj, env=env)["origin"] == "local"
        write(folder / "v.h", header(2))  # as dpkg does: a new file renamed over the old one
        assert fresh(store, ["src/x.cpp"], cwd=proj, env=env)["value"] == 2
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)


# ---- headers looked for and not found -------------------------------------------------------

def test_a_header_created_in_an_earlier_include_folder_shadows(proj: Path, tmp_path: Path) -> None:
    first, second = proj / "first", proj / "second"
    first.mkdir()
    write(second / "v.h", header(1))
    store = tmp_path / "store"
    flags = ["-Ifirst", "-Isecond"]
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=flags)["value"] == 1
    write(first / "v.h", header(2))
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=flags)["value"] == 2


def test_a_header_created_beside_the_source_is_picked_up(proj: Path, tmp_path: Path) -> None:
    write(proj / "include" / "v.h", header(1))
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinclude"])["value"] == 1
    write(proj / "src" / "v.h", header(2))  # `#include "v.h"` looks beside the includer first
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinclude"])["value"] == 2


def test_a_folder_created_where_a_header_was_looked_for_first_is_looked_into(proj: Path, tmp_path: Path) -> None:
    """`#include "lib/v.h"` is looked for in first/ (no lib/ there), then found in second/.
    A folder first/lib made later moves first/ only; a header written into it afterwards
    moves first/lib, not first/: the entry must not be taken on first/'s new witness."""
    write(proj / "src" / "x.cpp", UNIT.replace('"v.h"', '"lib/v.h"'))
    first, second = proj / "first", proj / "second"
    first.mkdir()
    write(second / "lib" / "v.h", header(1))
    store = tmp_path / "store"
    flags = ["-Ifirst", "-Isecond"]
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=flags)["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=flags)["origin"] == "local"
    (first / "lib").mkdir()
    time.sleep(0.05)  # past the racy window: first/'s new witness may be remembered
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=flags)["value"] == 1
    write(first / "lib" / "v.h", header(2))
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=flags)["value"] == 2


HAS = ('#if __has_include("opt.h")\n#include "opt.h"\n#else\n#define VALUE 1\n#endif\n'
       'extern "C" int f() { return VALUE; }\n')


def test_a_header_has_include_did_not_find_appears(proj: Path, tmp_path: Path) -> None:
    write(proj / "src" / "x.cpp", HAS)
    (proj / "include").mkdir()
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinclude"])["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinclude"])["origin"] == "local"
    write(proj / "include" / "opt.h", header(2))
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinclude"])["value"] == 2


def test_missing_headers_in_the_same_process(proj: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(proj / "src" / "x.cpp", HAS)
    (proj / "include").mkdir()
    monkeypatch.chdir(proj)
    cache = Cache(tmp_path / "store")
    assert cc.load_library("x", [Path("src/x.cpp")], cflags=["-Iinclude"], cache=cache).f() == 1
    assert cc.load_library("x", [Path("src/x.cpp")], cflags=["-Iinclude"], cache=cache).f() == 1
    write(proj / "include" / "opt.h", header(2))
    assert cc.load_library("x", [Path("src/x.cpp")], cflags=["-Iinclude"], cache=cache).f() == 2


def test_an_unrelated_file_beside_the_headers_is_no_rebuild(proj: Path, tmp_path: Path) -> None:
    write(proj / "src" / "x.cpp", HAS)
    (proj / "include").mkdir()
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinclude"])["origin"] == "built"
    write(proj / "include" / "notes.txt", "an editor's file")
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinclude"])["origin"] == "local"


# ---- files the driver, the assembler and the linker read ------------------------------------

def test_a_response_file_is_an_input_by_its_bytes(proj: Path, tmp_path: Path) -> None:
    write(proj / "inc" / "v.h", header(1))
    rsp = write(proj / "opts.rsp", "-DEXTRA=1 -Iinc\n")
    write(proj / "src" / "x.cpp", '#include "v.h"\nextern "C" int f() { return VALUE + EXTRA; }\n')
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=[f"@{rsp}"])["value"] == 2
    write(rsp, "-DEXTRA=5 -Iinc\n")
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=[f"@{rsp}"])["value"] == 6


def test_incbin_data_is_an_input(proj: Path, tmp_path: Path) -> None:
    data = proj / "data.bin"
    data.write_bytes(b"\x01")
    write(proj / "src" / "x.cpp", f'asm(".section .rodata\\n.global blob\\nblob: .incbin \\"{data}\\"\\n.text");\n'
                                  'extern "C" const unsigned char blob[];\nextern "C" int f() { return blob[0]; }\n')
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=proj)["value"] == 1
    data.write_bytes(b"\x07")
    assert fresh(store, ["src/x.cpp"], cwd=proj)["value"] == 7


def test_a_version_script_is_an_input(proj: Path, tmp_path: Path) -> None:
    write(proj / "src" / "x.cpp", 'extern "C" int f() { return 1; }\nextern "C" int g() { return 2; }\n')
    script = write(proj / "v.map", "{ global: f; g; local: *; };\n")
    store = tmp_path / "store"
    first = fresh(store, ["src/x.cpp"], cwd=proj, ldflags=[f"-Wl,--version-script={script}"])
    write(script, "{ global: f; local: *; };\n")
    second = fresh(store, ["src/x.cpp"], cwd=proj, ldflags=[f"-Wl,--version-script={script}"])
    assert (first["origin"], second["origin"]) == ("built", "built")


# ---- the bytes compiled, not the bytes there later -------------------------------------------

def test_a_header_saved_just_after_the_compiler_exits_is_never_served_stale(proj: Path, tmp_path: Path) -> None:
    """A wrapper tells a second process the moment the compiler exits; that
    process saves the header 0-10 ms later. The next process must never load
    the build of the old bytes as current."""
    many = "".join(f'#include "many/h{i:03}.h"\n' for i in range(300))  # hashing them takes a while
    for i in range(300):
        write(proj / "src" / "many" / f"h{i:03}.h", f"#pragma once\nint h{i:03}();\n")
    write(proj / "src" / "x.cpp", many + '#include "v.h"\n#include <map>\n#include <string>\n'
                                  'extern "C" int f() { return VALUE; }\n')
    signal = tmp_path / "exited"
    wrapper = write(tmp_path / "cxx.sh", f'#!/bin/sh\nc++ "$@"\nrc=$?\n: > "{signal}"\nexit $rc\n')
    wrapper.chmod(0o755)
    saver = textwrap.dedent("""
        import os, sys, time
        signal, target, value, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
        deadline = time.monotonic() + 120
        while not os.path.exists(signal):
            if time.monotonic() > deadline:
                sys.exit(1)  # no compile ran (a stale hit): the test says so
            time.sleep(0.0002)
        time.sleep(delay)
        tmp = target + ".tmp~"
        open(tmp, "w").write("#pragma once\\n#define VALUE " + value + "\\n")
        os.replace(tmp, target)
    """)
    store = tmp_path / "store"
    stale = 0
    rng = random.Random(27)
    for trial in range(20):
        write(proj / "src" / "v.h", header(100 + 2 * trial))
        signal.unlink(missing_ok=True)
        newer = str(101 + 2 * trial)
        saving = subprocess.Popen([sys.executable, "-c", saver, str(signal), str(proj / "src" / "v.h"), newer,
                                   str(rng.uniform(0, 0.010))])
        try:
            first = fresh(store, ["src/x.cpp"], cwd=proj, env={"CXX": str(wrapper)})
            assert first["origin"] == "built", "an edited header must be compiled"
            assert saving.wait(timeout=60) == 0
        finally:
            saving.kill()
        after = fresh(store, ["src/x.cpp"], cwd=proj, env={"CXX": str(wrapper)})
        stale += after["value"] != int(newer)
    assert stale == 0


# ---- symbolic links and '..' ------------------------------------------------------------

def test_a_retargeted_include_link_in_the_same_process(proj: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    write(proj / "v1" / "v.h", header(1))
    write(proj / "v2" / "v.h", header(2))
    os.symlink("v1", proj / "inc")
    monkeypatch.chdir(proj)
    cache = Cache(tmp_path / "store")

    def load() -> int:
        return cc.load_library("x", [Path("src/x.cpp")], cflags=["-Iinc"], cache=cache).f()

    assert load() == 1
    time.sleep(0.05)  # past the racy window: the next call arms its watch on what it checked
    assert load() == 1
    os.symlink("v2", proj / "inc.new")
    os.replace(proj / "inc.new", proj / "inc")
    assert load() == 2
    time.sleep(0.05)
    assert load() == 2
    write(proj / "v2" / "v.h", header(3))  # an edit reached through the new target
    assert load() == 3


def test_dotdot_through_a_linked_folder_records_the_file_the_kernel_opens(proj: Path, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere" / "real"
    write(real / "inc" / "a.h", '#include "../common/c.h"\n')
    write(real / "common" / "c.h", header(1))
    write(proj / "common" / "c.h", header(9))  # what collapsing '..' on the string would name
    os.symlink(real / "inc", proj / "inc")
    write(proj / "src" / "x.cpp", '#include "a.h"\nextern "C" int f() { return VALUE; }\n')
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinc"])["value"] == 1
    write(proj / "common" / "c.h", header(8))  # not an input
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinc"])["origin"] == "local"
    write(real / "common" / "c.h", header(2))  # the input
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinc"])["value"] == 2


# ---- what cannot be known is not cached -------------------------------------------------------

def test_a_compiler_without_a_depfile_is_not_trusted_as_reading_nothing(proj: Path, tmp_path: Path) -> None:
    write(proj / "inc" / "v.h", header(1))
    wrapper = write(tmp_path / "nodeps.sh", textwrap.dedent("""\
        #!/bin/sh
        # a compiler that writes no dependency file: -MD -MF FILE are dropped
        args=""
        skip=0
        for a in "$@"; do
          if [ $skip = 1 ]; then skip=0; continue; fi
          case "$a" in -MD) ;; -MF) skip=1 ;; *) args="$args '$a'" ;; esac
        done
        eval exec c++ $args
        """))
    wrapper.chmod(0o755)
    env = {"CXX": str(wrapper), "ABICACHE_OBSERVE": "0"}  # and it cannot be watched
    store = tmp_path / "store"
    first = fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinc"], env=env)
    assert first["value"] == 1 and any("not cached" in w for w in first["warnings"])
    write(proj / "inc" / "v.h", header(2))
    second = fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinc"], env=env)
    assert (second["value"], second["origin"]) == (2, "built")


def test_without_the_observer_the_depfile_is_recorded(proj: Path, tmp_path: Path) -> None:
    write(proj / "inc" / "v.h", header(1))
    store = tmp_path / "store"
    env = {"ABICACHE_OBSERVE": "0"}
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinc"], env=env)["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinc"], env=env)["origin"] == "local"
    write(proj / "inc" / "v.h", header(2))
    assert fresh(store, ["src/x.cpp"], cwd=proj, cflags=["-Iinc"], env=env)["value"] == 2


# ---- build lines as the user's own tools would run them ------------------------------------

def test_a_c_source_is_compiled_as_c(tmp_path: Path) -> None:
    lib = cc.load_library("answer", {"x.c": "int answer(void) { return 42; }\n"}, cache=Cache(tmp_path / "s"))
    assert lib.answer() == 42  # C linkage: not _Z6answerv


def test_c_and_cpp_units_in_one_library(tmp_path: Path) -> None:
    lib = cc.load_library("mixed", {"a.c": "int from_c(void) { return sizeof('a'); }\n",  # 4 in C, 1 in C++
                                    "b.cpp": 'extern "C" int from_c(void);\nextern "C" int f() { return from_c(); }\n'},
                          cache=Cache(tmp_path / "s"))
    assert lib.f() == 4


def test_an_explicit_lang_still_wins(tmp_path: Path) -> None:
    lib = cc.load_library("cxx", {"x.c": 'extern "C" int f() { return sizeof(\'a\'); }\n'}, lang="c++",
                          cache=Cache(tmp_path / "s"))
    assert lib.f() == 1


def test_the_observer_sees_what_the_driver_did(tmp_path: Path) -> None:
    """The observer library on its own: a compile's programs, headers read and looked for."""
    from abicache.engine import observe

    library = observe.library(tmp_path / "tools")
    if library is None:
        pytest.skip("the observer could not be built here (no C compiler, or no LD_PRELOAD)")
    src = write(tmp_path / "a.cpp", '#if __has_include("nothere.h")\n#endif\n#include "v.h"\nint x = VALUE;\n')
    write(tmp_path / "v.h", header(1))
    with observe.watching(library, str(tmp_path)) as session:
        assert session is not None
        env = {**os.environ, **session.env}
        subprocess.run(["c++", "-c", str(src), "-o", str(tmp_path / "a.o")], env=env, pass_fds=session.fds,
                       check=True)
        seen = session.result()
    assert seen.complete
    assert str(tmp_path / "v.h") in seen.read
    assert str(tmp_path / "nothere.h") in seen.missing
    assert any(os.path.basename(p).startswith("cc1plus") for p in seen.programs)
    assert "CPATH" in seen.env


# ---- every documented variable is in the key (and nvcc's only where nvcc runs) ---------------

def _key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> str:
    from abicache.engine import steer

    for name in steer.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plan = cc.library_plan("x", ['extern "C" int f() { return 1; }'])
    return Cache(tmp_path / "s").key_for(plan.kind, plan.name, plan.inputs)[0]


def _steering_variables() -> list[str]:
    from abicache.engine import steer

    return list(steer.ENVIRONMENT)


@pytest.mark.parametrize("variable", _steering_variables())
def test_each_steering_variable_is_in_the_key_where_it_steers(variable: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from abicache.engine import steer

    plain = _key(monkeypatch, tmp_path)
    with_it = _key(monkeypatch, tmp_path, **{variable: "/some/value"})
    if variable in steer.NVCC_ONLY:
        assert with_it == plain  # a C++ library runs no nvcc: no needless rebuild
        assert steer.key_extra(cuda=True)[f"env.{variable}"] == "/some/value"  # what nvcc's builds key on
    else:
        assert with_it != plain


# ---- the observer runs in every compiler: nobody else may have written it ---------------------

@pytest.mark.parametrize("which", ["preload", "auditor"])
def test_an_observer_another_user_could_write_is_not_preloaded(which: str, tmp_path: Path) -> None:
    """The preloaded library and the loader's auditor (LD_AUDIT) both run in every compiler."""
    from abicache.engine import observe

    cache = Cache(tmp_path / "store")
    tools = cache.store.layout.tools
    library = observe.library(tools, trusted=cache.store.trust.ok)
    if library is None:
        pytest.skip("the observer could not be built here")
    observe._built.clear()
    os.chmod(library if which == "preload" else library.with_name(observe.AUDITOR), 0o777)  # as a store left open
    with pytest.warns(AbicacheWarning, match="another user"):
        assert observe.library(tools, trusted=cache.store.trust.ok) is None
    observe._built.clear()


@pytest.mark.parametrize("name", ["/tmp/evil.cpp", "../evil.cpp", "a/../../evil.cpp", ""])
def test_an_inline_source_name_cannot_leave_the_scratch_folder(name: str, tmp_path: Path) -> None:
    from abicache.errors import AbicacheError

    with pytest.raises(AbicacheError, match="relative path"):
        cc.build_library("x", {name: 'extern "C" int f() { return 1; }'}, cache=Cache(tmp_path / "s"))


def test_entries_recorded_before_the_observer_are_not_taken(tmp_path: Path) -> None:
    """Every engine-built key names the record scheme: an entry of an older abicache
    (no missing paths, no system headers recorded) is another key, never a hit."""
    from abicache.engine import steer

    for plan in (cc.library_plan("x", ['extern "C" int f() { return 1; }']),
                 cc.library_plan("x", ['extern "C" int f() { return 1; }'], lang="c++"),
                 cc.module_plan("m", ["int x;"], abi3="3.10")):
        assert ("record", steer.RECORD) in plan.inputs.extra
    auto = cc.library_plan("x", ['extern "C" int f() { return 1; }'])
    assert auto.inputs == cc.library_plan("x", ['extern "C" int f() { return 1; }'], lang="c++").inputs


# ---- a trace is trusted only when it is complete -----------------------------------------------

VALUED = 'extern "C" int f() { return VALUE; }\n'

#: a compiler wrapper, statically linked: it reads VALUE from a file and runs c++ with -DVALUE=...
STATIC_WRAPPER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char** argv) {
  char value[32] = "0", define[64];
  FILE* f = fopen(VALUE_FILE, "r");
  if (f) { if (!fgets(value, sizeof value, f)) value[0] = 0; fclose(f); }
  value[strcspn(value, "\n")] = 0;
  snprintf(define, sizeof define, "-DVALUE=%s", value);
  char** args = calloc(argc + 2, sizeof *args);
  args[0] = "c++"; args[1] = define;
  for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
  execvp("c++", args);
  return 127;
}
"""

#: a wrapper that clears LD_PRELOAD (hermetic and setuid launchers do) before it reads and runs anything
DROPPING_WRAPPER = """#!/bin/sh
unset LD_PRELOAD
exec c++ -DVALUE="$(cat "{value}")" "$@"
"""


def _static_wrapper(tmp_path: Path, value_file: Path) -> Path:
    src = write(tmp_path / "wrapper.c", STATIC_WRAPPER)
    exe = tmp_path / "static-cxx"
    made = subprocess.run(["cc", "-static", "-O2", f'-DVALUE_FILE="{value_file}"', str(src), "-o", str(exe)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot link a static program here (libc.a): {made.stderr.strip()[-200:]}")
    return exe


def _dropping_wrapper(tmp_path: Path, value_file: Path) -> Path:
    exe = write(tmp_path / "dropping-cxx", DROPPING_WRAPPER.format(value=value_file))
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize("make", [_static_wrapper, _dropping_wrapper], ids=["static", "drops-preload"])
def test_a_program_that_runs_unobserved_leaves_the_build_uncached_in_a_new_process(make, tmp_path: Path) -> None:
    """A statically linked wrapper, or one that clears LD_PRELOAD, reads a file the preload never
    sees; the c++ it runs reported, and the trace was taken for complete: stale for ever."""
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED)
    value = write(tmp_path / "value.txt", "1\n")
    env = {"CXX": str(make(tmp_path, value))}
    store = tmp_path / "store"
    first = fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)
    assert first["value"] == 1
    assert any("not cached" in w and "ran unobserved" in w for w in first["warnings"]), first["warnings"]
    write(value, "2\n")
    second = fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)
    assert (second["value"], second["origin"]) == (2, "built")


@pytest.mark.parametrize("make", [_static_wrapper, _dropping_wrapper], ids=["static", "drops-preload"])
def test_a_program_that_runs_unobserved_is_not_served_in_one_process(make, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED)
    value = write(tmp_path / "value.txt", "1\n")
    monkeypatch.setenv("CXX", str(make(tmp_path, value)))
    monkeypatch.chdir(tmp_path)
    cache = Cache(tmp_path / "store")
    with pytest.warns(AbicacheWarning, match="ran unobserved"):
        assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 1
    write(value, "2\n")
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 2


# ---- a rebuild returns what it built -----------------------------------------------------------

#: a compiler wrapper with its value inside: two builds of it differ in one constant, not in size
VALUE_WRAPPER = r"""
#include <stdlib.h>
#include <unistd.h>
static const char define[] = "-DVALUE=" VALUE;
int main(int argc, char** argv) {
  char** args = calloc(argc + 2, sizeof *args);
  args[0] = "c++"; args[1] = (char*)define;
  for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
  execvp("c++", args);
  return 127;
}
"""


def _value_wrapper(tmp_path: Path, value: int) -> bytes:
    src = write(tmp_path / "vw.c", VALUE_WRAPPER)
    out = tmp_path / f"vw-{value}"
    subprocess.run(["cc", "-O2", f'-DVALUE="{value}"', str(src), "-o", str(out)], check=True)
    return out.read_bytes()


def _rewrite_in_place(path: Path, data: bytes) -> None:
    """Same inode, same size, the mtime set back (cp -p, touch -r): only the change time moves."""
    before = path.stat()
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_a_tool_rewritten_in_place_with_its_mtime_set_back_is_the_new_tool(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool's hash came from a memo kept by size, mtime and inode: the rebuild ran the new
    tool, recorded the old one's hash, and publishing handed back the old library, every time."""
    one, two = _value_wrapper(tmp_path, 1), _value_wrapper(tmp_path, 2)
    assert len(one) == len(two) and one != two
    tool = tmp_path / "cxx-wrapper"
    tool.write_bytes(one)
    tool.chmod(0o755)
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED)
    env, store = {"CXX": str(tool)}, tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["origin"] == "local"
    _rewrite_in_place(tool, two)
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 2
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 2
    # and in one process
    monkeypatch.setenv("CXX", str(tool))
    monkeypatch.chdir(tmp_path)
    cache = Cache(store)
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 2
    _rewrite_in_place(tool, one)
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 1


def test_a_rebuild_that_makes_other_bytes_returns_them_and_says_so(tmp_path: Path) -> None:
    """A record that misses what changed (the tool memo above did: the old tool's hash for the
    new tool) gives the rebuild the published variant's id: the entry there was kept and returned
    in place of the bytes just built, on every build from then on."""
    import hashlib

    from abicache.core.cache import BuildResult
    from abicache.store.manifest import Dependency

    tool = write(tmp_path / "tool", "version 1\n")
    stale = hashlib.sha256(tool.read_bytes()).hexdigest()  # what the record keeps saying

    def build(out: Path) -> BuildResult:
        (out / "lib.so").write_bytes(b"made by " + tool.read_bytes())
        return BuildResult(deps=[Dependency("abs", str(tool), stale)])

    first = Cache(tmp_path / "store").get_or_build("test.tool", "lib", {"extra": {}}, build)
    assert first.file().read_bytes() == b"made by version 1\n"
    write(tool, "version 2\n")  # the lookup sees it: a miss, and a rebuild with the same record
    with pytest.warns(AbicacheWarning, match="made other bytes"):
        second = Cache(tmp_path / "store").get_or_build("test.tool", "lib", {"extra": {}}, build)
    assert second.file().read_bytes() == b"made by version 2\n" and second.origin == "built"
    assert second.manifest.variant == first.manifest.variant
    events = Cache(tmp_path / "store").store.read_events("disagreements")
    assert len(events) == 1 and json.loads(events[0])["name"] == "lib"


def test_a_program_run_through_a_retargeted_link_is_the_new_program(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """$CXX is a link to a compiler wrapper; retargeting the link runs another wrapper. The
    program was recorded by where the link led (/proc/self/exe), which did not change."""
    bins = tmp_path / "bin"
    bins.mkdir()
    for value in (1, 2):
        (bins / f"cxx-{value}").write_bytes(_value_wrapper(tmp_path, value))
        (bins / f"cxx-{value}").chmod(0o755)
    os.symlink("cxx-1", bins / "c++")
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED)
    env, store = {"CXX": str(bins / "c++")}, tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["origin"] == "local"

    def retarget(to: str) -> None:
        os.symlink(to, bins / "c++.new")
        os.replace(bins / "c++.new", bins / "c++")

    retarget("cxx-2")
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 2
    monkeypatch.setenv("CXX", str(bins / "c++"))
    monkeypatch.chdir(tmp_path)
    cache = Cache(store)
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 2
    time.sleep(0.05)  # past the racy window: the next call arms its watch on what it checked
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 2
    retarget("cxx-1")
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 1


def test_a_sub_tool_run_through_a_retargeted_link_is_the_new_tool(tmp_path: Path) -> None:
    """A wrapper runs `cc1-helper` found in PATH, a link; retargeting it runs another helper."""
    bins = tmp_path / "bin"
    bins.mkdir()
    for value in (1, 2):
        (bins / f"helper-{value}").write_bytes(_value_wrapper(tmp_path, value))
        (bins / f"helper-{value}").chmod(0o755)
    os.symlink("helper-1", bins / "helper")
    runner = write(tmp_path / "runner.sh", '#!/bin/sh\nexec helper "$@"\n')  # found in PATH by the shell
    runner.chmod(0o755)
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED)
    env = {"CXX": str(runner), "PATH": f"{bins}:{os.environ['PATH']}"}
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 1
    os.symlink("helper-2", bins / "helper.new")
    os.replace(bins / "helper.new", bins / "helper")
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 2


@pytest.fixture(params=["/opt", "/usr/share"])
def system_folder(request: pytest.FixtureRequest) -> Path:
    """A folder of ours where package managers and vendors put headers (needs root to make)."""
    try:
        folder = Path(tempfile.mkdtemp(prefix="abicache-test-", dir=request.param))
    except OSError as exc:
        pytest.skip(f"cannot make a folder in {request.param} ({exc.strerror}): needs root")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _in_place(path: Path, text: str) -> None:
    """As `cat > file` and `cp other file` write: the same inode, truncated and written."""
    ino = path.stat().st_ino
    with open(path, "w") as f:
        f.write(text)
    assert path.stat().st_ino == ino


def test_a_header_rewritten_in_place_in_a_system_folder_is_seen(system_folder: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Files there (found outside the project's folders: CPATH here, as the toolchain's own
    headers are) were witnessed by their folder, which a rewrite in place does not move: the
    old build was served in a new process and in the same one."""
    write(system_folder / "v.h", header(1))
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", UNIT)
    store, env = tmp_path / "store", {"CPATH": str(system_folder)}
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["origin"] == "local"
    _in_place(system_folder / "v.h", header(2))
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 2
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CPATH", str(system_folder))
    cache = Cache(store)
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 2
    time.sleep(0.05)  # past the racy window: the next call arms its watch on what it checked
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 2
    _in_place(system_folder / "v.h", header(3))
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 3


def test_includes_in_the_environment_steers_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvcc.profile says `INCLUDES += "-I..."`: a user's INCLUDES is nvcc's include path too.
    It was declared harmless (nvcc sets it for its own tools), and a build was served across it."""
    from abicache import cuda
    from abicache.env import probes

    if probes.nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    for value in (1, 2):
        write(tmp_path / f"h{value}" / "only_here.h", f"#define VALUE {value}2345\n")
    kernel = '#include "only_here.h"\nextern "C" __global__ void k(int* x) { *x = VALUE; }\n'
    cache = Cache(tmp_path / "store").for_target({"gpu.arch": "sm_90"})

    def ptx() -> str:
        return cuda.compile(kernel, arch="sm_90", output="ptx", compiler="nvcc", cache=cache).data.decode()

    monkeypatch.setenv("INCLUDES", f"-I{tmp_path / 'h1'}")
    assert "12345" in ptx()
    monkeypatch.setenv("INCLUDES", f"-I{tmp_path / 'h2'}")
    assert "22345" in ptx()


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_an_edit_through_another_name_is_seen_in_one_process(how: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The header is a symbolic link to a file in another folder, or a hard link to one; the
    edit is made through the other name. A new process saw it; the watch of this one did not
    (an inotify event goes to the folder of the name written through)."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "real.h").write_text(header(1))
    (tmp_path / "inc").mkdir()
    if how == "symlink":
        os.symlink(other / "real.h", tmp_path / "inc" / "v.h")
    else:
        os.link(other / "real.h", tmp_path / "inc" / "v.h")
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", UNIT)
    monkeypatch.chdir(tmp_path)
    cache = Cache(tmp_path / "store")

    def load() -> int:
        return cc.load_library("x", [Path("src/x.cpp")], cflags=["-Iinc"], cache=cache).f()

    assert load() == 1
    time.sleep(0.05)  # past the racy window: the next call arms its watch on what it checked
    assert load() == 1
    with open(other / "real.h", "w") as f:  # in place, through the other name
        f.write(header(2))
    assert load() == 2


# ---- what the loader reads for itself: a gcc plugin --------------------------------------------

PLUGIN = """
#include "gcc-plugin.h"
#include "c-family/c-common.h"
#include "c-family/c-pragma.h"
int plugin_is_GPL_compatible;
static void define_value(void*, void*) { cpp_define(parse_in, "VALUE=" VALUE); }
int plugin_init(struct plugin_name_args* info, struct plugin_gcc_version*) {
  register_callback(info->base_name, PLUGIN_PRAGMAS, define_value, NULL);
  return 0;
}
"""


def _plugin(tmp_path: Path, value: int, out: Path) -> None:
    """A real gcc plugin (gcc's plugin headers: the gcc-N-plugin-dev package) that defines VALUE."""
    headers = subprocess.run(["g++", "-print-file-name=plugin"], capture_output=True, text=True).stdout.strip()
    if not Path(headers, "include", "gcc-plugin.h").is_file():
        pytest.skip("gcc's plugin headers are not installed (apt-get install gcc-12-plugin-dev)")
    src = write(tmp_path / "plugin.cpp", PLUGIN)
    subprocess.run(["g++", "-shared", "-fPIC", "-fno-rtti", "-O2", f'-DVALUE="{value}"', f"-I{headers}/include",
                    str(src), "-o", str(out)], check=True)


def test_a_gcc_plugin_rebuilt_in_place_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cc1plus loads -fplugin= with dlopen: the loader opens it with its own open, which the
    preload never saw, and no depfile lists it. The loader's audit interface reports it."""
    plugin = tmp_path / "plugins" / "value.so"
    plugin.parent.mkdir()
    _plugin(tmp_path, 1, plugin)
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED)
    store, flags = tmp_path / "store", [f"-fplugin={plugin}"]
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, cflags=flags)["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, cflags=flags)["origin"] == "local"
    _plugin(tmp_path, 2, plugin)  # the plugin's own build, in place
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, cflags=flags)["value"] == 2
    monkeypatch.chdir(tmp_path)
    cache = Cache(store)
    assert cc.load_library("x", [Path("src/x.cpp")], cflags=flags, cache=cache).f() == 2
    time.sleep(0.05)  # past the racy window: the next call arms its watch on what it checked
    assert cc.load_library("x", [Path("src/x.cpp")], cflags=flags, cache=cache).f() == 2
    _plugin(tmp_path, 3, plugin)
    assert cc.load_library("x", [Path("src/x.cpp")], cflags=flags, cache=cache).f() == 3


VALUE_LIB = 'int value(void) { return VALUE; }\n'
LIB_WRAPPER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int value(void);
int main(int argc, char** argv) {
  static char define[32];
  snprintf(define, sizeof define, "-DVALUE=%d", value());
  char** args = calloc(argc + 2, sizeof *args);
  args[0] = "c++"; args[1] = define;
  for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
  execvp("c++", args);
  return 127;
}
"""


def test_a_library_the_loader_finds_for_a_tool_is_an_input(tmp_path: Path) -> None:
    """A compiler wrapper takes VALUE from libvalue.so, which the loader finds through
    LD_LIBRARY_PATH: the loader's own open is no preload's, and the variable is read by
    no getenv. A library rebuilt in place, or another folder in the variable, was a hit."""
    src = write(tmp_path / "value.c", VALUE_LIB)
    for folder, value in (("a", 1), ("b", 2)):
        (tmp_path / folder).mkdir()
        subprocess.run(["cc", "-shared", "-fPIC", f"-DVALUE={value}", str(src), "-o",
                        str(tmp_path / folder / "libvalue.so")], check=True)
    wrapper = write(tmp_path / "wrapper.c", LIB_WRAPPER)
    subprocess.run(["cc", str(wrapper), f"-L{tmp_path / 'a'}", "-lvalue", "-o", str(tmp_path / "cxx")], check=True)
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED)
    store = tmp_path / "store"

    def value(folder: str) -> dict:
        return fresh(store, ["src/x.cpp"], cwd=tmp_path,
                     env={"CXX": str(tmp_path / "cxx"), "LD_LIBRARY_PATH": str(tmp_path / folder)})

    assert value("a")["value"] == 1
    assert value("a")["origin"] == "local"
    assert value("b")["value"] == 2  # another folder in the variable: another library
    subprocess.run(["cc", "-shared", "-fPIC", "-DVALUE=3", str(src), "-o", str(tmp_path / "a" / "libvalue.so")],
                   check=True)  # rebuilt in place
    assert value("a")["value"] == 3


# ---- a folder's listing is an input ------------------------------------------------------------

#: a compiler wrapper that takes the newest of the versions in a folder (the shell lists it)
NEWEST_WRAPPER = """#!/bin/sh
newest=
for version in "{versions}"/*; do newest=$version; done
exec c++ -include "$newest/v.h" "$@"
"""

VALUED_BARE = 'extern "C" int f() { return VALUE; }\n'


def _versions(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    versions = tmp_path / "versions"
    write(versions / "1" / "v.h", header(1))
    wrapper = write(tmp_path / "newest-cxx", NEWEST_WRAPPER.format(versions=versions))
    wrapper.chmod(0o755)
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED_BARE)
    return versions, {"CXX": str(wrapper)}


def test_a_version_added_to_a_folder_a_tool_lists_is_picked_in_a_new_process(tmp_path: Path) -> None:
    """The wrapper picks the newest version by listing a folder; a new version there is what a
    fresh build uses, while every path the build read or looked for stays as it was."""
    versions, env = _versions(tmp_path)
    store = tmp_path / "store"
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["origin"] == "local"
    (versions / "0-old").mkdir()  # a name that sorts first: the listing changed, the choice did not
    again = fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)
    assert again["value"] == 1
    write(versions / "2" / "v.h", header(2))
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 2


def test_a_version_added_to_a_folder_a_tool_lists_is_picked_in_one_process(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    versions, env = _versions(tmp_path)
    monkeypatch.setenv("CXX", env["CXX"])
    monkeypatch.chdir(tmp_path)
    cache = Cache(tmp_path / "store")
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 1
    time.sleep(0.05)  # past the racy window: the next call arms its watch on what it checked
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 1
    write(versions / "2" / "v.h", header(2))
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 2


# ---- a script reads its variables without getenv -------------------------------------------------

PICKING_WRAPPER = '#!/bin/sh\nexec c++ -DVALUE="${PICK:-1}" "$@"\n'


def test_a_variable_a_wrapper_script_reads_steers_the_build_in_a_new_process(tmp_path: Path) -> None:
    """The shell reads its environment at its start, never through getenv: the variable the
    wrapper takes its flag from went unrecorded, and another value was a hit."""
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED_BARE)
    wrapper = write(tmp_path / "pick-cxx", PICKING_WRAPPER)
    wrapper.chmod(0o755)
    store = tmp_path / "store"
    env = {"CXX": str(wrapper), "PICK": "1"}
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["origin"] == "local"
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env={**env, "PICK": "2"})["value"] == 2
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env, drop=("PICK",))["value"] == 1


def test_a_variable_a_wrapper_script_reads_steers_the_build_in_one_process(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED_BARE)
    wrapper = write(tmp_path / "pick-cxx", PICKING_WRAPPER)
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("PICK", "1")
    monkeypatch.chdir(tmp_path)
    cache = Cache(tmp_path / "store")
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 1
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 1
    monkeypatch.setenv("PICK", "2")
    assert cc.load_library("x", [Path("src/x.cpp")], cache=cache).f() == 2


def test_a_variable_a_script_run_by_the_build_reads_steers_it(tmp_path: Path) -> None:
    """The same through a script that a compiled wrapper runs (found by its exec, not started by abicache)."""
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED_BARE)
    bins = tmp_path / "bin"
    write(bins / "c++", '#!/bin/sh\nexec /usr/bin/c++ -DVALUE="${PICK:-1}" "$@"\n').chmod(0o755)
    store = tmp_path / "store"
    env = {"CXX": "cc-wrapped", "PATH": f"{bins}:{os.environ['PATH']}", "PICK": "1"}
    write(bins / "cc-wrapped", '#!/bin/sh\nexec c++ "$@"\n').chmod(0o755)
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env={**env, "PICK": "2"})["value"] == 2


# ---- the working folder ---------------------------------------------------------------------------

def test_a_tree_with_absolute_paths_built_from_another_working_folder_is_a_hit(tmp_path: Path) -> None:
    """No -g: the working folder steers nothing in the output, so the build made from one
    folder is the hit from another."""
    write(tmp_path / "p" / "x.cpp", '#include "v.h"\nextern "C" int f() { return VALUE; }\n')
    write(tmp_path / "p" / "y.cpp", '#include "v.h"\nextern "C" int g() { return VALUE; }\n')
    write(tmp_path / "p" / "v.h", header(1))
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    sources = [str(tmp_path / "p" / "x.cpp"), str(tmp_path / "p" / "y.cpp")]
    store, cflags = tmp_path / "store", [f"-I{tmp_path / 'p'}"]
    assert fresh(store, sources, cwd=tmp_path / "here", cflags=cflags)["origin"] == "built"
    assert fresh(store, sources, cwd=tmp_path / "there", cflags=cflags)["origin"] == "local"


def test_relative_paths_in_one_process_follow_the_working_folder(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The same relative source and -I folder from two working folders are two projects:
    the in-process memo answers for the folder it was asked from."""
    for value, folder in ((1, "a"), (2, "b")):
        write(tmp_path / folder / "src" / "x.cpp", UNIT)
        write(tmp_path / folder / "inc" / "v.h", header(value))
    cache = Cache(tmp_path / "store")
    for folder, value in (("a", 1), ("b", 2), ("a", 1), ("b", 2)):
        monkeypatch.chdir(tmp_path / folder)
        assert cc.load_library("x", [Path("src/x.cpp")], cflags=["-Iinc"], cache=cache).f() == value


#: a compiled wrapper that hands the compile to a shell's command string (no script file names the variable)
SHELL_STRING_WRAPPER = r"""
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char** argv) {
  char** args = calloc(argc + 5, sizeof *args);
  args[0] = "sh"; args[1] = "-c"; args[2] = "exec c++ -DVALUE=\"${PICK:-1}\" \"$@\""; args[3] = "sh";
  for (int i = 1; i < argc; i++) args[i + 3] = argv[i];
  execv("/bin/sh", args);
  return 127;
}
"""


def test_a_variable_a_shell_command_string_reads_steers_the_build(tmp_path: Path) -> None:
    """`sh -c '... ${PICK} ...'` from a compiled wrapper: the variable is named only in the
    command string, which the observer now records from the exec."""
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED_BARE)
    src = write(tmp_path / "sw.c", SHELL_STRING_WRAPPER)
    subprocess.run(["cc", "-O2", str(src), "-o", str(tmp_path / "sw")], check=True)
    store, env = tmp_path / "store", {"CXX": str(tmp_path / "sw"), "PICK": "1"}
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["value"] == 1
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)["origin"] == "local"
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env={**env, "PICK": "2"})["value"] == 2


def test_a_shell_command_string_too_long_to_record_leaves_the_build_uncached(tmp_path: Path) -> None:
    """A command string over the observer's record is not dropped in silence: what it names is
    unknown, so the build is loaded and not cached, and the warning says why."""
    (tmp_path / "src").mkdir()
    write(tmp_path / "src" / "x.cpp", VALUED_BARE)
    padded = SHELL_STRING_WRAPPER.replace('"exec c++', '": ' + "x" * 5000 + '; exec c++')  # over a path's 4 KiB
    src = write(tmp_path / "sw.c", padded)
    subprocess.run(["cc", "-O2", str(src), "-o", str(tmp_path / "sw")], check=True)
    store, env = tmp_path / "store", {"CXX": str(tmp_path / "sw"), "PICK": "1"}
    first = fresh(store, ["src/x.cpp"], cwd=tmp_path, env=env)
    assert first["value"] == 1
    assert any("not cached" in w and "too long to record" in w for w in first["warnings"]), first["warnings"]
    assert fresh(store, ["src/x.cpp"], cwd=tmp_path, env={**env, "PICK": "2"})["value"] == 2
