"""The torch frontend's plans: what to build for a classic or stable extension, and how it
is keyed (abicache/torch.py holds the calls; a call its hit record serves imports none of this).

Classic builds (pybind modules, TORCH_LIBRARY ops) are keyed on the full torch build
(version with local tag, git, CUDA/HIP, C++ ABI) and require it; a pybind module also
requires this Python ABI. Stable builds are keyed on their TORCH_TARGET_VERSION and never
on the installed torch: one build serves every torch >= the target. torch is found without
importing it (env/probes.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..core.cache import Artifact, Cache, default_cache
from ..engine import tree as trees
from ..engine.job import CudaUnits, Job
from .cc_plans import Plan, compiler_command, runner
from .cc_plans import ext_suffix, python_include as cc_python_include
from ..env import Facts
from ..errors import AbicacheError, BuildError, UsageError
from ..core.key import Inputs
from . import torch_lines
from ..engine import steer
from ..engine.jitargs import cuda_arch_flags, cudart_link, keep_copy, lenient, listed  # noqa: F401  (at.lenient)
from ..values.records import named_tuple

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
                   python_module: bool, cuda_sources: Sequence[str] | str | None = None, *,
                   error_handling: bool = True, implicit_headers: bool = True,
                   gil_not_used: bool = False) -> dict[str, str]:
    """main.cpp (and cuda.cu) as cpp_extension.load_inline writes them (gil_not_used: torch 2.15's,
    the bindings declare they run without the GIL)."""
    parts = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources)
    implicit = implicit_headers and not stable
    if implicit:
        parts.insert(0, "#include <torch/extension.h>")
    if functions is not None:
        if stable:
            raise UsageError("functions= makes pybind11 bindings, which the stable ABI excludes; "
                             "register the functions with STABLE_TORCH_LIBRARY instead")
        parts.append(_bindings(functions, error_handling, gil_not_used))
    sources = {"main.cpp": "\n".join(parts)}
    cuda = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources or ())
    if cuda:
        # cpp_extension prepends these to classic CUDA sources; a stable op includes what it uses.
        head = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"] if implicit else []
        sources["cuda.cu"] = "\n".join(head + cuda)
    return sources


def _bindings(functions: Any, error_handling: bool = True, gil_not_used: bool = False) -> str:
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, Mapping):
        docs = dict(functions)
    elif isinstance(functions, (list, tuple)):
        docs = {f: f for f in functions}
    else:
        raise UsageError(f"Expected 'functions' to be a list or dict, but was {type(functions)}")
    wrap = "torch::wrap_pybind_function({})" if error_handling else "{}"
    lines = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m, pybind11::mod_gil_not_used()) {" if gil_not_used
             else "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    lines += [f'm.def("{f}", {wrap.format(f)}, "{d}");' for f, d in docs.items()]
    return "\n".join(lines + ["}"])


def plan(name: str, sources: Mapping[str, str] | Sequence[Any], *, stable: bool = False,
         target: str | None = None, python_module: bool = True, extra_cflags: Sequence[str] = (),
         extra_ldflags: Sequence[str] = (), extra_include_paths: Sequence[str] = (), verbose: bool = False,
         facts: Facts | None = None, use_pch: bool = False, extra_cuda_cflags: Sequence[str] = (),
         with_cuda: bool | None = None, standalone: bool = False) -> Plan:
    """What to build and how it is keyed, for a classic or stable extension.
    sources: {name: code} (inline), or files compiled where they live.
    with_cuda: link CUDA (None: if there are .cu sources); standalone: an executable."""
    facts = facts or default_cache().facts
    torch = TorchInstall(facts)
    # as cpp_extension: the include paths go to both compilers, extra_cflags to the C++ compiler only
    includes = [f"-I{p}" for p in extra_include_paths]
    tree = trees.make(sources if not isinstance(sources, Mapping) else [sources], ".cpp",
                      [*includes, *extra_cflags], (*trees.COMPILED, ".cuh"))
    cuda = tuple(extra_cuda_cflags)
    if stable:
        _refuse_unstable_includes({f.name: f.code for f in tree.files})
        return _stable_plan(name, tree, torch, target, extra_ldflags, verbose, cuda)
    has_cu = any(f.name.endswith(".cu") for f in tree.files)
    if with_cuda is False and has_cu:
        raise UsageError(f"with_cuda=False, but {name} has CUDA sources; leave with_cuda unset (None) or True")
    output = "executable" if standalone else "module" if python_module else "library"
    return _classic_plan(name, tree, torch, output, extra_ldflags, verbose, use_pch, cuda, bool(with_cuda) or has_cu,
                         len(includes))


_OUTPUTS = {  # output -> (kind, link flags)
    "module": ("torch.pybind", ("-shared",)),
    "library": ("torch.classic", ("-shared",)),
    "executable": ("torch.executable", ()),
}


def _classic_plan(name: str, tree: trees.Tree, torch: TorchInstall, output: str,
                  ldflags: Sequence[str], verbose: bool, use_pch: bool = False,
                  cuda_cflags: tuple[str, ...] = (), cuda: bool = False, includes: int = 0) -> Plan:
    """cpp_extension's own build lines (frontends/torch_lines.py; tests/test_torch_lines.py
    compares them with the build.ninja the installed torch writes). includes:
    how many of the tree's first flags are extra_include_paths (both compilers
    get those; the rest, extra_cflags, only the C++ compiler)."""
    facts = torch.facts
    lines = torch_lines.lines(torch.root, facts.memo_dir)
    python_include = cc_python_include()
    abi = facts.get("torch.cxx11abi")
    python_module = output == "module"
    # an executable is no extension: torch/torch.h must not pull in Python (as cpp_extension does it)
    defines = [] if output == "executable" else [f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    defines += [f"-D_GLIBCXX_USE_CXX11_ABI={abi}"] if lines.abi_define and abi in ("0", "1") else []
    libs = ["-lc10", *(["-lc10_cuda"] if cuda else []), "-ltorch_cpu", *(["-ltorch_cuda"] if cuda else []), "-ltorch",
            *(["-ltorch_python"] if output != "executable" else [])]
    # torch/extension.h includes Python.h: every classic build is tied to this
    # interpreter's ABI (cpp_extension keys its folder on py311 for the same reason).
    python_abi = (facts.get("python.abi") or "unknown") if output != "executable" else "none"
    tools = ["compiler.cxx", "torch.build"]
    declared = [f"torch.build == {facts.get('torch.build')}"]
    declared += [f"python.abi == {python_abi}"] if output != "executable" else []
    extra: dict[str, str] = {"python_module": str(python_module), "python.abi": python_abi}
    covered = [str(torch.root / "include"), python_include]
    nvcc = None
    cuda_include: tuple[str, ...] = ()
    if cuda:
        if facts.get("torch.flavor") == "rocm":
            raise BuildError(f"torch {facts.get('torch.version')} is a ROCm build: its cpp_extension hipifies CUDA "
                             "sources and compiles them with hipcc, which abicache does not do yet. Build this "
                             "extension with torch.utils.cpp_extension, or keep abicache to its C++ sources")
        if facts.get("torch.flavor") != "cuda":
            raise BuildError(f"CUDA sources (or with_cuda=True) need a CUDA build of torch; this one is "
                             f"{facts.get('torch.version')} ({facts.get('torch.flavor')})")
        tools.append("cuda.nvcc")
        declared.append("torch.flavor in cuda")
        nvcc = _nvcc_units(defines, tree, includes, cuda_cflags, torch, python_include, covered, lines)
        cuda_include = ("-isystem", covered[-1])  # as cpp_extension: C++ sources may include cuda_runtime.h
        tools += ["compiler.cc"] if os.environ.get("CC") else []  # nvcc's host compiler (-ccbin $CC)
    suffix = ext_suffix() if python_module else ".so"
    filename = {"module": f"{name}{suffix}", "library": f"lib{name}.so", "executable": name}[output]
    # cpp_extension's own flags: no -O level unless the caller passes one.
    key_cflags = ("-fPIC", lines.cxx_std, *defines)
    cflags = (*defines, *torch.includes, *cuda_include, "-isystem", python_include, "-fPIC", lines.cxx_std)
    # Library folders are paths: they go on the command line, not into the key.
    kind, link = _OUTPUTS[output]
    rpath = (f"-Wl,-rpath,{torch.lib_dir}",) if output == "executable" else ()  # it runs outside Python
    cudart = cudart_link(["-lcudart"]) if cuda else []
    tail = (*ldflags, f"-L{torch.lib_dir}", *libs, *rpath, *cudart)
    job = Job(f"torch extension {name}", tuple(compiler_command("c++")), "compiler.cxx", "c++", tree,
              cflags, key_cflags, link, tail, filename, tuple(covered), nvcc, verbose,
              steer=steer.for_cxx(cuda=cuda))
    # nvcc's flags (arch list, extra_cuda_cflags) shape the output as much as the C++ flags do.
    nvcc_key = ["nvcc", *nvcc.key_flags] if nvcc else []
    inputs = Inputs.make(tree.key_sources(), flags=[*link, *key_cflags, *tree.key_flags, *nvcc_key, "|", *ldflags,
                                                  *libs, *(["-lcudart"] if cuda else [])],
                         tools=tools, extra={**extra, **dict(job.steer)})
    custom = _with_pch(job, torch, python_abi) if use_pch else None
    return Plan(kind, name, inputs, None, tuple(declared), bases=tree.bases, job=job, custom=custom)


def _with_pch(job: Job, torch: TorchInstall, python_abi: str) -> Callable[[Path, Cache], Any]:
    """Build with the shared precompiled torch/extension.h (made first if missing).
    The output is the same program either way: use_pch is not in the key."""

    def build(out: Path, cache: Cache) -> Any:
        from ..engine import pch, units

        run = runner(job.verbose)
        folder = pch.torch_extension(cache, job, torch.root / "include", python_abi, run)
        fast = job._replace(cflags=("-I", folder, "-Winvalid-pch", *job.cflags), covered=(*job.covered, folder))
        return units.build(fast, cache, out, run)

    return build


def _nvcc_units(defines: list[str], tree: trees.Tree, includes: int, extra: tuple[str, ...], torch: TorchInstall,
                python_include: str, covered: list[str], lines: torch_lines.TorchLines) -> CudaUnits:
    """cpp_extension's nvcc line: [-ccbin $CC] defines, the include paths, the system
    includes, COMMON_NVCC_FLAGS, the arch flags (none when extra_cuda_cflags name an
    arch), --compiler-options -fPIC, extra_cuda_cflags, and its -std unless they give one."""
    from ..env import probes

    nvcc = probes.nvcc_path()
    if nvcc is None:
        raise BuildError("CUDA sources need nvcc, which was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    covered.append(str(Path(nvcc).resolve().parent.parent / "include"))
    head = ["-ccbin", os.environ["CC"]] if os.environ.get("CC") else []
    tail = [*lines.nvcc_common, *cuda_arch_flags(torch.facts, extra), "--compiler-options", "-fPIC", *extra]
    if not any(f.startswith("-std=") for f in (*defines, *tail)):
        tail.append(lines.nvcc_std)
    system = [*torch.includes, "-isystem", covered[-1], "-isystem", python_include]
    flags = (*head, *defines, *tree.flags[:includes], *system, *tail)
    key = (*head, *defines, *tree.key_flags[:includes], *tail)
    return CudaUnits((str(nvcc),), flags, key, tree_flags=False)


def _stable_nvcc(torch: TorchInstall, covered: list[str], extra: tuple[str, ...]) -> CudaUnits:
    from ..env import probes

    nvcc = probes.nvcc_path()
    if nvcc is None:
        raise BuildError("CUDA sources need nvcc, which was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    covered.append(str(Path(nvcc).resolve().parent.parent / "include"))
    key = ("-Xcompiler", "-fPIC", "-O2", "-std=c++17", *extra)
    return CudaUnits((str(nvcc),), (*key, *torch.includes), key)


def _stable_plan(name: str, tree: trees.Tree, torch: TorchInstall, target: str | None,
                 ldflags: Sequence[str], verbose: bool, cuda_cflags: tuple[str, ...] = ()) -> Plan:
    key_cflags = ("-fPIC", "-O2", "-std=c++17")
    cuda = any(f.name.endswith(".cu") for f in tree.files)
    libs = ("-ltorch_cpu", *(("-lcudart",) if cuda else ()))
    tail = (f"-L{torch.lib_dir}", *cudart_link(libs), *ldflags)
    filename = f"lib{name}.so"
    candidates = [target] if target else torch.stable_targets()
    for version in candidates:
        target_macro(version)  # validate early, before any build
    covered = [str(torch.root / "include")]
    # Kernels of a stable op compile with nvcc against the same stable headers; they
    # may call the CUDA runtime, which the audit turns into a cuda.runtime requirement.
    nvcc = _stable_nvcc(torch, covered, (*cuda_cflags, *cuda_arch_flags(torch.facts))) if cuda else None
    job = Job(f"stable op {name}", tuple(compiler_command("c++")), "compiler.cxx", "c++", tree, key_cflags,
              key_cflags, ("-shared",), tail, filename, tuple(covered), nvcc, verbose=verbose, steer=steer.for_cxx())

    def build(out: Path, cache: Cache) -> Any:
        from ..engine import units

        failures = []
        for version in candidates:
            macro = target_macro(version)
            attempt = job._replace(what=f"stable op {name} (target torch {version})",
                                   cflags=(*job.cflags, macro, *torch.includes), key_cflags=(*job.key_cflags, macro))
            if job.cuda is not None:
                attempt = attempt._replace(cuda=job.cuda._replace(flags=(*job.cuda.flags, macro),
                                                                  key_flags=(*job.cuda.key_flags, macro)))
            try:
                result = units.build(attempt, cache, out, runner(verbose))
            except BuildError as exc:
                failures.append(exc)
                continue
            return result._replace(requirements=[f"torch.version >= {version}"])
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
                         tools=["compiler.cxx", *(["cuda.nvcc"] if cuda else [])],
                         extra={"target": target or "auto", **dict(job.steer)})
    declared = (f"torch.version >= {target}",) if target else ()
    return Plan("torch.stable", name, inputs, None, declared, bases=tree.bases, job=job, custom=build)


_UNSTABLE_INCLUDE = (r'#\s*include\s*[<"](ATen/|torch/extension\.h|torch/library\.h|torch/torch\.h|'
                     r'torch/all\.h|c10/core/|pybind11/)')


def _refuse_unstable_includes(cpp: dict[str, str]) -> None:
    for fname, code in cpp.items():
        match = re.search(_UNSTABLE_INCLUDE, code)  # compiled at the first stable build, not at import
        if match:
            raise BuildError(f"{fname} includes <{match.group(1)}...>, which is not part of the stable ABI: "
                             "use torch/csrc/stable/*.h, torch/headeronly/*.h and the C shims only")


@named_tuple
class JitOptions:
    """cpp_extension's build arguments, read as torch reads them."""

    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    include_paths: tuple[str, ...]

    @classmethod
    def of(cls, cflags: Any, cuda_cflags: Any, ldflags: Any, include_paths: Any, sycl: Any = None,
           with_sycl: bool | None = None) -> JitOptions:
        if sycl or with_sycl:
            raise UsageError("SYCL sources are not supported by abicache.torch; build them with "
                             "torch.utils.cpp_extension (or leave sycl_sources, extra_sycl_cflags and with_sycl unset)")
        return cls(lenient(cflags), lenient(cuda_cflags), lenient(ldflags),
                   tuple(str(p).strip() for p in listed(include_paths)))


def build_inline(name: str, cpp_sources: Sequence[str] | str, cuda_sources: Sequence[str] | str | None = None,
                 sycl_sources: Sequence[str] | str | None = None, functions: Any = None,
                 extra_cflags: Any = None, extra_cuda_cflags: Any = None, extra_sycl_cflags: Any = None,
                 extra_ldflags: Any = None, extra_include_paths: Any = None, build_directory: Any = None,
                 verbose: bool = False, with_cuda: bool | None = None, with_sycl: bool | None = None,
                 is_python_module: bool = True, with_pytorch_error_handling: bool = True,
                 keep_intermediates: bool = True, use_pch: bool = False, no_implicit_headers: bool = False,
                 gil_not_used: bool = False, *,
                 stable: bool = False, target: str | None = None, cache: Cache | None = None) -> Artifact:
    """The cached build of an inline extension, not loaded; load_inline's arguments.
    cuda_sources compile with nvcc (classic: against torch's CUDA build; stable:
    against the stable headers). use_pch: compile against a precompiled
    torch/extension.h shared by every extension of this torch (engine/pch.py)."""
    args = {k: v for k, v in locals().items() if k not in ("name", "cpp_sources", "cache")}  # the call, as given
    cache = cache or default_cache()
    opts = JitOptions.of(extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths,
                         [sycl_sources, extra_sycl_cflags] if (sycl_sources or extra_sycl_cflags) else None, with_sycl)
    python_module = is_python_module and not stable
    sources = inline_sources(name, cpp_sources, functions, stable, python_module, cuda_sources,
                             error_handling=with_pytorch_error_handling, implicit_headers=not no_implicit_headers,
                             gil_not_used=gil_not_used)
    made = plan(name, sources, stable=stable, target=target, python_module=python_module,
                extra_cflags=opts.cflags, extra_ldflags=opts.ldflags, extra_include_paths=opts.include_paths,
                verbose=verbose, facts=cache.facts, use_pch=use_pch, extra_cuda_cflags=opts.cuda_cflags,
                with_cuda=with_cuda)
    art = _recorded(made, cache, "torch.inline", name, cpp_sources, args)
    keep_copy(build_directory, art, sources if keep_intermediates else {})
    return art


def build_load(name: str, sources: Any, args: Mapping[str, Any]) -> Artifact:
    """load()'s build: each source compiled where it lives; args: load's own, as given."""
    paths = [Path(item) for item in listed(sources)]  # torch takes one path as well as a list
    cache = args["cache"] or default_cache()
    opts = JitOptions.of(args["extra_cflags"], args["extra_cuda_cflags"], args["extra_ldflags"],
                         args["extra_include_paths"],
                         args["extra_sycl_cflags"] or any(str(p).endswith(".sycl") for p in paths) or None,
                         args["with_sycl"])
    stable, standalone = args["stable"], args["is_standalone"]
    made = plan(name, paths, stable=stable, target=args["target"],
                python_module=args["is_python_module"] and not stable and not standalone,
                extra_cflags=opts.cflags, extra_ldflags=opts.ldflags, extra_include_paths=opts.include_paths,
                verbose=args["verbose"], facts=cache.facts, use_pch=args["use_pch"],
                extra_cuda_cflags=opts.cuda_cflags, with_cuda=args["with_cuda"], standalone=standalone)
    art = _recorded(made, cache, "torch.load", name, paths, args)
    keep_copy(args["build_directory"], art, {})
    return art


def _recorded(made: Plan, cache: Cache, frontend: str, name: str, sources: Any, args: Mapping[str, Any]) -> Artifact:
    """The plan's artifact, and the hit record of the call (hits/__init__.py torch_call) where
    one may stand for it: the next process's same call after `import torch` is served by it."""
    from ..cc import _run
    from .. import hits
    from . import torch_lines

    called = hits.torch_call(frontend, name, sources, args)
    if called is None:
        return made.run(cache)
    call, named = called
    return _run(made, cache, call, named, torch_lines.files(named))
