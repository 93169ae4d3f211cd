"""abicache's torch build lines against torch's own: the installed torch's
cpp_extension writes its build.ninja for a corpus of calls (without running
it), and every compile and link line abicache would run is compared with it,
flag by flag. The differences that remain are the ones docs/guides/torch.md
lists, each with its reason (DOCUMENTED below); any other fails the test.

The CUDA lines are compared as text on any machine with nvcc: no GPU is needed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

torch_ext = pytest.importorskip("torch.utils.cpp_extension", reason="torch is not installed")

from abicache import torch as abitorch  # noqa: E402
from abicache.engine import units  # noqa: E402
from abicache.env import Facts  # noqa: E402

#: (name, cpp files, cu files, extra_cflags, extra_cuda_cflags, extra_ldflags, output, environment)
CORPUS = [
    ("cpu_module", ["a.cpp", "b.cpp"], [], ["-O3", "-fopenmp"], [], ["-fopenmp"], "module", {}),
    ("cpu_library", ["a.cpp"], [], ["-DFOO=1", "-Wno-unused"], [], ["-lm"], "library", {}),
    ("standalone", ["a.cpp"], [], ["-O2"], [], [], "executable", {}),
    ("mixed", ["a.cpp"], ["k.cu"], ["-Ofast", "-fopenmp"], ["-O3", "--use_fast_math"], ["-fopenmp"], "module",
     {"TORCH_CUDA_ARCH_LIST": "8.0;9.0+PTX"}),
    ("own_arch", ["a.cpp"], ["k.cu"], [], ["-gencode=arch=compute_90a,code=sm_90a"], [], "module", {}),
    ("ccbin_std", ["a.cpp"], ["k.cu"], ["-O2"], ["-std=c++17"], [], "library",
     {"TORCH_CUDA_ARCH_LIST": "Hopper", "CC": "gcc"}),
]

#: what abicache's lines have that torch's do not, and why (docs/guides/torch.md says the same)
DOCUMENTED = {
    "-ffile-prefix-map=": "paths in __FILE__ and debug info are made location-free, so two checkouts share a build",
    "-fPIC (link)": "the link gets the compile flags that matter at link time; -fPIC is one of them",
}


def _nvcc() -> str | None:
    """A toolkit's own nvcc (not a wrapper script elsewhere on PATH: its folder is not the toolkit's)."""
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for candidate in (os.path.join(home, "bin", "nvcc"), "/usr/local/cuda/bin/nvcc", shutil.which("nvcc")):
        if candidate and os.path.isfile(candidate) and (Path(candidate).resolve().parent.parent / "include").is_dir():
            return str(Path(candidate).resolve())
    return None


def _units(words: list[str]) -> list[str]:
    """Flags as units: an option and its separate argument are one; paths as the kernel finds them."""
    joined = {"-isystem", "-I", "-ccbin", "--compiler-options", "-Xcompiler", "-include", "-x"}
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in joined and i + 1 < len(words):
            arg = words[i + 1]
            out.append(f"{word} {os.path.realpath(arg) if word in ('-isystem', '-I') else arg}")
            i += 2
            continue
        if word.startswith("-I") and len(word) > 2:
            word = "-I " + os.path.realpath(word[2:])
        elif word.startswith("-L"):
            word = "-L " + os.path.normpath(word[2:])
        out.append(word)
        i += 1
    return out


def _ninja(tmp: Path, name: str, sources: list[str], cflags: list[str], cuda_cflags: list[str],
           ldflags: list[str], include: str, with_cuda: bool, standalone: bool) -> dict[str, list[str]]:
    """torch's lines for the call, from the build.ninja its cpp_extension writes."""
    prepared = torch_ext._prepare_ldflags(list(ldflags), with_cuda, False, False, standalone)
    path = tmp / "build.ninja"
    torch_ext._write_ninja_file_to_build_library(str(path), name, sources, list(cflags), list(cuda_cflags), [],
                                                 prepared, [include], with_cuda, False, standalone)
    variables = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition(" = ")
        if sep and not line.startswith(" "):
            variables[key] = shlex.split(value)
    return {"cxx": variables["cflags"] + variables.get("post_cflags", []),
            "nvcc": variables.get("cuda_cflags", []) + variables.get("cuda_post_cflags", []),
            "link": variables["ldflags"]}


def _abicache(tmp: Path, name: str, sources: list[str], cflags: list[str], cuda_cflags: list[str],
              ldflags: list[str], include: str, output: str, cuda: bool) -> dict[str, list[str]]:
    facts = Facts().with_overrides({"torch.flavor": "cuda"}) if cuda else Facts()
    plan = abitorch.plan(name, [Path(s) for s in sources], python_module=output == "module",
                         standalone=output == "executable", extra_cflags=cflags, extra_cuda_cflags=cuda_cflags,
                         extra_ldflags=ldflags, extra_include_paths=[include], facts=facts, with_cuda=cuda or None)
    assert plan.job is not None
    scratch = str(tmp / "scratch")
    lines = units.command_lines(plan.job, scratch, str(tmp / "out.so"))
    out: dict[str, list[str]] = {"cxx": [], "nvcc": [], "link": []}
    for argv, source in zip(lines, [*plan.job.tree.units, None]):
        if source is None:
            objects = {os.path.join(scratch, Path(u.name).name + ".o") for u in plan.job.tree.units}
            rest = [w for w in argv[len(plan.job.compiler):] if w not in objects]
            o = rest.index("-o")
            out["link"] = rest[:o] + rest[o + 2:]
        else:
            which = "nvcc" if source.name.endswith(".cu") else "cxx"
            body = argv[len(plan.job.cuda.nvcc if which == "nvcc" else plan.job.compiler):]
            body = [w for w in body if w not in ("-c", source.path)]
            o = body.index("-o")
            out[which] = body[:o] + body[o + 2:]
    return out


def _without_documented(kind: str, flags: list[str]) -> list[str]:
    flags = [f for f in flags if not f.startswith("-ffile-prefix-map=")]
    if kind == "link":
        flags.remove("-fPIC")
    return flags


def _cudart(flags: list[str]) -> list[str]:
    """The CUDA runtime on the link line: torch names CUDA_HOME's, abicache the one its loader
    finds first (a CUDA wheel's, by soname): the same library, not the same words."""
    return [f for f in flags if not (f.startswith("-l:libcudart") or f == "-lcudart"
                                     or (f.startswith("-L ") and ("cuda" in f.lower() or "nvidia" in f)))]


@pytest.mark.parametrize("case", CORPUS, ids=[c[0] for c in CORPUS])
def test_build_lines_are_torchs_own(case: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name, cpp, cu, cflags, cuda_cflags, ldflags, output, env = case
    if cu:
        nvcc = _nvcc()
        if nvcc is None:
            pytest.skip("nvcc is not installed: the CUDA lines cannot be derived")
        home = str(Path(nvcc).parent.parent)
        monkeypatch.setenv("CUDA_HOME", home)
        monkeypatch.setattr(torch_ext, "CUDA_HOME", home)  # read at its import
        monkeypatch.setenv("PATH", f"{Path(nvcc).parent}{os.pathsep}{os.environ['PATH']}")  # abicache's search
    for variable in ("CC", "CXX", "TORCH_CUDA_ARCH_LIST", "PYTORCH_NVCC"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.chdir(tmp_path)
    include = tmp_path / "include"
    include.mkdir()
    sources = []
    for file in [*cpp, *cu]:
        (tmp_path / file).write_text("int x;\n")
        sources.append(str(tmp_path / file))
    theirs = _ninja(tmp_path, name, sources, cflags, cuda_cflags, ldflags, str(include), bool(cu),
                    output == "executable")
    ours = _abicache(tmp_path, name, sources, cflags, cuda_cflags, ldflags, str(include), output, bool(cu))
    for kind in ("cxx", "nvcc", "link"):
        mine, torchs = _without_documented(kind, _units(ours[kind])), _units(theirs[kind])
        if kind == "link":
            mine, torchs = _cudart(mine), _cudart(torchs)
        assert Counter(mine) == Counter(torchs), f"{kind}: abicache {mine}\n torch {torchs}"
        if cflags and kind == "cxx":  # the caller's flags come after torch's -std, so theirs win
            assert mine.index(cflags[0]) > max(i for i, f in enumerate(mine) if f.startswith("-std="))
        if ldflags and kind == "link":  # and the caller's link flags before torch's libraries, as in torch
            assert mine.index(ldflags[0]) < mine.index("-lc10")


def test_extra_cflags_reach_the_cpp_compiler_only_and_a_mixed_extension_compiles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real project's flags (-Ofast -fopenmp for C++, nvcc's own for .cu): nvcc
    used to get -Ofast and stop (`nvcc fatal: 'fast': expected a number`)."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.cpp").write_text("#include <torch/extension.h>\nint twice(int x) { return 2 * x; }\n")
    (tmp_path / "k.cu").write_text("__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n")
    facts = Facts().with_overrides({"torch.flavor": "cuda"})
    plan = abitorch.plan("mixed", [Path("a.cpp"), Path("k.cu")], extra_cflags=["-Ofast", "-fopenmp"],
                         extra_cuda_cflags=["-O3"], facts=facts)
    assert plan.job is not None and plan.job.cuda is not None
    assert "-Ofast" not in plan.job.cuda.flags and "-Ofast" in plan.job.tree.flags
    for argv in units.command_lines(plan.job, str(tmp_path), str(tmp_path / "out.so"))[:-1]:  # compile, no link
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{argv[0]}: {done.stderr[-2000:]}"


def test_torch_cuda_arch_list_changed_in_one_process_is_another_key(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if _nvcc() is None:
        pytest.skip("nvcc is not installed")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    facts = Facts().with_overrides({"torch.flavor": "cuda"})
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    first = abitorch.plan("k", [Path("k.cu")], facts=facts)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    second = abitorch.plan("k", [Path("k.cu")], facts=facts)
    assert first.inputs != second.inputs  # the key (load()'s in-process memo holds the whole environment:
    # tests/test_hits.py test_the_memo_serves_no_call_after_the_environment_changed)
    assert any("sm_90" in f for f in second.job.cuda.flags)


def test_flags_split_as_the_shell_splits_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """lenient() splits a flag that is a list of options as shlex does (the shell that runs
    ninja's lines), and finds the words of a flag without quotes or backslashes without shlex:
    the same words for random flags of blanks, shell and non-ASCII spaces, quotes, backslashes
    and '#'; a flag that is not a list of options is one argument (below); $CXX's words
    (env/toolid.py) are split as the shell splits them."""
    import random

    from abicache.engine.jitargs import SHELL_BLANKS, _options, lenient
    from abicache.env.toolid import command

    rng, alphabet, compared = random.Random(31), " \t\r\n\x0b\x0c\xa0\u2003aO2-=#\"'\\", 0
    for _ in range(20000):
        flag = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        try:
            want = tuple(shlex.split(flag))
        except ValueError:  # an unbalanced quote: shlex refuses it, and so does lenient
            with pytest.raises(ValueError):
                lenient([flag])
            continue
        assert lenient([flag]) == (want if len(want) < 2 or _options(want) else (flag.strip(SHELL_BLANKS),)), repr(flag)
        if compared % 50 == 0 and "\0" not in flag:
            monkeypatch.setenv("ABICACHE_TEST_CXX", flag)
            assert command("ABICACHE_TEST_CXX", "c++") == (want or ("c++",)), repr(flag)
        compared += 1
    assert compared > 10000 and lenient(["-O2\n", " -g ", "-O2 -g"]) == ("-O2", "-g", "-O2", "-g")


def test_a_flag_that_is_not_a_list_of_options_is_one_argument(tmp_path: Path) -> None:
    """["-I", "/path/sp ace"] was two words, "/path/sp" and "ace" (torch's shell breaks it too);
    the compiler takes it whole. "-O3 -march=native" stays two, as torch users write it."""
    from abicache.engine.jitargs import lenient

    assert lenient(["-I", " /path/sp ace\n", "-O3 -march=native", "-I /usr/inc", "-DNAME=a b", "-I/p/sp ace",
                    "-DQ=\"a b\""]) == ("-I", "/path/sp ace", "-O3", "-march=native", "-I", "/usr/inc",
                                         "-DNAME=a b", "-I/p/sp ace", "-DQ=a b")
    spaced = tmp_path / "sp ace"
    spaced.mkdir()
    (spaced / "v.h").write_text("#define VALUE 7\n")
    plan = abitorch.plan("spaced", {"x.cpp": '#include "v.h"\nint f() { return VALUE; }\n'}, python_module=False,
                         extra_cflags=["-I", str(spaced)])
    assert plan.job.tree.flags == (f"-I{spaced}",)  # one folder, the one named


def test_cudart_is_linked_from_the_first_folder_that_has_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-lcudart names the runtime of the first folder of the search order that holds one:
    by -lcudart where it has the unversioned name (a real file), else by its highest soname
    as text sorts them (the CUDA wheels ship no libcudart.so)."""
    from abicache.engine.jitargs import cudart_link
    from abicache.env import cuda_probe

    empty, wheel, toolkit = (tmp_path / n for n in ("empty", "wheel", "toolkit"))
    for folder in (empty, wheel, toolkit):
        folder.mkdir()
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.13.0.48", "libcudart.so.x1"):
        (wheel / name).write_bytes(b"")
    (toolkit / "libcudart.so.13").write_bytes(b"")
    (toolkit / "libcudart.so").symlink_to("libcudart.so.13")
    (empty / "libcudart.so").symlink_to("nowhere")  # dangling: not a runtime
    monkeypatch.setattr(cuda_probe, "runtime_dirs", lambda: [tmp_path / "absent", empty, wheel, toolkit])
    assert cudart_link(["-lcudart", "-lm"]) == [f"-L{wheel}", "-l:libcudart.so.13", "-lm"]
    monkeypatch.setattr(cuda_probe, "runtime_dirs", lambda: [empty, toolkit, wheel])
    assert cudart_link(["-lcudart"]) == [f"-L{toolkit}", "-lcudart"]
    assert cudart_link(["-lm"]) == ["-lm"]
    monkeypatch.setattr(cuda_probe, "runtime_dirs", lambda: [empty])
    assert cudart_link(["-lcudart"]) == ["-lcudart"]
