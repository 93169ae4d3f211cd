"""abicache.torch as a drop-in for torch.utils.cpp_extension: every argument of
load_inline and load in torch's order, the same meanings and return values,
the same exception types, and what torch does on a same-name reload.
(pytorch's own test_cpp_extensions_jit.py, run through install(): see the note.)"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from abicache import Cache
from abicache.errors import BuildError, UsageError
from conftest import SRC, run_py
from corpus import TORCH_STABLE, torch_root

pytestmark = pytest.mark.usefixtures("_torch")


@pytest.fixture(scope="module")
def _torch() -> None:
    torch_root()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Cache:
    return Cache(tmp_path_factory.mktemp("dropin-store"))


@pytest.mark.parametrize("name", ["load_inline", "load"])
def test_every_torch_parameter_in_torch_order(name: str) -> None:
    from torch.utils import cpp_extension

    import abicache.torch as at

    theirs = list(inspect.signature(getattr(cpp_extension, name)).parameters.values())
    ours = list(inspect.signature(getattr(at, name)).parameters.values())
    # the installed torch's are a prefix of ours; ours go on with those of the newest torch abicache knows
    assert [p.name for p in ours[:len(theirs)]] == [p.name for p in theirs]
    assert [p.default for p in ours[:len(theirs)]] == [p.default for p in theirs]
    positional = [p for p in ours[len(theirs):] if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [p.name for p in positional] == [p for p in NEWEST_TORCH[name] if p not in {t.name for t in theirs}]
    assert all(p.kind is p.KEYWORD_ONLY for p in ours[len(theirs) + len(positional):-1])  # abicache's own: stable=, ...
    assert ours[-1].kind is ours[-1].VAR_KEYWORD  # a newer torch's parameter: torch's own call (below)


#: what torch 2.15 (the newest) added after 2.13's parameters, in its order
NEWEST_TORCH = {"load_inline": ["gil_not_used"], "load": []}


def test_gil_not_used_declares_it_in_the_bindings_as_torch_2_15_does(store: Cache) -> None:
    """load_inline(gil_not_used=True): `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m, pybind11::mod_gil_not_used())`,
    torch 2.15's line, a source of its own (another key); the module builds and runs."""
    import abicache.torch as at

    declared = at.inline_sources("m", "int f();", ["f"], False, True, gil_not_used=True)["main.cpp"]
    assert "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m, pybind11::mod_gil_not_used()) {" in declared
    assert "mod_gil_not_used" not in at.inline_sources("m", "int f();", ["f"], False, True)["main.cpp"]
    source = "#include <pybind11/pybind11.h>\nint f() { return 5; }"
    module = at.load_inline("dropin_nogil", source, functions="f", gil_not_used=True, cache=store, **PYBIND_ONLY)
    plain = at.build_inline("dropin_nogil", source, functions="f", cache=store, **PYBIND_ONLY)
    assert module.f() == 5 and plain.key != at.build_inline("dropin_nogil", source, functions="f", cache=store,
                                                            gil_not_used=True, **PYBIND_ONLY).key


NEWER_TORCH = []  # the calls the stand-in for a newer torch's function received


def _newer(name: str, *args: object, shiny_new: bool = False, **kwargs: object) -> str:
    """torch's function as a later release may have it: one parameter more."""
    NEWER_TORCH.append({"name": name, "shiny_new": shiny_new, **kwargs})
    return f"torch's own {name}"


@pytest.mark.parametrize("function", ["load_inline", "load"])
def test_a_parameter_abicache_does_not_know_runs_torchs_own_call(function: str, monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """torch 2.15 added load_inline(gil_not_used=): under install() a call passing it was a
    TypeError where torch runs it. A parameter abicache does not know hands the call to torch's
    own function (here a stand-in with one parameter more), with one warning naming it."""
    import torch.utils.cpp_extension as ce

    import abicache.torch as at
    from abicache.errors import AbicacheWarning

    NEWER_TORCH.clear()
    monkeypatch.setattr(ce, function, _newer)
    source = "int f();" if function == "load_inline" else [str(tmp_path / "f.cpp")]
    at.install()
    try:
        with pytest.warns(AbicacheWarning, match=f"shiny_new is a parameter of a newer torch.*torch's own {function}"):
            got = getattr(ce, function)("dropin_newer", source, verbose=True, shiny_new=True)
    finally:
        at.uninstall()
    assert got == "torch's own dropin_newer" and getattr(ce, function) is _newer
    second = "cpp_sources" if function == "load_inline" else "sources"
    assert NEWER_TORCH == [{"name": "dropin_newer", "shiny_new": True, second: source, "verbose": True}]
    with pytest.raises(UsageError, match="takes no cache="):  # abicache's own keywords are not torch's
        getattr(at, function)("dropin_newer", source, shiny_new=True, cache=Cache(tmp_path / "store"))


def test_a_parameter_torch_does_not_know_either_is_torchs_type_error() -> None:
    import abicache.torch as at
    from abicache.errors import AbicacheWarning

    with pytest.warns(AbicacheWarning, match="no_such_parameter"), pytest.raises(TypeError, match="no_such_parameter"):
        at.load_inline("dropin_bogus", "int f();", no_such_parameter=1)


#: a module source that includes pybind11 alone (no_implicit_headers=True, bindings without torch's
#: error wrapper): 4 s to build instead of 18 for all of torch/extension.h. For the tests about
#: names, reloads and routing, where what the module includes plays no part.
PYBIND_ONLY = {"no_implicit_headers": True, "with_pytorch_error_handling": False}


def test_same_name_new_code_returns_the_new_module(store: Cache) -> None:
    """torch renames the module (name_v1); importing the new file under the old name
    handed back the first module."""
    import abicache.torch as at

    def f(value: int) -> str:
        return f"#include <pybind11/pybind11.h>\nint f() {{ return {value}; }}"

    first = at.load_inline("dropin_reload", f(123), functions="f", cache=store, **PYBIND_ONLY)
    second = at.load_inline("dropin_reload", f(456), functions="f", cache=store, **PYBIND_ONLY)
    again = at.load_inline("dropin_reload", f(123), functions="f", cache=store, **PYBIND_ONLY)
    assert (first.f(), second.f(), again.f()) == (123, 456, 123)
    assert again is first and second is not first


def test_positional_call_lenient_flags_and_build_directory(store: Cache, tmp_path: Path) -> None:
    import abicache.torch as at

    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "answer.h").write_text("#define ANSWER (DROPIN_A + DROPIN_B)\n")
    build = tmp_path / "build"
    # torch's order: name, cpp_sources, cuda_sources, sycl_sources, functions, extra_cflags,
    # extra_cuda_cflags, extra_sycl_cflags, extra_ldflags, extra_include_paths, build_directory
    module = at.load_inline("dropin_positional", '#include "answer.h"\nint64_t answer() { return ANSWER; }', None,
                            None, ["answer"], ["-DDROPIN_A=40 -DDROPIN_B=2\n\n", " -O1 "], None, None, None, [f"  {inc}\n"],
                            str(build), cache=store)
    assert module.answer() == 42
    built = list(build.glob("dropin_positional*.so"))
    assert len(built) == 1 and (build / "main.cpp").read_text().startswith("#include <torch/extension.h>")
    assert module.__file__ != str(built[0])  # what runs is the checked file in the store


def test_functions_with_a_library_return_its_path(store: Cache) -> None:
    """test_returns_shared_library_path_when_is_python_module_is_true: torch binds the
    functions and loads the library as ops; abicache refused functions= there."""
    import torch

    import abicache.torch as at

    source = """
    #include <torch/script.h>
    torch::Tensor dropin_func(torch::Tensor x) { return x * 2; }
    static torch::RegisterOperators r("dropin::func", &dropin_func);
    """
    path = at.load_inline("dropin_library", source, functions="dropin_func", is_python_module=False, cache=store)
    assert isinstance(path, str) and path.endswith(".so") and Path(path).is_file()
    assert torch.equal(torch.ops.dropin.func(torch.ones(2)), torch.full((2,), 2.0))


def test_errors_are_the_exception_types_torch_raises(store: Cache) -> None:
    import abicache.torch as at

    with pytest.raises(RuntimeError) as broken:  # callers' `except RuntimeError:` fallbacks
        at.load_inline("dropin_broken", "int main() { return 0 }", cache=store, **PYBIND_ONLY)
    assert isinstance(broken.value, BuildError) and "int main() { return 0 }" in str(broken.value)  # the compiler's output
    with pytest.raises(ValueError, match="Expected 'functions' to be a list or dict"):
        at.load_inline("dropin_bad_functions", "", functions=5, cache=store)
    with pytest.raises(ValueError, match="SYCL sources are not supported by abicache.torch"):
        at.load_inline("dropin_sycl", "", sycl_sources="void k() {}", cache=store)
    with pytest.raises(ValueError, match="with_cuda=False, but dropin_nocuda has CUDA sources"):
        at.load_inline("dropin_nocuda", "", cuda_sources="__global__ void k() {}", with_cuda=False, cache=store)
    with pytest.raises(ValueError, match="mutually exclusive"):
        at.load("dropin_both", ["x.cpp"], is_python_module=True, is_standalone=True, cache=store)
    assert issubclass(UsageError, ValueError) and issubclass(BuildError, RuntimeError)


def test_error_handling_and_implicit_headers_shape_the_source() -> None:
    import abicache.torch as at

    wrapped = at.inline_sources("m", "int f();", ["f"], False, True)["main.cpp"]
    bare = at.inline_sources("m", "int f();", ["f"], False, True, error_handling=False)["main.cpp"]
    raw = at.inline_sources("m", "int f();", None, False, True, "__global__ void k() {}",
                            implicit_headers=False)
    assert 'm.def("f", torch::wrap_pybind_function(f), "f");' in wrapped
    assert 'm.def("f", f, "f");' in bare
    assert raw == {"main.cpp": "int f();", "cuda.cu": "__global__ void k() {}"}


def test_single_source_path_and_standalone_executable(store: Cache, tmp_path: Path) -> None:
    import abicache.torch as at

    main = tmp_path / "prog.cpp"
    main.write_text("#include <torch/torch.h>\n#include <iostream>\n"
                    "int main() { std::cout << torch::ones({2, 2}).sum().item<float>() << std::endl; }\n")
    exe = at.load("dropin_exe", str(main), is_python_module=False, is_standalone=True, cache=store)
    assert os.access(exe, os.X_OK)
    assert subprocess.run([exe], capture_output=True, text=True, check=True).stdout.strip() == "4"


DOUBLE_STABLE = textwrap.dedent("""
    import sys
    import abicache.torch as at
    from abicache import Cache
    cache = Cache(sys.argv[1])
    at.load_inline("dropin_stable", [sys.argv[2]], stable=True, cache=cache)
    at.load_inline("dropin_stable", [sys.argv[2]], stable=True, cache=cache)  # the same build: fine
    try:
        at.load_inline("dropin_stable", [sys.argv[2]], stable=True, target="2.10", cache=cache)
    except ValueError as exc:
        print("refused:", exc)
""")


def test_a_second_build_of_one_stable_op_library_is_refused_not_a_crash(tmp_path: Path) -> None:
    """torch.ops.load_library segfaults on it (the torch guide's own example did this)."""
    done = subprocess.run([sys.executable, "-c", DOUBLE_STABLE, str(tmp_path / "store"), TORCH_STABLE],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: the stable op library 'abicache_stable' is already loaded in this process" in done.stdout
    assert "Start a new process" in done.stdout


def test_install_routes_cpp_extension_and_uninstall_restores(store: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils.cpp_extension as ce

    import abicache.torch as at

    original = ce.load_inline
    at.install()
    try:
        assert ce.load_inline is at.load_inline and ce.load is at.load
        monkeypatch.setenv("ABICACHE_DIR", str(store.store.root))
        module = ce.load_inline("dropin_installed", "#include <pybind11/pybind11.h>\nint64_t seven() { return 7; }",
                                functions="seven", **PYBIND_ONLY)
        assert module.seven() == 7 and str(store.store.root) in module.__file__
    finally:
        at.uninstall()
    assert ce.load_inline is original


def test_a_header_edit_reloads_a_python_module_in_the_same_process(store: Cache, tmp_path: Path) -> None:
    """A notebook edits a header and calls load() again: the new module, not the imported one."""
    import time

    import abicache.torch as at

    (tmp_path / "value.h").write_text("#define VALUE 41\n")
    # pybind11 alone, not all of torch/extension.h: the header that matters here is value.h
    (tmp_path / "ext.cpp").write_text('#include <pybind11/pybind11.h>\n#include "value.h"\n'
                                      "int64_t value() { return VALUE; }\n"
                                      'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("value", &value); }\n')
    first = at.load("dropin_header", [tmp_path / "ext.cpp"], cache=store)
    time.sleep(0.05)
    (tmp_path / "value.h").write_text("#define VALUE 99\n")
    second = at.load("dropin_header", [tmp_path / "ext.cpp"], cache=store)
    assert (first.value(), second.value()) == (41, 99)


def test_install_after_a_name_was_imported_says_that_name_keeps_torchs_own() -> None:
    """`from torch.utils.cpp_extension import load_inline`, then install(): the name keeps
    torch's function (patching the module cannot change it); that was silent."""
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from torch.utils.cpp_extension import load_inline\n"
            "import abicache.torch as at\n"
            "at.install()\n"
            "import torch.utils.cpp_extension as ce\n"
            "print(ce.load_inline is at.load_inline, load_inline is at.load_inline)\n")
    out = run_py(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]
    assert out.stderr.count("__main__.load_inline is torch.utils.cpp_extension.load_inline as it was before "
                            "install()") == 1, out.stderr
    assert "load " not in out.stderr  # only the name that was bound
    clean = run_py("import warnings; warnings.simplefilter('always')\nimport abicache.torch as at\nat.install()\n"
                   "from torch.utils.cpp_extension import load_inline\nprint(load_inline is at.load_inline)\n")
    assert clean.stdout.split() == ["True"] and "abicache" not in clean.stderr, clean.stderr
