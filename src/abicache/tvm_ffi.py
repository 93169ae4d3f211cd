"""tvm-ffi frontend: tvm_ffi.cpp.load_inline / load through the cache.

    import abicache.tvm_ffi as at
    mod = at.load_inline("add_one", cpp_sources=SRC, functions=["add_one"])   # a tvm_ffi.Module

The same signatures and the same source tvm-ffi writes (main.cpp with its
headers and a TVM_FFI_DLL_EXPORT_TYPED_FUNC per function; cuda.cu for CUDA
sources), compiled against tvm-ffi's headers, dlpack's and libtvm_ffi. What
tvm-ffi's own cache gets wrong, this does not:

- the key holds tvm-ffi's version (an upgrade rebuilds; tvm-ffi's own key omits
  it) and never a path of the venv: tvm-ffi's include folders are roots its
  version identifies, the library folder is on the command line only;
- the entry requires that tvm-ffi version (`tvm_ffi.version == ...`) and what
  the audit reads from the binary (glibc, libstdc++, GPU targets);
- a kill -9 mid-build leaves no lock behind, a hit spawns nothing.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from .engine import tree as trees
from .engine import steer
from .engine.jitargs import cuda_arch_flags, cudart_link, keep_copy, lenient, listed
from .engine.job import CudaUnits, Embedding, Job
from .core.cache import Artifact, Cache, default_cache
from .cc import Plan, _fingerprint, _load_once, _where, compiler_command
from .errors import AbicacheError, UsageError
from .core.key import Inputs
from .frontends.patching import Patch

HEADERS = ("#include <tvm/ffi/container/tensor.h>", "#include <tvm/ffi/dtype.h>", "#include <tvm/ffi/error.h>",
           "#include <tvm/ffi/extra/c_env_api.h>", "#include <tvm/ffi/function.h>", "")
KEY_CFLAGS = ("-std=c++17", "-fPIC", "-O2")  # tvm-ffi's own defaults


class TvmFfiInstall:
    """Where the installed tvm-ffi keeps its headers and library, and its version."""

    def __init__(self) -> None:
        try:
            from importlib import metadata

            from tvm_ffi import libinfo
        except ImportError as exc:
            raise AbicacheError(f"tvm-ffi is not installed ({exc}); pip install apache-tvm-ffi") from None
        self.version = metadata.version("apache-tvm-ffi")
        self.includes = (libinfo.find_include_path(), libinfo.find_dlpack_include_path())
        self.library = Path(libinfo.find_libtvm_ffi())


def function_map(functions: Mapping[str, str] | Sequence[str] | str | None) -> dict[str, str]:
    if functions is None:
        return {}
    if isinstance(functions, str):
        return {functions: ""}
    if isinstance(functions, Mapping):
        return dict(functions)
    return {name: "" for name in functions}


def decorate(source: str, functions: Mapping[str, str]) -> str:
    """tvm-ffi's headers, the source, then one export per function (as tvm-ffi writes it)."""
    lines = [*HEADERS, source]
    for name, doc in functions.items():
        lines.append(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {name});")
        if doc:
            escaped = doc.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            lines.append(f'TVM_FFI_DLL_EXPORT_TYPED_FUNC_DOC({name}, "{escaped}");')
    return "\n".join([*lines, ""])


def inline_sources(cpp_sources: Sequence[str] | str | None, cuda_sources: Sequence[str] | str | None,
                   functions: Any) -> dict[str, str]:
    cpp = "\n".join([cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources or ()))
    cuda = "\n".join([cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources or ()))
    if not cpp and not cuda:
        raise UsageError("at least one of cpp_sources and cuda_sources must be given")
    exports = function_map(functions)
    sources = {"main.cpp": decorate(cpp, exports if cpp else {})} if cpp else {}
    if cuda:
        sources["cuda.cu"] = decorate(cuda, {} if cpp else exports)
    return sources


def plan(name: str, sources: Mapping[str, str] | Sequence[Any], *, extra_cflags: Any = None,
         extra_cuda_cflags: Any = None, extra_ldflags: Any = None, extra_include_paths: Any = None,
         backend: str | None = None, embed_cubin: Mapping[str, bytes] | None = None, facts: Any = None) -> Plan:
    if backend not in (None, "cuda"):
        raise UsageError(f"backend={backend!r}: abicache.tvm_ffi builds for the CPU and CUDA (ROCm/HIP not yet)")
    ffi = TvmFfiInstall()
    facts = facts or default_cache().facts
    includes = [f"-I{p}" for p in (str(x).strip() for x in listed(extra_include_paths))]
    tree = trees.make(sources if not isinstance(sources, Mapping) else [sources], ".cpp",
                      [*lenient(extra_cflags), *includes], (*trees.COMPILED, ".cuh"))
    cuda = any(f.name.endswith(".cu") for f in tree.files)
    system = tuple(arg for inc in ffi.includes for arg in ("-isystem", inc))
    nvcc = _nvcc(system, (*lenient(extra_cuda_cflags), *cuda_arch_flags(facts))) if cuda else None
    libs = ("-ltvm_ffi", *(("-lcudart",) if cuda else ()))
    tail = (f"-L{ffi.library.parent}", *cudart_link(libs), *lenient(extra_ldflags))
    embed = _embedding(embed_cubin)
    job = Job(f"tvm-ffi module {name}", tuple(compiler_command("c++")), "compiler.cxx", "c++", tree,
              (*KEY_CFLAGS, *system), KEY_CFLAGS, ("-shared",), tail, f"{name}.so", ffi.includes, nvcc,
              embed=embed, steer=steer.for_cxx())
    nvcc_key = ["nvcc", *nvcc.key_flags] if nvcc else []
    blobs = {f"{n}.cubin": data for n, data in embed.blobs} if embed else {}
    inputs = Inputs.make({**tree.key_sources(), **blobs}, flags=["-shared", *KEY_CFLAGS, *tree.key_flags, *nvcc_key, "|", *libs,
                                                  *lenient(extra_ldflags)],
                         tools=["compiler.cxx", *(["cuda.nvcc"] if cuda else [])],
                         extra={"tvm_ffi": ffi.version, **dict(job.steer)})
    return Plan("tvm_ffi.module", name, inputs, None, (f"tvm_ffi.version == {ffi.version}",), bases=tree.bases,
                job=job)


def _embedding(embed_cubin: Mapping[str, bytes] | None) -> Embedding | None:
    """tvm-ffi's embed_cubin: each cubin linked in as data, by tvm-ffi's own tool, under
    the symbols TVM_FFI_EMBED_CUBIN(name) declares."""
    if not embed_cubin:
        return None
    if os.name == "nt":
        raise UsageError("embed_cubin needs ld and objcopy (Linux, macOS), as tvm_ffi.cpp.load_inline does")
    blobs = []
    for cubin, data in sorted(embed_cubin.items()):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(cubin)):
            raise UsageError(f"embed_cubin name {cubin!r}: it becomes a C symbol (__tvm_ffi__cubin_{cubin}); "
                             "use letters, digits and underscores")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise UsageError(f"embed_cubin[{cubin!r}] is a {type(data).__name__}; give the cubin's bytes")
        blobs.append((str(cubin), bytes(data)))
    return Embedding((sys.executable, "-m", "tvm_ffi.utils.embed_cubin"), tuple(blobs))


def _nvcc(system: tuple[str, ...], extra: tuple[str, ...]) -> CudaUnits:
    from .env import probes

    nvcc = probes.nvcc_path()
    if nvcc is None:
        raise AbicacheError("CUDA sources need nvcc, which was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    key = ("-Xcompiler", "-fPIC", "-std=c++17", "-O2", *extra)
    return CudaUnits((str(nvcc),), (*key, *system), key)


def build_inline(name: str, *, cpp_sources: Sequence[str] | str | None = None,
                 cuda_sources: Sequence[str] | str | None = None, functions: Any = None, extra_cflags: Any = None,
                 extra_cuda_cflags: Any = None, extra_ldflags: Any = None, extra_include_paths: Any = None,
                 build_directory: str | None = None, embed_cubin: Mapping[str, bytes] | None = None,
                 backend: str | None = None, cache: Cache | None = None) -> Artifact:
    """The cached build of tvm_ffi.cpp.build_inline's library, not loaded."""
    cache = cache or default_cache()
    sources = inline_sources(cpp_sources, cuda_sources, functions)
    art = plan(name, sources, extra_cflags=extra_cflags, extra_cuda_cflags=extra_cuda_cflags,
               extra_ldflags=extra_ldflags, extra_include_paths=extra_include_paths, backend=backend,
               embed_cubin=embed_cubin, facts=cache.facts).run(cache)
    keep_copy(build_directory, art, sources)
    return art


def load_inline(name: str, *, cpp_sources: Sequence[str] | str | None = None,
                cuda_sources: Sequence[str] | str | None = None, functions: Any = None, extra_cflags: Any = None,
                extra_cuda_cflags: Any = None, extra_ldflags: Any = None, extra_include_paths: Any = None,
                build_directory: str | None = None, embed_cubin: Mapping[str, bytes] | None = None,
                keep_module_alive: bool = True, backend: str | None = None, cache: Cache | None = None) -> Any:
    """tvm_ffi.cpp.load_inline through the cache; returns what tvm_ffi.load_module returns."""
    # one repr of the rest in their order (sorting them cost ~20 us a call), the cubins' bytes
    # as they are (a repr of each copied megabytes a call)
    cubins = sorted((k, v if type(v) is bytes else bytes(v)) for k, v in embed_cubin.items()) if embed_cubin else ()
    memo = ("tvm_ffi", name, _fingerprint(cpp_sources or ()), _fingerprint(cuda_sources or ()),
            repr((functions, extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths, build_directory,
                  backend)), tuple(cubins), keep_module_alive, _where(cache))
    return _load_once(memo, lambda: build_inline(
        name, cpp_sources=cpp_sources, cuda_sources=cuda_sources, functions=functions, extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags, extra_ldflags=extra_ldflags, extra_include_paths=extra_include_paths,
        build_directory=build_directory, embed_cubin=embed_cubin, backend=backend, cache=cache),
        lambda art: _load(art, keep_module_alive))


def load(name: str, *, sources: Sequence[str] | str | None = None, cpp_files: Sequence[str] | str | None = None,
         cuda_files: Sequence[str] | str | None = None, extra_cflags: Any = None, extra_cuda_cflags: Any = None,
         extra_ldflags: Any = None, extra_include_paths: Any = None, build_directory: str | None = None,
         keep_module_alive: bool = True, backend: str | None = None, cache: Cache | None = None) -> Any:
    """tvm_ffi.cpp.load through the cache: files compiled where they live, their
    headers recorded (an edit rebuilds, in this process too)."""
    files = [*listed(sources), *listed(cpp_files), *listed(cuda_files)]
    if not files:
        raise UsageError("give the source files as sources=, cpp_files= or cuda_files=")
    # the memo stats the files as given and names the store as written: no pathlib object and
    # no default store resolved a repeated call (281 us a call, 140 with a Cache given)
    memo = ("tvm_ffi-load", name, _fingerprint(files, files=True),
            repr((extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths, backend, build_directory)),
            keep_module_alive, os.getcwd(), _where(cache))

    def build() -> Artifact:
        used = cache or default_cache()
        art = plan(name, [Path(p) for p in files], extra_cflags=extra_cflags, extra_cuda_cflags=extra_cuda_cflags,
                   extra_ldflags=extra_ldflags, extra_include_paths=extra_include_paths, backend=backend,
                   facts=used.facts).run(used)
        keep_copy(build_directory, art, {})
        return art

    return _load_once(memo, build, lambda art: _load(art, keep_module_alive))


def _load(art: Artifact, keep_module_alive: bool) -> Any:
    import tvm_ffi

    return tvm_ffi.load_module(str(art.file(f"{art.name}.so")), keep_module_alive=keep_module_alive)


def build_torch_c_dlpack_addon(cache: Cache | None = None, *, verbose: bool = False) -> Artifact:
    """tvm-ffi's torch C-DLPack addon (its source ships in the tvm-ffi wheel), built as a
    classic torch library: keyed on and requiring the exact torch build (version, git,
    CUDA/HIP, C++ ABI) and this Python's ABI, since it links libtorch_python. tvm-ffi's
    own build keys it on torch's version and C++ ABI only, so a torch rebuilt under the
    same version, or another Python, reused the old library."""
    from tvm_ffi.libinfo import find_dlpack_include_path
    from tvm_ffi.utils._build_optional_torch_c_dlpack import cpp_source

    from . import torch as abitorch

    cache = cache or default_cache()
    cuda = cache.facts.get("torch.flavor") == "cuda"
    flags = ["-O3", "-fvisibility=hidden", *(["-DBUILD_WITH_CUDA"] if cuda else [])]
    return abitorch.plan("torch_c_dlpack_addon", {"addon.cpp": cpp_source}, python_module=False, extra_cflags=flags,
                         extra_ldflags=["-ltorch_python", *(["-ltorch_cuda", "-lc10_cuda"] if cuda else [])],
                         extra_include_paths=[find_dlpack_include_path()], verbose=verbose,
                         facts=cache.facts).run(cache)


def load_torch_c_dlpack_addon(cache: Cache | None = None) -> Any:
    """What tvm_ffi does at import when torch lacks `__dlpack_c_exchange_api__`, with the
    addon from the cache: sets the attribute and returns the loaded library (None when
    this torch already has the attribute)."""
    import ctypes

    import torch
    from tvm_ffi._optional_torch_c_dlpack import (_check_and_update_dlpack_c_exchange_api,
                                                  _create_dlpack_exchange_api_capsule)

    if _check_and_update_dlpack_c_exchange_api(torch.Tensor):
        return None
    lib = ctypes.CDLL(str(build_torch_c_dlpack_addon(cache).file()))
    func = lib.TorchDLPackExchangeAPIPtr
    func.restype, func.argtypes = ctypes.c_uint64, []
    torch.Tensor.__dlpack_c_exchange_api__ = _create_dlpack_exchange_api_capsule(func())
    return lib


_patch = Patch("tvm_ffi.cpp", load=load, load_inline=load_inline)


def install() -> None:
    """Route tvm_ffi.cpp.load_inline and load through abicache in this process
    (code that calls them as `tvm_ffi.cpp.load_inline(...)`); uninstall() undoes it."""
    _patch.install()


def uninstall() -> None:
    """Give tvm_ffi.cpp its own load and load_inline back."""
    _patch.uninstall()


__all__ = ["build_inline", "build_torch_c_dlpack_addon", "decorate", "inline_sources", "install", "load",
           "load_inline", "load_torch_c_dlpack_addon", "plan", "uninstall"]
