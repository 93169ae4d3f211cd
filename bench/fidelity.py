"""Fidelity: after each change a fresh build would see, is the cached answer
still the fresh build's? abicache side by side with ccache (direct mode, its
default), on the cases of the fidelity issue.

Each case builds a small shared library from a project folder, changes one
input that steers the build (a word of $CXX, a variable, a header in a
system folder, a header that shadows or appears, a response file, .incbin
data, a link input), builds again, and loads the result in a fresh process.
STALE: the answer is the old build's. ccache caches compiles only (each
source with `ccache $CXX -c`, then a plain link): the link inputs are not its
to get wrong ("n/a"). The compiler launcher (`$(abicache launcher) $CXX -c`) is built and
linked the same way, each compile served by its native front from a hit record before the
change (else "never served": Python judged it).

    python bench/fidelity.py      # exits 1 if abicache serves a stale build in any case
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from common import base_env

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

ABICACHE = textwrap.dedent("""
    import ctypes, json, sys
    from pathlib import Path
    from abicache import cc
    spec = json.loads(sys.argv[1])
    art = cc.build_library("x", [Path(s) for s in spec["sources"]], cflags=spec["cflags"], ldflags=spec["ldflags"])
    print(json.dumps({"value": ctypes.CDLL(str(art.file())).f(), "origin": art.origin}))
""")
LOAD = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).f())"
# The same call through cc.load_library in a fresh process: after the first lookup each such
# process is served by its hit record (src/abicache/hits/), which must see every change too.
ABICACHE_LOAD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from abicache import cc
    spec = json.loads(sys.argv[1])
    lib = cc.load_library("x", [Path(s) for s in spec["sources"]], cflags=spec["cflags"], ldflags=spec["ldflags"])
    print(json.dumps({"value": lib.f(), "served": type(next(iter(cc._loaded.values()))[0]).__name__ == "Served"}))
""")


class Case(NamedTuple):
    name: str
    files: dict[str, str]  # the project, before
    cflags: list[str]
    ldflags: list[str]
    env: dict[str, str]  # before
    change: Callable[[Path], dict[str, str]]  # edits the project; the environment after
    fresh: int  # what a fresh build answers after the change
    links_only: bool = False  # only the link reads the changed input (ccache: n/a)
    first: Callable[[Path], None] | None = None  # an earlier change, asked about before `change`
    setup: Callable[[Path], None] | None = None  # makes the project's tools (programs, links, plugins)


def _h(value: int) -> str:
    return f"#pragma once\n#define VALUE {value}\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


UNIT = '#include "v.h"\nextern "C" int f() { return VALUE; }\n'
SYS_UNIT = '#include <v.h>\nextern "C" int f() { return VALUE; }\n'
HAS = ('#if __has_include("opt.h")\n#include "opt.h"\n#else\n#define VALUE 1\n#endif\n'
       'extern "C" int f() { return VALUE; }\n')


# ---- the second layer: what a trace misses (tools the observer cannot enter, the loader's reads) ----

#: a compiler wrapper that reads VALUE from value.txt beside it and runs c++ -DVALUE=...
READING_WRAPPER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char** argv) {
  char value[32] = "0", define[64];
  FILE* f = fopen("value.txt", "r");
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
#: a compiler wrapper with VALUE (and, where it links libvalue, the library's value) inside
VALUE_WRAPPER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int value(void);
int main(int argc, char** argv) {
  static char define[32];
  snprintf(define, sizeof define, "-DVALUE=%d", VALUE);
  char** args = calloc(argc + 2, sizeof *args);
  args[0] = "c++"; args[1] = define;
  for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
  execvp("c++", args);
  return 127;
}
"""
PLUGIN = r"""
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


def _cc(source: str, out: Path, *flags: str, lang: str = "c") -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc" if lang == "c" else "c++", "-x", lang, "-", "-x", "none", *flags, "-o", str(out)], input=source,
                   text=True, check=True, capture_output=True)


def _wrapper(proj: Path, name: str, value: str, *flags: str) -> None:
    _cc(VALUE_WRAPPER.replace("VALUE);", f"{value});", 1), proj / "tools" / name, *flags)
    (proj / "tools" / name).chmod(0o755)


def _same_size_rewrite(path: Path, data: bytes) -> None:
    before = path.stat()
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # cp -p, touch -r: only the ctime moves


def _plugin(proj: Path, value: int) -> None:
    headers = subprocess.run(["g++", "-print-file-name=plugin"], capture_output=True, text=True).stdout.strip()
    _cc(PLUGIN.replace("VALUE=\" VALUE", f"VALUE={value}\""), proj / "tools" / "value.so", "-shared", "-fPIC",
        "-fno-rtti", f"-I{headers}/include", lang="c++")


def _retarget(link: Path, to: str) -> None:
    os.symlink(to, link.with_name(link.name + ".new"))
    os.replace(link.with_name(link.name + ".new"), link)


_MADE: list[Path] = []  # folders outside the work folder, removed at the end


def _opt_folder() -> Path | None:
    try:
        _MADE.append(Path(tempfile.mkdtemp(prefix="abicache-bench-", dir="/opt")))
    except OSError:
        return None  # not root: the row is left out
    return _MADE[-1]


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


def _newest_wrapper(proj: Path) -> None:
    _write(proj / "tools" / "cxx", f'#!/bin/sh\nfor v in "{proj}"/versions/*; do n=$v; done\n'
           'exec c++ -include "$n/v.h" "$@"\n')
    (proj / "tools" / "cxx").chmod(0o755)


def second_layer(work: Path) -> list[Case]:
    opt = _opt_folder()
    plugin_headers = subprocess.run(["g++", "-print-file-name=plugin"], capture_output=True, text=True).stdout
    out = [
        Case("a statically linked wrapper reads a file", {"x.cpp": VALUED, "value.txt": "1\n"}, [], [],
             {"CXX": "{proj}/tools/static-cxx"},
             lambda p: (_write(p / "value.txt", "2\n"), {"CXX": "{proj}/tools/static-cxx"})[1], 2,
             setup=lambda p: _cc(READING_WRAPPER, p / "tools" / "static-cxx", "-static", "-O2")),
        Case("a wrapper clears LD_PRELOAD, then reads a file", {"x.cpp": VALUED, "value.txt": "1\n",
             "tools/cxx": '#!/bin/sh\nunset LD_PRELOAD\nexec c++ -DVALUE="$(cat value.txt)" "$@"\n'}, [], [],
             {"CXX": "{proj}/tools/cxx"}, lambda p: (_write(p / "value.txt", "2\n"), {"CXX": "{proj}/tools/cxx"})[1],
             2, setup=lambda p: (p / "tools" / "cxx").chmod(0o755)),
        Case("$CXX is a link, retargeted", {"x.cpp": VALUED}, [], [], {"CXX": "{proj}/tools/c++"},
             lambda p: (_retarget(p / "tools" / "c++", "cxx-2"), {"CXX": "{proj}/tools/c++"})[1], 2,
             setup=lambda p: (_wrapper(p, "cxx-1", "1"), _wrapper(p, "cxx-2", "2"),
                              os.symlink("cxx-1", p / "tools" / "c++"))),
        Case("the compiler rewritten in place, same size, mtime set back", {"x.cpp": VALUED}, [], [],
             {"CXX": "{proj}/tools/cxx"},
             lambda p: (_same_size_rewrite(p / "tools" / "cxx", (p / "tools" / "cxx-2").read_bytes()),
                        {"CXX": "{proj}/tools/cxx"})[1], 2,
             setup=lambda p: (_wrapper(p, "cxx", "1"), _wrapper(p, "cxx-2", "2"))),
        Case("LD_LIBRARY_PATH: the compiler wrapper's library from another folder", {"x.cpp": VALUED}, [], [],
             {"CXX": "{proj}/tools/cxx", "LD_LIBRARY_PATH": "{proj}/a"},
             lambda p: {"CXX": "{proj}/tools/cxx", "LD_LIBRARY_PATH": str(p / "b")},
             2, setup=lambda p: (_cc("int value(void) { return 1; }", p / "a" / "libvalue.so", "-shared", "-fPIC"),
                                 _cc("int value(void) { return 2; }", p / "b" / "libvalue.so", "-shared", "-fPIC"),
                                 _cc(VALUE_WRAPPER.replace("VALUE);", "value());", 1), p / "tools" / "cxx",
                                     f"-L{p / 'a'}", "-lvalue"))),
        Case("a wrapper takes the newest version in a folder it lists; one is added",
             {"x.cpp": VALUED, "versions/1/v.h": _h(1)}, [], [], {"CXX": "{proj}/tools/cxx"},
             lambda p: (_write(p / "versions" / "2" / "v.h", _h(2)), {"CXX": "{proj}/tools/cxx"})[1], 2,
             setup=_newest_wrapper),
        Case("a wrapper script takes a flag from a variable it reads (no getenv), which changes",
             {"x.cpp": VALUED, "tools/cxx": '#!/bin/sh\nexec c++ -DVALUE="${PICK:-1}" "$@"\n'}, [], [],
             {"CXX": "{proj}/tools/cxx", "PICK": "1"}, lambda p: {"CXX": "{proj}/tools/cxx", "PICK": "2"}, 2,
             setup=lambda p: (p / "tools" / "cxx").chmod(0o755)),
        Case("a compiled wrapper runs `sh -c` with a variable in the command string, which changes",
             {"x.cpp": VALUED}, [], [], {"CXX": "{proj}/tools/cxx", "PICK": "1"},
             lambda p: {"CXX": "{proj}/tools/cxx", "PICK": "2"}, 2,
             setup=lambda p: _cc(SHELL_STRING_WRAPPER, p / "tools" / "cxx")),
    ]
    if Path(plugin_headers.strip(), "include", "gcc-plugin.h").is_file():
        out.append(Case("a gcc plugin (-fplugin=) rebuilt", {"x.cpp": VALUED}, ["-fplugin={proj}/tools/value.so"],
                        [], {}, lambda p: (_plugin(p, 2), {})[1], 2, setup=lambda p: _plugin(p, 1)))
    if opt is not None:
        out.append(Case("a header rewritten in place under /opt (CPATH)", {"x.cpp": UNIT}, [], [],
                        {"CPATH": str(opt) + "/{name}"},
                        lambda p: (_in_place(opt / p.name / "v.h", _h(2)), {"CPATH": str(opt / p.name)})[1], 2,
                        setup=lambda p: _write(opt / p.name / "v.h", _h(1))))
    return out


def _in_place(path: Path, text: str) -> None:
    with open(path, "w") as f:  # cat >, cp: the same inode
        f.write(text)


VALUED = 'extern "C" int f() { return VALUE; }\n'


def cases(work: Path) -> list[Case]:
    lib1, lib2 = work / "lib1", work / "lib2"
    return [
        Case("$CXX words (-D_GLIBCXX_USE_CXX11_ABI=0, then plain)",
             {"x.cpp": '#include <string>\nextern "C" int f() { return _GLIBCXX_USE_CXX11_ABI; }\n'}, [], [],
             {"CXX": "c++ -D_GLIBCXX_USE_CXX11_ABI=0"}, lambda p: {"CXX": "c++"}, 1),
        Case("CPATH: a header edited there", {"x.cpp": UNIT, "cp/v.h": _h(1)}, [], [], {"CPATH": "cp"},
             lambda p: (_write(p / "cp" / "v.h", _h(2)), {"CPATH": "cp"})[1], 2),
        Case("CPATH: another folder", {"x.cpp": UNIT, "cp/v.h": _h(1), "cp2/v.h": _h(2)}, [], [], {"CPATH": "cp"},
             lambda p: {"CPATH": "cp2"}, 2),
        Case("system header (-isystem) upgraded", {"x.cpp": SYS_UNIT, "sys/v.h": _h(1)}, ["-isystem", "sys"], [], {},
             lambda p: (_write(p / "sys" / "v.h", _h(2)), {})[1], 2),
        Case("header created in an earlier -I folder", {"x.cpp": UNIT, "b/v.h": _h(1), "a/.keep": ""},
             ["-Ia", "-Ib"], [], {}, lambda p: (_write(p / "a" / "v.h", _h(2)), {})[1], 2),
        Case("folder made in an earlier -I folder, then the header in it",
             {"x.cpp": UNIT.replace('"v.h"', '"lib/v.h"'), "b/lib/v.h": _h(1), "a/.keep": ""}, ["-Ia", "-Ib"], [],
             {}, lambda p: (_write(p / "a" / "lib" / "v.h", _h(2)), {})[1], 2,
             first=lambda p: (p / "a" / "lib").mkdir()),
        Case("header created beside the source", {"src/x.cpp": UNIT, "inc/v.h": _h(1)}, ["-Iinc"], [], {},
             lambda p: (_write(p / "src" / "v.h", _h(2)), {})[1], 2),
        Case("__has_include target created", {"x.cpp": HAS, "inc/.keep": ""}, ["-Iinc"], [], {},
             lambda p: (_write(p / "inc" / "opt.h", _h(2)), {})[1], 2),
        Case("response file (@opts) edited", {"x.cpp": 'extern "C" int f() { return EXTRA; }\n',
                                              "opts.rsp": "-DEXTRA=1\n"}, ["@opts.rsp"], [], {},
             lambda p: (_write(p / "opts.rsp", "-DEXTRA=2\n"), {})[1], 2),
        Case(".incbin data edited", {"x.cpp": 'asm(".section .rodata\\n.global blob\\nblob: .incbin \\"data.bin\\""'
                                              '"\\n.text");\nextern "C" const unsigned char blob[];\n'
                                              'extern "C" int f() { return blob[0]; }\n', "data.bin": "\x01"},
             [], [], {}, lambda p: ((p / "data.bin").write_bytes(b"\x02"), {})[1], 2),
        Case("SOURCE_DATE_EPOCH (__DATE__'s year)", {"x.cpp": 'extern "C" int f() { return __DATE__[10] - \'0\'; }\n'},
             [], [], {"SOURCE_DATE_EPOCH": "1000000000"}, lambda p: {"SOURCE_DATE_EPOCH": "1234567890"}, 9),
        Case("LIBRARY_PATH: another archive",
             {"x.cpp": 'extern "C" int value();\nextern "C" int f() { return value(); }\n'},
             [], ["-lvalue"], {"LIBRARY_PATH": str(lib1)}, lambda p: {"LIBRARY_PATH": str(lib2)}, 2, links_only=True),
        *second_layer(work),
    ]


def _archives(work: Path) -> None:
    for value in (1, 2):
        folder = work / f"lib{value}"
        folder.mkdir(exist_ok=True)
        subprocess.run(["cc", "-fPIC", "-c", "-x", "c", "-", "-o", str(folder / "v.o")], check=True,
                       input=f"int value(void) {{ return {value}; }}\n", text=True)
        subprocess.run(["ar", "rcs", str(folder / "libvalue.a"), str(folder / "v.o")], check=True)


def _project(root: Path, case: Case) -> list[str]:
    for name, text in case.files.items():
        _write(root / name, text)
    return [n for n in case.files if n.endswith(".cpp")]


def _placed(proj: Path, words: dict[str, str] | list[str]) -> Any:
    """{proj} and {name}: the project's folder and name (each tool builds its own copy)."""
    fill = {"proj": str(proj), "name": proj.name}
    if isinstance(words, dict):
        return {k: v.format(**fill) for k, v in words.items()}
    return [w.format(**fill) for w in words]


def _abicache(proj: Path, store: Path, sources: list[str], case: Case, env: dict[str, str],
              script: str = ABICACHE) -> dict[str, Any]:
    full = {**base_env(), "ABICACHE_DIR": str(store), "ABICACHE_PROGRESS": "0", **_placed(proj, env)}
    spec = json.dumps({"sources": sources, "cflags": _placed(proj, case.cflags), "ldflags": case.ldflags})
    out = subprocess.run([sys.executable, "-c", script, spec], cwd=proj, env=full, capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


_served: dict[str, bool] = {}  # case -> whether its record served a process before the change


def _abicache_load(proj: Path, store: Path, sources: list[str], case: Case, env: dict[str, str]) -> int:
    """Before the change: processes until one is served by its record (the first looks the entry
    up and records it); after it: one process, which the record must not serve stale."""
    got = _abicache(proj, store, sources, case, env, ABICACHE_LOAD)
    changed = _changed.get(case.name, False)
    for _ in range(4):
        if got["served"] or changed:
            break
        time.sleep(0.05)
        got = _abicache(proj, store, sources, case, env, ABICACHE_LOAD)
    if not changed:
        _served[case.name] = _served.get(case.name, False) or got["served"]
    return int(got["value"])


_changed: dict[str, bool] = {}  # case -> whether its change was made (run_case)


def _ccache(proj: Path, ccache_dir: Path, sources: list[str], case: Case, env: dict[str, str]) -> int:
    full = {**base_env(), "CCACHE_DIR": str(ccache_dir), **_placed(proj, env)}
    cxx = full.get("CXX", "c++").split()
    objects = []
    for i, src in enumerate(sources):
        obj = proj / f"obj{i}.o"
        subprocess.run(["ccache", *cxx, "-fPIC", "-O2", *_placed(proj, case.cflags), "-c", src, "-o", str(obj)],
                       cwd=proj, env=full, check=True, capture_output=True)
        objects.append(str(obj))
    lib = proj / "libx.so"
    subprocess.run(["c++", "-shared", *objects, "-o", str(lib), *case.ldflags], cwd=proj, env=full, check=True,
                   capture_output=True)
    out = subprocess.run([sys.executable, "-c", LOAD, str(lib)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


_fronts: dict[str, str] = {}  # store -> its launcher front (abicache launcher)


def _launcher(proj: Path, store: Path, sources: list[str], case: Case, env: dict[str, str]) -> int:
    """The compiler launcher (`$(abicache launcher) $CXX -c`, as CMAKE_CXX_COMPILER_LAUNCHER), then a
    plain link, as ccache's column. Before the change: compiles again until the native front serves
    every one from its hit record; after it: one build, which the front must not serve stale."""
    full = {**base_env(), "ABICACHE_DIR": str(store), "ABICACHE_PROGRESS": "0", **_placed(proj, env)}
    front = _fronts.get(str(store))
    if front is None:
        made = subprocess.run([sys.executable, "-m", "abicache", "launcher"], env=full, capture_output=True,
                              text=True, check=True)
        front = _fronts[str(store)] = made.stdout.strip()
    cxx = full.get("CXX", "c++").split()
    commands = [[*cxx, "-fPIC", "-O2", *_placed(proj, case.cflags), "-c", src, "-o", str(proj / f"obj{i}.o")]
                for i, src in enumerate(sources)]
    for words in commands:
        subprocess.run([front, *words], cwd=proj, env=full, check=True, capture_output=True)
    if not _changed.get(case.name, False):
        served = False
        for _ in range(40):  # a miss leaves its record to a child
            served = all(subprocess.run([front, "--abicache-serve-only", *words], cwd=proj, env=full,
                                        capture_output=True).returncode == 0 for words in commands)
            if served:
                break
            time.sleep(0.05)
        _served[f"launcher:{case.name}"] = _served.get(f"launcher:{case.name}", False) or served
    lib = proj / "libx.so"
    subprocess.run(["c++", "-shared", *(str(proj / f"obj{i}.o") for i in range(len(sources))), "-o", str(lib),
                    *case.ldflags], cwd=proj, env=full, check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-c", LOAD, str(lib)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


TOOLS = ("abicache", "abicache, hit records", "launcher", "ccache")


def run_case(work: Path, case: Case) -> dict[str, str]:
    row = {}
    for tool in TOOLS:
        if tool in ("ccache", "launcher") and case.links_only or tool == "ccache" and not shutil.which("ccache"):
            row[tool] = "n/a"
            continue
        proj = work / f"{tool.replace(', ', '-').replace(' ', '-')}-{abs(hash(case.name))}"
        sources = _project(proj, case)
        if case.setup is not None:
            case.setup(proj)
        build = {"abicache": lambda *a: int(_abicache(*a)["value"]), "ccache": _ccache, "launcher": _launcher,
                 "abicache, hit records": _abicache_load}[tool]
        _changed[case.name] = False
        cache_dir = work / f"{tool}-store-{abs(hash(case.name))}"
        build(proj, cache_dir, sources, case, case.env)
        if case.first is not None:  # a change that alters nothing yet, then a lookup
            case.first(proj)
            time.sleep(0.05)
            build(proj, cache_dir, sources, case, case.env)
        time.sleep(0.05)
        after_env = case.change(proj)
        _changed[case.name] = True
        got = build(proj, cache_dir, sources, case, after_env)
        row[tool] = "ok" if got == case.fresh else "STALE"
        if tool == "abicache, hit records" and not _served.get(case.name):
            row[tool] += " (never served)"  # the record was not written: this row tests the full lookup
        if tool == "launcher" and not _served.get(f"launcher:{case.name}"):
            row[tool] += " (never served)"  # the front did not serve it before the change: Python judged it
    return row


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    work = Path(tempfile.mkdtemp(prefix="abicache-bench-fidelity-"))
    try:
        _archives(work)
        rows = {case.name: run_case(work, case) for case in cases(work)}
    finally:
        for folder in [work, *_MADE]:
            shutil.rmtree(folder, ignore_errors=True)
    table = Table(title="Fidelity: the answer after a change a fresh build sees (fresh processes)")
    for column in ("case", "abicache", "abicache: load_library, hit records",
                   "abicache launcher (native front) + plain link", "ccache (direct mode) + plain link"):
        table.add_column(column)
    for name, row in rows.items():
        table.add_row(name, *(row[tool] for tool in TOOLS))
    stale = {tool: sum(r[tool].startswith("STALE") for r in rows.values()) for tool in TOOLS}
    table.add_row("stale builds served", *(str(stale[tool]) for tool in TOOLS))
    never = sum("never served" in r["abicache, hit records"] for r in rows.values())
    never_front = sum("never served" in r["launcher"] for r in rows.values())
    table.add_row("records that never served before the change", "", str(never), str(never_front), "")
    Console(width=140).print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fidelity.json").write_text(json.dumps({"cases": rows, "stale": stale,
                                                       "when": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))
    return 1 if stale["abicache"] or stale["abicache, hit records"] or stale["launcher"] else 0


if __name__ == "__main__":
    os.chdir(ROOT)
    raise SystemExit(main())
