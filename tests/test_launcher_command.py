"""The launcher's reading of a compiler command line (src/abicache/launcher/command.py):
what it may cache and why not, and the names of the files a compile writes, checked
against the real compilers (every file a compile wrote is one the launcher named)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from abicache.launcher.command import Compile, Depfile, Uncacheable, classify, family
from conftest import need

NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)


@pytest.mark.parametrize("word, expected", [
    ("gcc", "gcc"), ("g++", "gcc"), ("cc", "gcc"), ("c++", "gcc"), ("/usr/bin/x86_64-linux-gnu-g++-12", "gcc"),
    ("clang++-17", "gcc"), ("clang", "gcc"), ("gcc-12.2", "gcc"), ("/usr/local/cuda/bin/nvcc", "nvcc"),
    ("ccache", None), ("ld", None), ("python3", None), ("distcc", None), ("icc", None), ("", None),
])
def test_the_compilers_it_knows(word: str, expected: str | None) -> None:
    assert family(word) == expected


@pytest.mark.parametrize("argv, reason", [
    (["gcc", "x.c", "-o", "x"], "link"),
    (["g++", "x.o", "y.o", "-shared", "-o", "liby.so"], "link"),
    (["g++", "-E", "x.cpp"], "preprocessing only (-E)"),
    (["g++", "-S", "-c", "x.cpp"], "assembly output (-S)"),
    (["g++", "-M", "x.cpp"], "dependencies only (-M)"),
    (["g++", "-c", "x.cpp", "y.cpp"], "several sources"),
    (["g++", "-c"], "no source"),
    (["g++", "-c", "x.o"], "not a source (linker input with -c)"),
    (["g++", "-c", "@args.rsp"], "response file"),
    (["g++", "-c", "-x", "c", "-"], "source from standard input"),
    (["g++", "-c", "x.cpp", "-o", "-"], "output to standard output"),
    (["g++", "-c", "x.cpp", "-save-temps=obj"], "-save-temps"),
    (["g++", "-c", "x.cpp", "-fdump-tree-all"], "-fdump-*"),
    (["g++", "-c", "x.cpp", "-fprofile-use=prof"], "profile feedback"),
    (["g++", "-c", "x.cpp", "-fprofile-generate"], "profile instrumentation"),
    (["g++", "-c", "x.cpp", "-o"], "-o without its value"),
    (["ccache", "g++", "-c", "x.cpp"], "unknown compiler"),
    ([], "no compiler named"),
    (["nvcc", "k.cu", "-o", "k"], "link"),
    (["nvcc", "-dlink", "k.o", "-o", "d.o"], "link"),
    (["nvcc", "-c", "k.cu", "--keep"], "--keep"),
    (["nvcc", "-E", "k.cu"], "preprocessing only (-E)"),
    (["nvcc", "-c", "-ptx", "k.cu"], "several output kinds"),
    (["nvcc", "-c", "k.cu", "-MD"], "-MD without -MF"),
    (["nvcc", "-c", "k.cu", "--options-file", "f"], "response file"),
    (["nvcc", "-c", "k.cu", "--time", "times.csv"], "--time (a timing file)"),
])
def test_what_it_runs_as_written_and_why(argv: list[str], reason: str) -> None:
    assert classify(argv) == Uncacheable(reason)


def test_a_dependency_file_named_by_the_environment_is_run_as_written() -> None:
    """gcc writes the file DEPENDENCIES_OUTPUT names, which no word shows (ccache 4.7 ran no
    compiler at all there, and left no object)."""
    assert classify(["g++", "-c", "x.cpp"], {"DEPENDENCIES_OUTPUT": "x.d"}) == Uncacheable("DEPENDENCIES_OUTPUT set")
    assert isinstance(classify(["g++", "-c", "x.cpp"], {"DEPENDENCIES_OUTPUT": ""}), Compile)
    assert classify(["nvcc", "-c", "k.cu"], {"SUNPRO_DEPENDENCIES": "k.d"}) == Uncacheable("DEPENDENCIES_OUTPUT set")


def test_a_compile_keeps_every_word_but_the_source_and_the_output() -> None:
    got = classify(["g++", "-O2", "-I", "inc", "-c", "src/x.cpp", "-DX=1", "-o", "obj/x.o", "-MD", "-MT", "x.o",
                    "-MP", "-std=c++17"])
    assert got == Compile(("g++",), "gcc", "src/x.cpp", "c++", "obj/x.o",
                          ("-O2", "-I", "inc", "-c", "-DX=1", "-MD", "-MT", "x.o", "-MP", "-std=c++17"),
                          Depfile("obj/x.d", ("-MT", "x.o"), True, True), ())
    assert got.outputs == ("obj/x.o", "obj/x.d")


def test_mf_without_md_names_no_depfile() -> None:
    """gcc refuses -MF alone ("you must specify either -M or -MM"): a failed compile, which
    is run and never cached; the words are flags."""
    got = classify(["g++", "-c", "x.cpp", "-MF", "x.d"])
    assert isinstance(got, Compile) and got.depfile is None and got.outputs == ("x.o",)


def test_the_language_follows_x_and_the_extension() -> None:
    assert classify(["gcc", "-c", "-x", "c++", "x.inc"]).language == "c++"  # type: ignore[union-attr]
    assert classify(["gcc", "-c", "-xc", "x.inc"]).language == "c"  # type: ignore[union-attr]
    assert classify(["gcc", "-c", "x.S"]).language == "assembler-with-cpp"  # type: ignore[union-attr]
    assert classify(["nvcc", "-c", "-x", "cu", "k.cpp"]).language == "cuda"  # type: ignore[union-attr]


# Each command's files, as the launcher names them, against what the compiler wrote.
GCC_CASES = [
    ["-c", "x.cpp"],
    ["-c", "src/x.cpp"],
    ["-c", "x.cpp", "-o", "obj/y.o"],
    ["-c", "x.cpp", "-oobj/y.o"],
    ["-c", "x.cpp", "-o", "obj/y.obj", "-MD"],
    ["-c", "x.cpp", "-o", "obj/noext", "-MMD"],
    ["-c", "src/x.cpp", "-MD"],
    ["-c", "x.cpp", "-o", "obj/y.o", "-MMD", "-MF", "deps/y.dep", "-MT", "y", "-MP"],
    ["-c", "x.cpp", "-o", "obj/y.o", "-Wp,-MD,deps/y.dd"],
    ["-c", "x.cpp", "-o", "obj/y.o", "-g", "-gsplit-dwarf"],
    ["-c", "x.cpp", "-o", "obj/y.o", "--coverage"],
    ["-c", "x.cpp", "-o", "obj/y.o", "-fstack-usage"],
]


@pytest.mark.parametrize("words", GCC_CASES, ids=[" ".join(c) for c in GCC_CASES])
def test_the_files_it_names_are_the_files_gcc_writes(tmp_path: Path, words: list[str]) -> None:
    need("g++")
    _check_outputs(tmp_path, ["g++", *words], {"x.cpp": "int f() { return 1; }\n"})


NVCC_CASES = [
    ["-c", "k.cu"],
    ["-c", "k.cu", "-o", "obj/k.o", "-MD", "-MF", "deps/k.d"],
    ["-ptx", "k.cu"],
    ["-cubin", "-arch=sm_90", "k.cu", "-o", "obj/k.cubin"],
    ["-fatbin", "k.cu"],
    ["-use_fast_math", "-o", "obj/k.o", "-c", "k.cu", "--extensible-whole-program"],  # flags without values
]


@pytest.mark.parametrize("words", NVCC_CASES, ids=[" ".join(c) for c in NVCC_CASES])
def test_the_files_it_names_are_the_files_nvcc_writes(tmp_path: Path, words: list[str]) -> None:
    if NVCC is None:
        pytest.skip("nvcc not found (on PATH or in /usr/local/cuda/bin)")
    _check_outputs(tmp_path, [NVCC, *words], {"k.cu": "__global__ void k(float *x) { x[0] = 1; }\n"})


def _check_outputs(tmp_path: Path, argv: list[str], sources: dict[str, str]) -> None:
    for name, code in sources.items():
        for folder in ("", "src"):
            (tmp_path / folder).mkdir(exist_ok=True)
            (tmp_path / folder / name).write_text(code)
    for folder in ("obj", "deps"):
        (tmp_path / folder).mkdir()
    before = _files(tmp_path)
    got = classify(argv)
    assert isinstance(got, Compile), got
    subprocess.run(argv, cwd=tmp_path, check=True, capture_output=True)
    written = _files(tmp_path) - before
    assert written == {os.path.normpath(p) for p in got.outputs}, (got, written)


def _files(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}
