from __future__ import annotations

import ctypes
import json
import textwrap
from pathlib import Path

import pytest

from abicache import Cache, cc
from abicache.engine import scratch
from abicache.env import Facts
from abicache.errors import AbicacheError, BuildError
import subprocess

from conftest import SRC, need, python_with_src, run_py

ADD = 'extern "C" int add(int a, int b) { return a + b; }'
MODULE = textwrap.dedent(r"""
    #include <Python.h>
    static PyObject* twice(PyObject* self, PyObject* arg) {
        long v = PyLong_AsLong(arg);
        if (v == -1 && PyErr_Occurred()) return NULL;
        return PyLong_FromLong(2 * v);
    }
    static PyMethodDef methods[] = {{"twice", twice, METH_O, ""}, {NULL, NULL, 0, NULL}};
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
    PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&def); }
""")


@pytest.fixture(autouse=True)
def _compiler() -> None:
    need("c++")
    need("cc")


def module_source(name: str) -> str:
    return MODULE.replace("NAME", name)


def test_library_builds_loads_and_hits(cache: Cache, root: Path) -> None:
    lib = cc.load_library("adder", [ADD], cache=cache)
    assert lib.add(2, 40) == 42
    art = cc.build_library("adder", [ADD], cache=Cache(root))
    assert art.hit and art.manifest.declared == type(art.requirements)()  # a library declares nothing
    # add() needs nothing from libc (no DT_NEEDED, only weak imports): only the machine.
    assert art.requirements.to_list() == ["platform.machine == " + __import__("os").uname().machine]
    assert art.files == ("libadder.so",)


def test_c_library_from_a_path_and_a_header_mapping(cache: Cache, tmp_path: Path) -> None:
    src = tmp_path / "mul.c"
    src.write_text('#include "k.h"\nint mul(int a) { return a * K; }\n')
    lib = cc.load_library("mul", [{"k.h": "#define K 3\n", "mul.c": src.read_text()}], lang="c", cache=cache)
    assert lib.mul(5) == 15
    lib2 = cc.load_library("mul", [{"k.h": "#define K 4\n", "mul.c": src.read_text()}], lang="c", cache=cache)
    assert lib2.mul(5) == 20  # a header is an input too
    assert cc.load_library("mulp", [src, {"k.h": "#define K 2\n"}], lang="c", cache=cache).mul(5) == 10


def test_flags_are_part_of_the_key(cache: Cache) -> None:
    a = cc.build_library("f", ["extern \"C\" int v() { return V; }"], cflags=["-DV=1"], cache=cache)
    b = cc.build_library("f", ["extern \"C\" int v() { return V; }"], cflags=["-DV=2"], cache=cache)
    assert a.key != b.key
    assert ctypes.CDLL(str(b.file())).v() == 2


def test_compile_errors_show_the_command_and_output(cache: Cache) -> None:
    with pytest.raises(BuildError) as info:
        cc.load_library("broken", ["int x = ;"], cache=cache)
    text = str(info.value)
    assert "building library broken failed" in text
    assert "command: c++ -shared" in text and "error:" in text
    assert text.index("error:") < text.index("command:")  # the compiler's own words first
    # inline code is named after the artifact, without the scratch folder that is gone by now
    assert info.value.output.startswith("broken.cpp:1:"), info.value.output
    import traceback

    frames = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    assert not any("/engine/" in f for f in frames) and info.value.__cause__ is None, frames  # none of ours
    assert not list(cache.store.iter_variant_dirs())
    with pytest.raises(BuildError) as two:
        cc.load_library("two", ["int y = 1;", "int x = ;"], cache=cache)
    assert "two_1.cpp:1:" in two.value.output and scratch.PREFIX not in two.value.output


def test_bad_arguments_are_named(cache: Cache, tmp_path: Path) -> None:
    with pytest.raises(AbicacheError, match="unknown lang"):
        cc.load_library("x", [ADD], lang="fortran", cache=cache)
    with pytest.raises(AbicacheError, match="cannot read source file"):
        cc.load_library("x", [tmp_path / "missing.cpp"], cache=cache)
    with pytest.raises(AbicacheError, match="no source to compile"):
        cc.load_library("x", [{"only.h": ""}], cache=cache)
    with pytest.raises(AbicacheError, match="not a Python version"):
        cc.load_module("x", [module_source("x")], abi3="three", cache=cache)


def test_full_api_module_declares_this_interpreter(cache: Cache) -> None:
    mod = cc.load_module("twice_full", [module_source("twice_full")], cache=cache)
    assert mod.twice(21) == 42
    art = cc.build_module("twice_full", [module_source("twice_full")], cache=cache)
    abi = Facts().get("python.abi")
    assert f"python.abi == {abi}" in art.requirements.to_list()
    assert not any(r.startswith("python.abi3") for r in art.requirements.to_list())


def test_a_full_api_module_is_not_served_to_another_python(root: Path) -> None:
    src = [module_source("twice_other")]
    cc.build_module("twice_other", src, cache=Cache(root))
    other = Cache(root, facts=Facts().with_overrides({"python.abi": "cp399"}))
    assert not other.lookup("cc.module", "twice_other", _module_inputs(other, src))
    here = Facts().get("python.abi")
    why = other.explain("cc.module", "twice_other", _module_inputs(other, src))
    assert [str(d) for d in why.candidates[0].differences] == [
        f"extra.python.abi: {here} -> cp399",
        f"requirement python.abi == {here}: {here} -> cp399",
    ]


def _module_inputs(cache: Cache, src: list[str]):
    return cc.module_plan("twice_other", src, facts=cache.facts).inputs


def test_abi3_module_declares_a_minimum(cache: Cache) -> None:
    art = cc.build_module("twice3", [module_source("twice3")], abi3="3.10", cache=cache)
    assert "python.abi3 >= 3.10" in art.requirements.to_list()
    assert not any(r.startswith("python.abi ==") for r in art.requirements.to_list())
    assert art.files == ("twice3.abi3.so",)
    assert cc.import_extension("twice3", art.file()).twice(4) == 8


CROSS = textwrap.dedent("""
    import json, sys
    from abicache import Cache, cc
    art = cc.build_module("crossmod", [sys.argv[1]], abi3="3.10", cache=Cache(sys.argv[2]))
    mod = cc.import_extension("crossmod", art.file())
    print(json.dumps({"hit": art.hit, "key": art.key, "value": mod.twice(50), "py": sys.version[:4]}))
""")


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_abi3_module_built_here_is_a_hit_under_another_python(root: Path, version: str) -> None:
    """A real second interpreter: the hit path needs nothing but the standard library."""
    python = python_with_src(version)
    here = cc.build_module("crossmod", [module_source("crossmod")], abi3="3.10", cache=Cache(root))
    code = CROSS.replace("sys.argv[1]", repr(module_source("crossmod"))).replace("sys.argv[2]", repr(str(root)))
    out = run_py(code, python=python)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen == {"hit": True, "key": here.key, "value": 100, "py": version}


def test_an_abi3_module_is_refused_by_an_older_python(root: Path) -> None:
    cc.build_module("newabi", [module_source("newabi")], abi3="3.10", cache=Cache(root))
    inputs = _abi3_inputs(module_source("newabi"), "3.10")
    assert Cache(root).lookup("cc.module", "newabi", inputs).hit
    old = Cache(root, facts=Facts().with_overrides({"python.abi3": "3.9"}))
    assert old.lookup("cc.module", "newabi", inputs) is None
    free_threaded = Cache(root, facts=Facts().with_overrides({"python.abi3": None, "python.abi": "cp313t"}))
    assert free_threaded.lookup("cc.module", "newabi", inputs) is None


def test_abi3_newer_than_this_interpreter_is_refused_before_publishing(cache: Cache) -> None:
    with pytest.raises(BuildError, match=r"nothing was built: python.abi3 >= 3.99.*for_target\(\{'python.abi3': '3.99'\}\)"):
        cc.build_module("future", [module_source("future")], abi3="3.99", cache=cache)
    assert not list(cache.store.iter_variant_dirs())


def _abi3_inputs(src: str, abi3: str):
    return cc.module_plan("newabi", [src], abi3=abi3).inputs


def test_a_hit_needs_no_compiler_on_path(root: Path, tmp_path: Path) -> None:
    """An entry built here loads in a process whose PATH has no compiler (the key's
    tool identities are absent: looked up by what was asked for, asked.py); what
    was never built fails naming the missing compiler, and builds nothing."""
    import os
    import sys

    code = textwrap.dedent(f"""
        import sys
        from abicache import Cache, cc
        cache = Cache({str(root)!r})
        print(cc.load_library("adder", [{ADD!r}], cache=cache).add(2, 40))
        print(cc.load_module("twice", [{module_source("twice")!r}], lang="c", cache=cache).twice(21))
        art = cc.build_library("adder", [{ADD!r}], cache=cache)
        print(art.origin, art.manifest.inputs["tools"]["compiler.cxx"] is not None)
        if sys.argv[1:] == ["new"]:
            cc.load_library("other", ["int x() {{ return 1; }}"], cache=cache)
    """)
    built = run_py(code)
    assert built.returncode == 0 and built.stdout.split()[:2] == ["42", "42"], built.stderr
    bare = tmp_path / "bin"  # only the interpreter: no cc, c++, gcc, ld
    bare.mkdir()
    os.symlink(sys.executable, bare / "python3")
    env = {"PATH": str(bare), "CC": "", "CXX": ""}
    hit = run_py(code, env=env)
    assert hit.returncode == 0, hit.stderr
    assert hit.stdout.split() == ["42", "42", "local", "True"]  # the entry, recorded with its compiler
    missing = subprocess.run([sys.executable, "-c", code, "new"], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(SRC), **env}, timeout=120)
    assert missing.returncode == 1 and "compiler 'c++' not found" in missing.stderr, missing.stderr


def test_no_compiler_on_path_is_said_once_naming_the_library(tmp_path: Path) -> None:
    """A tree of two sources with no compiler anywhere on PATH: one error naming the library
    asked for (not the engine's unit object, slow.c), and no second warning about the
    observer, which needs that same compiler."""
    for name, body in (("slow.c", "int f(void) { return 1; }\n"), ("fast.c", "int g(void) { return 2; }\n")):
        (tmp_path / name).write_text(body)
    code = (f"import abicache.cc as cc; cc.load_library('mylib', [{str(tmp_path / 'slow.c')!r}, "
            f"{str(tmp_path / 'fast.c')!r}], lang='c')")
    out = run_py(code, env={"PATH": str(tmp_path / "nothing"), "ABICACHE_DIR": str(tmp_path / "s"), "CC": "",
                            "CXX": ""})
    assert out.returncode == 1
    assert out.stderr.count("compiler 'cc' not found while building library mylib") == 1, out.stderr
    assert "No prebuilt cc.library 'mylib'" in out.stderr and "cc.object" not in out.stderr, out.stderr
    assert "observer" not in out.stderr, out.stderr


def test_the_second_call_in_a_process_hashes_nothing_the_lookup_vouched_for(tmp_path: Path) -> None:
    """A process whose first call was a hit: its second call arms the in-process watch, and
    checked the entry again by hashing its system files (libc, crt objects, the compiler's
    libraries: 58 ms) where the stamp the lookup had just read vouched for them."""
    code = textwrap.dedent(f"""
        import json
        from abicache import Cache, cc
        from abicache.store import blobs
        cache = Cache({str(tmp_path / 's')!r})
        lib = cc.load_library("twice", ["int f(void) {{ return 3; }}\\n"], lang="c", cache=cache)
        hashed = []
        real = blobs.hash_file
        blobs.hash_file = lambda path, *a, **k: (hashed.append(str(path)), real(path, *a, **k))[1]
        again = cc.load_library("twice", ["int f(void) {{ return 3; }}\\n"], lang="c", cache=cache)
        print(json.dumps({{"value": again.f(), "hashed": hashed}}))
    """)
    first = run_py(code)  # builds, then its second call
    assert first.returncode == 0, first.stderr
    second = run_py(code)  # a hit, then its second call
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout.splitlines()[-1]) == {"value": 3, "hashed": []}
