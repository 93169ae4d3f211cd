"""PyTorch frontend: classic and stable-ABI extensions, rebuilt exactly when they must be.

    import abicache.torch as at
    mod = at.load_inline("ext", [SRC], functions=["add"])            # pybind module
    at.load_inline("ops", [OPS], is_python_module=False)             # TORCH_LIBRARY ops
    at.load_inline("sops", [STABLE_OPS], stable=True)                # stable ABI, built once

A drop-in for the common uses of torch.utils.cpp_extension.load_inline / load
(same argument names where they mean the same), compiling directly against the
installed torch's headers and libraries, found without importing torch:

- classic builds (pybind modules, TORCH_LIBRARY ops) are keyed on the full
  torch build (version with local tag, git, CUDA/HIP, C++ ABI) and require it;
  a pybind module also requires this Python ABI;
- stable builds are keyed on their TORCH_TARGET_VERSION and never on the
  installed torch: one build serves every torch >= the target. The default
  target is the oldest one the code compiles against (2.9 first, then each
  version the installed headers define).

The audit confirms each: a "stable" build that imports unstable symbols fails.
Loading a torch extension needs torch itself, so loading imports torch;
finding the cached build does not.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from .cache import Artifact, Cache, default_cache
from .cc import (Plan, _compile, _fingerprint, _load_once, _where, compiler_command, import_extension,
                 run_compiler)
from .env import Facts
from .errors import AbicacheError, BuildError
from .key import Inputs

STABLE_FLOOR = "2.9"  # the first LibTorch stable ABI release
_CU_SUFFIXES = (".cu", ".cuh")


class TorchInstall:
    """Where the installed torch keeps its headers and libraries (no import)."""

    def __init__(self, facts: Facts) -> None:
        root = facts.get("torch.root")
        if not root:
            raise AbicacheError("torch is not installed in this environment; "
                                "install it (e.g. pip install torch) to build torch extensions")
        self.root = Path(root)
        self.facts = facts

    @property
    def includes(self) -> list[str]:
        inc = self.root / "include"
        return ["-isystem", str(inc), "-isystem", str(inc / "torch" / "csrc" / "api" / "include")]

    @property
    def lib_dir(self) -> str:
        return str(self.root / "lib")

    def stable_targets(self) -> list[str]:
        """Candidate TORCH_TARGET_VERSIONs, oldest first: 2.9, then the headers' own."""
        header = self.root / "include" / "torch" / "csrc" / "stable" / "version.h"
        try:
            found = re.findall(r"#define TORCH_VERSION_(\d+)_(\d+)_0\b", header.read_text())
        except OSError:
            found = []
        versions = sorted({(int(a), int(b)) for a, b in found})
        return [STABLE_FLOOR] + [f"{a}.{b}" for a, b in versions if (a, b) > (2, 9)]


def target_macro(version: str) -> str:
    """'2.10' -> '-DTORCH_TARGET_VERSION=0x020a000000000000' (MAJ<<56 | MIN<<48)."""
    match = re.fullmatch(r"(\d+)\.(\d+)", version)
    if match is None:
        raise AbicacheError(f"target={version!r} is not a torch version like '2.10'")
    major, minor = int(match.group(1)), int(match.group(2))
    return f"-DTORCH_TARGET_VERSION={(major << 56) | (minor << 48):#018x}"


def inline_sources(name: str, cpp_sources: Sequence[str] | str, functions: Any, stable: bool,
                   python_module: bool) -> dict[str, str]:
    """main.cpp as cpp_extension.load_inline writes it."""
    parts = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources)
    if not stable:
        parts.insert(0, "#include <torch/extension.h>")
    if functions is not None:
        if stable or not python_module:
            raise AbicacheError("functions= makes pybind11 bindings: it needs a classic python module "
                                "(stable=False, is_python_module=True)")
        parts.append(_bindings(functions))
    return {"main.cpp": "\n".join(parts)}


def _bindings(functions: Any) -> str:
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, Mapping):
        docs = dict(functions)
    elif isinstance(functions, (list, tuple)):
        docs = {f: f for f in functions}
    else:
        raise AbicacheError(f"functions must be a name, a list or a dict, not {type(functions).__name__}")
    lines = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    lines += [f'm.def("{f}", torch::wrap_pybind_function({f}), "{d}");' for f, d in docs.items()]
    return "\n".join(lines + ["}"])


def plan(name: str, sources: Mapping[str, str], *, stable: bool = False, target: str | None = None,
         python_module: bool = True, extra_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
         extra_include_paths: Sequence[str] = (), verbose: bool = False, facts: Facts | None = None) -> Plan:
    """What to build and how it is keyed, for a classic or stable extension."""
    facts = facts or default_cache().facts
    torch = TorchInstall(facts)
    cpp = {n: c for n, c in sources.items() if not n.endswith(_CU_SUFFIXES)}
    cuda = {n: c for n, c in sources.items() if n.endswith(_CU_SUFFIXES)}
    includes = [f"-I{p}" for p in extra_include_paths]
    if stable:
        if cuda:
            raise AbicacheError("stable=True with CUDA sources is not supported yet; build the kernels "
                                "with abicache.cuda and call them from a stable op")
        return _stable_plan(name, cpp, torch, target, includes, extra_cflags, extra_ldflags, verbose)
    return _classic_plan(name, cpp, cuda, torch, python_module, includes, extra_cflags, extra_ldflags, verbose)


def _classic_plan(name: str, cpp: dict[str, str], cuda: dict[str, str], torch: TorchInstall,
                  python_module: bool, includes: list[str], cflags: Sequence[str],
                  ldflags: Sequence[str], verbose: bool) -> Plan:
    import sysconfig

    facts = torch.facts
    python_include = ["-isystem", sysconfig.get_paths()["include"]]
    abi = facts.get("torch.cxx11abi")
    defines = [f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    defines += [f"-D_GLIBCXX_USE_CXX11_ABI={abi}"] if abi in ("0", "1") else []
    # cpp_extension's own flags: no -O level unless the caller passes one.
    flags = ["-shared", "-fPIC", "-std=c++20", *defines, *cflags]
    libs = ["-lc10", "-ltorch_cpu", "-ltorch"] + (["-ltorch_python"] if python_module else [])
    # torch/extension.h includes Python.h: every classic build is tied to this
    # interpreter's ABI (cpp_extension keys its folder on py311 for the same reason).
    python_abi = facts.get("python.abi") or "unknown"
    tools = ["compiler.cxx", "torch.build"]
    declared = [f"torch.build == {facts.get('torch.build')}", f"python.abi == {python_abi}"]
    extra: dict[str, str] = {"python_module": str(python_module), "python.abi": python_abi}
    if cuda:
        if facts.get("torch.flavor") != "cuda":
            raise AbicacheError(f"CUDA sources need a CUDA build of torch; this one is "
                                f"{facts.get('torch.version')} ({facts.get('torch.flavor')})")
        tools.append("cuda.nvcc")
        libs += ["-lc10_cuda", "-ltorch_cuda", "-lcudart"]
        declared.append("torch.flavor in cuda")
    suffix = (sysconfig.get_config_var("EXT_SUFFIX") or ".so") if python_module else ".so"
    filename = f"{name}{suffix}" if python_module else f"lib{name}.so"
    args = [*flags, *torch.includes, *includes, *python_include]
    # Library folders are paths: they go on the command line, not into the key.
    tail = [f"-L{torch.lib_dir}", *(_cudart_dir() if cuda else []), *libs, *ldflags]
    nvcc_args = ["-c", "-Xcompiler", "-fPIC", "-std=c++20", *defines, *torch.includes, *includes, *python_include]

    def build(out: Path) -> None:
        objects = (lambda work: _nvcc_objects(cuda, nvcc_args, work, name, verbose)) if cuda else None
        _compile(compiler_command("c++") + args, {**cpp, **cuda}, out / filename, tail,
                 f"torch extension {name}", verbose=verbose, objects=objects)

    kind = "torch.pybind" if python_module else "torch.classic"
    inputs = Inputs.make({**cpp, **cuda}, flags=[*flags, *includes, "|", *libs, *ldflags],
                         tools=tools, extra=extra)
    return Plan(kind, name, inputs, build, tuple(declared))


def _nvcc_objects(cuda: dict[str, str], args: list[str], work: Path, name: str, verbose: bool) -> list[str]:
    """Compile each .cu source to an object file in the scratch dir."""
    from .env import probes

    nvcc = probes.nvcc_path()
    if nvcc is None:
        raise BuildError(f"torch extension {name} has CUDA sources but no nvcc was found "
                         "(PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    objects = []
    for source in sorted(n for n in cuda if n.endswith(".cu")):
        obj = f"{source}.o"
        run_compiler([str(nvcc), *args, source, "-o", obj], work, f"torch extension {name}", verbose)
        objects.append(obj)
    return objects


def _cudart_dir() -> list[str]:
    from .env import cuda_probe

    for folder in cuda_probe.runtime_dirs():
        if any(folder.glob("libcudart.so*")):
            return [f"-L{folder}"]
    return []


def _stable_plan(name: str, cpp: dict[str, str], torch: TorchInstall, target: str | None,
                 includes: list[str], cflags: Sequence[str], ldflags: Sequence[str], verbose: bool) -> Plan:
    _refuse_unstable_includes(cpp)
    flags = ["-shared", "-fPIC", "-O2", "-std=c++17", *cflags]
    args = [*flags, *torch.includes, *includes]
    tail = [f"-L{torch.lib_dir}", "-ltorch_cpu", *ldflags]
    filename = f"lib{name}.so"
    candidates = [target] if target else torch.stable_targets()
    for version in candidates:
        target_macro(version)  # validate early, before any build

    def build(out: Path) -> list[str]:
        failures = []
        for version in candidates:
            try:
                _compile(compiler_command("c++") + args + [target_macro(version)], cpp, out / filename, tail,
                         f"stable op {name} (target torch {version})", verbose=verbose)
            except BuildError as exc:
                failures.append(exc)
                continue
            return [f"torch.version >= {version}"]
        if len(failures) == 1:
            raise failures[0]
        raise BuildError(f"stable op {name} does not compile for any target torch "
                         f"({', '.join(candidates)}); the newest attempt:",
                         command=failures[-1].command, output=failures[-1].output)

    # Never the installed torch version: the target is the contract. Nor its flavor:
    # a CPU op built against +cpu loads into +cu128 alike, and an op that calls CUDA
    # shims gets `torch.flavor in cuda` from the audit (bench/matrix found the key too fine).
    inputs = Inputs.make(cpp, flags=[*flags, *includes, "|", "-ltorch_cpu", *ldflags],
                         tools=["compiler.cxx"], extra={"target": target or "auto"})
    declared = (f"torch.version >= {target}",) if target else ()
    return Plan("torch.stable", name, inputs, build, declared)


_UNSTABLE_INCLUDE = re.compile(r'#\s*include\s*[<"](ATen/|torch/extension\.h|torch/library\.h|torch/torch\.h|'
                               r'torch/all\.h|c10/core/|pybind11/)')


def _refuse_unstable_includes(cpp: dict[str, str]) -> None:
    for fname, code in cpp.items():
        match = _UNSTABLE_INCLUDE.search(code)
        if match:
            raise BuildError(f"{fname} includes <{match.group(1)}...>, which is not part of the stable ABI: "
                             "use torch/csrc/stable/*.h, torch/headeronly/*.h and the C shims only")


def build_inline(name: str, cpp_sources: Sequence[str] | str, *, functions: Any = None,
                 stable: bool = False, target: str | None = None, is_python_module: bool = True,
                 extra_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
                 extra_include_paths: Sequence[str] = (), verbose: bool = False,
                 cache: Cache | None = None) -> Artifact:
    """The cached build of an inline extension, not loaded."""
    cache = cache or default_cache()
    python_module = is_python_module and not stable
    sources = inline_sources(name, cpp_sources, functions, stable, python_module)
    return plan(name, sources, stable=stable, target=target, python_module=python_module,
                extra_cflags=extra_cflags, extra_ldflags=extra_ldflags,
                extra_include_paths=extra_include_paths, verbose=verbose, facts=cache.facts).run(cache)


def load_inline(name: str, cpp_sources: Sequence[str] | str, *, functions: Any = None,
                stable: bool = False, target: str | None = None, is_python_module: bool = True,
                extra_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
                extra_include_paths: Sequence[str] = (), verbose: bool = False,
                cache: Cache | None = None) -> Any:
    """Like torch.utils.cpp_extension.load_inline: a module for pybind builds,
    else the loaded library's path (ops are then in torch.ops)."""
    memo = ("torch", name, _fingerprint(cpp_sources), repr(functions), stable, target, is_python_module,
            tuple(extra_cflags), tuple(extra_ldflags), tuple(extra_include_paths), _where(cache))
    return _load_once(
        memo,
        lambda: build_inline(name, cpp_sources, functions=functions, stable=stable, target=target,
                             is_python_module=is_python_module, extra_cflags=extra_cflags,
                             extra_ldflags=extra_ldflags, extra_include_paths=extra_include_paths,
                             verbose=verbose, cache=cache),
        lambda art: _load(art, python_module=is_python_module and not stable),
    )


def load(name: str, sources: Sequence[str | os.PathLike[str]], *, stable: bool = False,
         target: str | None = None, is_python_module: bool = True, extra_cflags: Sequence[str] = (),
         extra_ldflags: Sequence[str] = (), extra_include_paths: Sequence[str] = (),
         verbose: bool = False, cache: Cache | None = None) -> Any:
    """Like torch.utils.cpp_extension.load: build from source files."""
    named = {}
    for item in sources:
        path = Path(item)
        try:
            named[path.name] = path.read_text()
        except OSError as exc:
            raise AbicacheError(f"cannot read source file {path}: {exc.strerror}") from None
    cache = cache or default_cache()
    python_module = is_python_module and not stable
    memo = ("torch-load", name, tuple(sorted(named.items())), stable, target, python_module,
            tuple(extra_cflags), tuple(extra_ldflags), tuple(extra_include_paths), cache.root)
    return _load_once(
        memo,
        lambda: plan(name, named, stable=stable, target=target, python_module=python_module,
                     extra_cflags=extra_cflags, extra_ldflags=extra_ldflags,
                     extra_include_paths=extra_include_paths, verbose=verbose,
                     facts=cache.facts).run(cache),
        lambda art: _load(art, python_module=python_module),
    )


def _load(art: Artifact, *, python_module: bool) -> Any:
    import torch  # the extension links libtorch: torch must be loaded first

    path = art.file()
    if python_module:
        return import_extension(art.name, path)
    torch.ops.load_library(str(path))
    return path


__all__ = ["build_inline", "load", "load_inline", "plan", "target_macro"]
