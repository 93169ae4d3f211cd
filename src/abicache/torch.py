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
from typing import Any, Callable, Mapping, Sequence

from .cache import Artifact, Cache, default_cache
from .build import tree as trees
from .build.job import CudaUnits, Job
from .cc import Plan, _fingerprint, _load_once, _where, compiler_command, import_extension, runner
from .cc import ext_suffix, python_include as cc_python_include
from .env import Facts
from .errors import AbicacheError, BuildError, UsageError
from .key import Inputs

STABLE_FLOOR = "2.9"  # the first LibTorch stable ABI release


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
                   python_module: bool, cuda_sources: Sequence[str] | str | None = None) -> dict[str, str]:
    """main.cpp (and cuda.cu) as cpp_extension.load_inline writes them."""
    parts = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources)
    if not stable:
        parts.insert(0, "#include <torch/extension.h>")
    if functions is not None:
        if stable or not python_module:
            raise AbicacheError("functions= makes pybind11 bindings: it needs a classic python module "
                                "(stable=False, is_python_module=True)")
        parts.append(_bindings(functions))
    sources = {"main.cpp": "\n".join(parts)}
    cuda = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources or ())
    if cuda:
        # cpp_extension prepends these to classic CUDA sources; a stable op includes what it uses.
        head = [] if stable else ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
        sources["cuda.cu"] = "\n".join(head + cuda)
    return sources


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


def plan(name: str, sources: Mapping[str, str] | Sequence[Any], *, stable: bool = False,
         target: str | None = None, python_module: bool = True, extra_cflags: Sequence[str] = (),
         extra_ldflags: Sequence[str] = (), extra_include_paths: Sequence[str] = (), verbose: bool = False,
         facts: Facts | None = None, use_pch: bool = False, extra_cuda_cflags: Sequence[str] = ()) -> Plan:
    """What to build and how it is keyed, for a classic or stable extension.
    sources: {name: code} (inline), or files compiled where they live."""
    facts = facts or default_cache().facts
    torch = TorchInstall(facts)
    flags = [*extra_cflags, *(f"-I{p}" for p in extra_include_paths)]
    tree = trees.make(sources if not isinstance(sources, Mapping) else [sources], ".cpp", flags,
                      (*trees.COMPILED, ".cuh"))
    cuda = tuple(extra_cuda_cflags)
    if stable:
        _refuse_unstable_includes({f.name: f.code for f in tree.files})
        return _stable_plan(name, tree, torch, target, extra_ldflags, verbose, cuda)
    return _classic_plan(name, tree, torch, python_module, extra_ldflags, verbose, use_pch, cuda)


def _classic_plan(name: str, tree: trees.Tree, torch: TorchInstall, python_module: bool,
                  ldflags: Sequence[str], verbose: bool, use_pch: bool = False,
                  cuda_cflags: tuple[str, ...] = ()) -> Plan:
    facts = torch.facts
    python_include = cc_python_include()
    abi = facts.get("torch.cxx11abi")
    defines = [f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    defines += [f"-D_GLIBCXX_USE_CXX11_ABI={abi}"] if abi in ("0", "1") else []
    cuda = any(f.name.endswith(".cu") for f in tree.files)
    libs = ["-lc10", "-ltorch_cpu", "-ltorch"] + (["-ltorch_python"] if python_module else [])
    # torch/extension.h includes Python.h: every classic build is tied to this
    # interpreter's ABI (cpp_extension keys its folder on py311 for the same reason).
    python_abi = facts.get("python.abi") or "unknown"
    tools = ["compiler.cxx", "torch.build"]
    declared = [f"torch.build == {facts.get('torch.build')}", f"python.abi == {python_abi}"]
    extra: dict[str, str] = {"python_module": str(python_module), "python.abi": python_abi}
    covered = [str(torch.root / "include"), python_include]
    nvcc = None
    if cuda:
        if facts.get("torch.flavor") != "cuda":
            raise AbicacheError(f"CUDA sources need a CUDA build of torch; this one is "
                                f"{facts.get('torch.version')} ({facts.get('torch.flavor')})")
        tools.append("cuda.nvcc")
        libs += ["-lc10_cuda", "-ltorch_cuda", "-lcudart"]
        declared.append("torch.flavor in cuda")
        nvcc = _nvcc_units([*defines, *cuda_cflags, *cuda_arch_flags(facts)], torch, python_include, covered)
    suffix = ext_suffix() if python_module else ".so"
    filename = f"{name}{suffix}" if python_module else f"lib{name}.so"
    # cpp_extension's own flags: no -O level unless the caller passes one.
    key_cflags = ("-fPIC", "-std=c++20", *defines)
    cflags = (*key_cflags, *torch.includes, "-isystem", python_include)
    # Library folders are paths: they go on the command line, not into the key.
    tail = (f"-L{torch.lib_dir}", *_cudart_link(libs), *ldflags)
    job = Job(f"torch extension {name}", tuple(compiler_command("c++")), "compiler.cxx", "c++", tree,
              cflags, key_cflags, ("-shared",), tail, filename, tuple(covered), nvcc, verbose)
    kind = "torch.pybind" if python_module else "torch.classic"
    # nvcc's flags (arch list, extra_cuda_cflags) shape the output as much as the C++ flags do.
    nvcc_key = ["nvcc", *nvcc.key_flags] if nvcc else []
    inputs = Inputs.make(tree.key_sources(), flags=["-shared", *key_cflags, *tree.key_flags, *nvcc_key, "|", *libs,
                                                  *ldflags], tools=tools, extra=extra)
    custom = _with_pch(job, torch, python_abi) if use_pch else None
    return Plan(kind, name, inputs, None, tuple(declared), bases=tree.bases, job=job, custom=custom)


def _with_pch(job: Job, torch: TorchInstall, python_abi: str) -> Callable[[Path, Cache], Any]:
    """Build with the shared precompiled torch/extension.h (made first if missing).
    The output is the same program either way: use_pch is not in the key."""

    def build(out: Path, cache: Cache) -> Any:
        from .build import pch, units
        from .cache import BuildResult

        run = runner(job.verbose)
        folder = pch.torch_extension(cache, job, torch.root / "include", python_abi, run)
        fast = job._replace(cflags=("-I", folder, "-Winvalid-pch", *job.cflags), covered=(*job.covered, folder))
        return BuildResult(deps=units.build(fast, cache, out, run))

    return build


def _nvcc_units(defines: list[str], torch: TorchInstall, python_include: str, covered: list[str]) -> CudaUnits:
    from .env import probes

    nvcc = probes.nvcc_path()
    if nvcc is None:
        raise BuildError("CUDA sources need nvcc, which was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    covered.append(str(Path(nvcc).resolve().parent.parent / "include"))
    key = ("-Xcompiler", "-fPIC", "-std=c++20", *defines)
    return CudaUnits((str(nvcc),), (*key, *torch.includes, "-isystem", python_include), key)


def cuda_arch_flags(facts: Facts) -> list[str]:
    """nvcc's targets as cpp_extension picks them: $TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX"),
    else the GPUs present, each as SASS, plus PTX of the newest (so a newer GPU can JIT it);
    with neither, nvcc's own default. The flags are in the key, and the audit turns the
    result into `gpu.arch ~= ...`."""
    listed = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(",", ";").replace(" ", ";")
    archs = [a for a in listed.split(";") if a]
    if not archs:
        present = sorted({d.split("_")[1] for d in (facts.get("gpu.arch") or "").split(",") if "_" in d})
        archs = [f"{d[:-1]}.{d[-1]}" for d in present]
        if archs:
            archs[-1] += "+PTX"
    flags = []
    for arch in archs:
        match = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", arch.strip())
        if match is None:
            raise UsageError(f"TORCH_CUDA_ARCH_LIST: {arch!r} is not an arch like 9.0, 9.0a or 9.0+PTX")
        num = f"{match.group(1)}{match.group(2)}{match.group(3)}"
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if match.group(4):
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def _stable_nvcc(torch: TorchInstall, covered: list[str], extra: tuple[str, ...]) -> CudaUnits:
    from .env import probes

    nvcc = probes.nvcc_path()
    if nvcc is None:
        raise BuildError("CUDA sources need nvcc, which was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    covered.append(str(Path(nvcc).resolve().parent.parent / "include"))
    key = ("-Xcompiler", "-fPIC", "-O2", "-std=c++17", *extra)
    return CudaUnits((str(nvcc),), (*key, *torch.includes), key)


def _cudart_link(libs: Sequence[str]) -> list[str]:
    """libs for the link line: -lcudart names the runtime found first in the
    documented search order (env/cuda_probe.py), by its soname where the folder
    has no unversioned libcudart.so (the CUDA wheels ship none)."""
    if "-lcudart" not in libs:
        return list(libs)
    from .env import cuda_probe

    for folder in cuda_probe.runtime_dirs():
        sonames = sorted(p.name for p in folder.glob("libcudart.so.*") if re.fullmatch(r"libcudart\.so\.\d+", p.name))
        if (folder / "libcudart.so").exists() or sonames:
            name = "-lcudart" if (folder / "libcudart.so").exists() else f"-l:{sonames[-1]}"
            return [f"-L{folder}", *(name if lib == "-lcudart" else lib for lib in libs)]
    return list(libs)


def _stable_plan(name: str, tree: trees.Tree, torch: TorchInstall, target: str | None,
                 ldflags: Sequence[str], verbose: bool, cuda_cflags: tuple[str, ...] = ()) -> Plan:
    key_cflags = ("-fPIC", "-O2", "-std=c++17")
    cuda = any(f.name.endswith(".cu") for f in tree.files)
    libs = ("-ltorch_cpu", *(("-lcudart",) if cuda else ()))
    tail = (f"-L{torch.lib_dir}", *_cudart_link(libs), *ldflags)
    filename = f"lib{name}.so"
    candidates = [target] if target else torch.stable_targets()
    for version in candidates:
        target_macro(version)  # validate early, before any build
    covered = [str(torch.root / "include")]
    # Kernels of a stable op compile with nvcc against the same stable headers; they
    # may call the CUDA runtime, which the audit turns into a cuda.runtime requirement.
    nvcc = _stable_nvcc(torch, covered, (*cuda_cflags, *cuda_arch_flags(torch.facts))) if cuda else None
    job = Job(f"stable op {name}", tuple(compiler_command("c++")), "compiler.cxx", "c++", tree, key_cflags,
              key_cflags, ("-shared",), tail, filename, tuple(covered), nvcc, verbose=verbose)

    def build(out: Path, cache: Cache) -> Any:
        from .build import units
        from .cache import BuildResult

        failures = []
        for version in candidates:
            macro = target_macro(version)
            attempt = job._replace(what=f"stable op {name} (target torch {version})",
                                   cflags=(*job.cflags, macro, *torch.includes), key_cflags=(*job.key_cflags, macro))
            if job.cuda is not None:
                attempt = attempt._replace(cuda=job.cuda._replace(flags=(*job.cuda.flags, macro),
                                                                  key_flags=(*job.cuda.key_flags, macro)))
            try:
                deps = units.build(attempt, cache, out, runner(verbose))
            except BuildError as exc:
                failures.append(exc)
                continue
            return BuildResult([f"torch.version >= {version}"], deps)
        if len(failures) == 1:
            raise failures[0]
        raise BuildError(f"stable op {name} does not compile for any target torch "
                         f"({', '.join(candidates)}); the newest attempt:",
                         command=failures[-1].command, output=failures[-1].output)

    # Never the installed torch version: the target is the contract. Nor its flavor:
    # a CPU op built against +cpu loads into +cu128 alike, and an op that calls CUDA
    # shims gets `torch.flavor in cuda` from the audit (bench/matrix found the key too fine).
    nvcc_key = ["nvcc", *nvcc.key_flags] if nvcc else []
    inputs = Inputs.make(tree.key_sources(), flags=["-shared", *key_cflags, *tree.key_flags, *nvcc_key, "|", *libs,
                                                  *ldflags],
                         tools=["compiler.cxx", *(["cuda.nvcc"] if cuda else [])], extra={"target": target or "auto"})
    declared = (f"torch.version >= {target}",) if target else ()
    return Plan("torch.stable", name, inputs, None, declared, bases=tree.bases, job=job, custom=build)


_UNSTABLE_INCLUDE = re.compile(r'#\s*include\s*[<"](ATen/|torch/extension\.h|torch/library\.h|torch/torch\.h|'
                               r'torch/all\.h|c10/core/|pybind11/)')


def _refuse_unstable_includes(cpp: dict[str, str]) -> None:
    for fname, code in cpp.items():
        match = _UNSTABLE_INCLUDE.search(code)
        if match:
            raise BuildError(f"{fname} includes <{match.group(1)}...>, which is not part of the stable ABI: "
                             "use torch/csrc/stable/*.h, torch/headeronly/*.h and the C shims only")


def build_inline(name: str, cpp_sources: Sequence[str] | str, *, cuda_sources: Sequence[str] | str | None = None,
                 functions: Any = None, stable: bool = False, target: str | None = None,
                 is_python_module: bool = True, extra_cflags: Sequence[str] = (),
                 extra_cuda_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
                 extra_include_paths: Sequence[str] = (), verbose: bool = False,
                 cache: Cache | None = None, use_pch: bool = False) -> Artifact:
    """The cached build of an inline extension, not loaded. cuda_sources compile
    with nvcc (classic: against torch's CUDA build; stable: against the stable
    headers). use_pch: compile against a precompiled torch/extension.h shared by
    every extension of this torch (build/pch.py; classic builds only)."""
    cache = cache or default_cache()
    python_module = is_python_module and not stable
    sources = inline_sources(name, cpp_sources, functions, stable, python_module, cuda_sources)
    return plan(name, sources, stable=stable, target=target, python_module=python_module,
                extra_cflags=extra_cflags, extra_ldflags=extra_ldflags,
                extra_include_paths=extra_include_paths, verbose=verbose, facts=cache.facts,
                use_pch=use_pch, extra_cuda_cflags=extra_cuda_cflags).run(cache)


def load_inline(name: str, cpp_sources: Sequence[str] | str, *, cuda_sources: Sequence[str] | str | None = None,
                functions: Any = None, stable: bool = False, target: str | None = None,
                is_python_module: bool = True, extra_cflags: Sequence[str] = (),
                extra_cuda_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
                extra_include_paths: Sequence[str] = (), verbose: bool = False,
                cache: Cache | None = None, use_pch: bool = False) -> Any:
    """Like torch.utils.cpp_extension.load_inline: a module for pybind builds,
    else the loaded library's path (ops are then in torch.ops)."""
    memo = ("torch", name, _fingerprint(cpp_sources), _fingerprint(cuda_sources or ()), repr(functions), stable,
            target, is_python_module, tuple(extra_cflags), tuple(extra_cuda_cflags), tuple(extra_ldflags),
            tuple(extra_include_paths), _where(cache))
    return _load_once(
        memo,
        lambda: build_inline(name, cpp_sources, cuda_sources=cuda_sources, functions=functions, stable=stable,
                             target=target, is_python_module=is_python_module, extra_cflags=extra_cflags,
                             extra_cuda_cflags=extra_cuda_cflags, extra_ldflags=extra_ldflags,
                             extra_include_paths=extra_include_paths, verbose=verbose, cache=cache,
                             use_pch=use_pch),
        lambda art: _load(art, python_module=is_python_module and not stable),
    )


def load(name: str, sources: Sequence[str | os.PathLike[str]], *, stable: bool = False,
         target: str | None = None, is_python_module: bool = True, extra_cflags: Sequence[str] = (),
         extra_ldflags: Sequence[str] = (), extra_include_paths: Sequence[str] = (),
         verbose: bool = False, cache: Cache | None = None, use_pch: bool = False,
         extra_cuda_cflags: Sequence[str] = ()) -> Any:
    """Like torch.utils.cpp_extension.load: build from source files, each
    compiled where it lives (so its sibling headers and relative include
    paths work as with the compiler run by hand here). The headers they read
    are recorded: editing one rebuilds, in this process too."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]  # torch takes one path as well as a list
    paths = [Path(item) for item in sources]
    cache = cache or default_cache()
    python_module = is_python_module and not stable
    memo = ("torch-load", name, _fingerprint(paths), stable, target, python_module,
            tuple(extra_cflags), tuple(extra_cuda_cflags), tuple(extra_ldflags), tuple(extra_include_paths),
            os.getcwd(), _where(cache))
    return _load_once(
        memo,
        lambda: plan(name, paths, stable=stable, target=target, python_module=python_module,
                     extra_cflags=extra_cflags, extra_ldflags=extra_ldflags,
                     extra_include_paths=extra_include_paths, verbose=verbose,
                     facts=cache.facts, use_pch=use_pch, extra_cuda_cflags=extra_cuda_cflags).run(cache),
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
