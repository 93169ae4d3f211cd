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

from .cc import _fingerprint, _load_once, _record_root, _serve, _where, import_extension

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

    from .core.cache import Cache

# The plans (what to build, how it is keyed) are in frontends/torch_plans.py: a call its hit
# record serves (hits/naming.py torch_call) imports none of them. Their public names
# (build_inline, plan, inline_sources, target_macro, lenient, TorchInstall, ...) are this
# module's too (__getattr__ below).


def load_inline(name: str, cpp_sources: Sequence[str] | str, cuda_sources: Sequence[str] | str | None = None,
                sycl_sources: Sequence[str] | str | None = None, functions: Any = None,
                extra_cflags: Any = None, extra_cuda_cflags: Any = None, extra_sycl_cflags: Any = None,
                extra_ldflags: Any = None, extra_include_paths: Any = None, build_directory: Any = None,
                verbose: bool = False, with_cuda: bool | None = None, with_sycl: bool | None = None,
                is_python_module: bool = True, with_pytorch_error_handling: bool = True,
                keep_intermediates: bool = True, use_pch: bool = False, no_implicit_headers: bool = False,
                gil_not_used: bool = False, *,
                stable: bool = False, target: str | None = None, cache: Cache | None = None, **newer: Any) -> Any:
    """torch.utils.cpp_extension.load_inline, its arguments in its order, through
    the cache: a module for python modules, else the library's path (its ops are
    then in torch.ops). Same name, new code in one process: the new module.
    newer: a parameter of a later torch abicache does not know: the call is torch's own
    (_torchs_own), never a TypeError where torch would run it."""
    if newer:
        return _torchs_own("load_inline", locals(), newer, stable=stable, target=target, cache=cache)
    def args() -> dict[str, Any]:  # the call's arguments, made where the memo does not answer (1.5 us a call)
        return dict(cuda_sources=cuda_sources, sycl_sources=sycl_sources, functions=functions,
                    extra_cflags=extra_cflags, extra_cuda_cflags=extra_cuda_cflags, extra_sycl_cflags=extra_sycl_cflags,
                    extra_ldflags=extra_ldflags, extra_include_paths=extra_include_paths,
                    build_directory=build_directory, verbose=verbose, with_cuda=with_cuda, with_sycl=with_sycl,
                    is_python_module=is_python_module, with_pytorch_error_handling=with_pytorch_error_handling,
                    keep_intermediates=keep_intermediates, use_pch=use_pch, no_implicit_headers=no_implicit_headers,
                    gil_not_used=gil_not_used, stable=stable, target=target, cache=cache)

    # verbose only says more: not in the memo (one repr of the rest, in their order: sorting cost 20 us a call)
    memo = ("torch", name, _fingerprint(cpp_sources), _fingerprint(cuda_sources) if cuda_sources else (),
            repr((functions, sycl_sources, extra_cflags, extra_cuda_cflags, extra_sycl_cflags, extra_ldflags,
                  extra_include_paths, build_directory, with_cuda, with_sycl, is_python_module,
                  with_pytorch_error_handling, keep_intermediates, use_pch, no_implicit_headers, gil_not_used, stable,
                  target)), _where(cache))
    python_module = is_python_module and not stable
    return _load_once(memo, lambda: _plans().build_inline(name, cpp_sources, **args()),
                      lambda art: _load(os.fspath(art.file()), name, stable, python_module),
                      lambda fresh=True: _served("torch.inline", name, cpp_sources, args(), stable, python_module,
                                                 fresh))


def load(name: str, sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
         extra_cflags: Any = None, extra_cuda_cflags: Any = None, extra_sycl_cflags: Any = None,
         extra_ldflags: Any = None, extra_include_paths: Any = None, build_directory: Any = None,
         verbose: bool = False, with_cuda: bool | None = None, with_sycl: bool | None = None,
         is_python_module: bool = True, is_standalone: bool = False, keep_intermediates: bool = True, *,
         stable: bool = False, target: str | None = None, cache: Cache | None = None,
         use_pch: bool = False, **newer: Any) -> Any:
    """torch.utils.cpp_extension.load, its arguments in its order, through the
    cache: each source compiled where it lives (so its sibling headers and
    relative include paths work as with the compiler run by hand here). The
    headers they read are recorded: editing one rebuilds, in this process too.
    is_standalone: an executable; its path is returned. newer: as load_inline's."""
    if newer:
        return _torchs_own("load", locals(), newer, stable=stable, target=target, cache=cache)
    args = {k: v for k, v in locals().items() if k not in ("name", "sources", "newer")}  # the call, as given
    if is_python_module and is_standalone:
        from .errors import UsageError

        raise UsageError("`is_python_module` and `is_standalone` are mutually exclusive.")
    listed = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    python_module = is_python_module and not stable and not is_standalone
    flags = (extra_cflags, extra_cuda_cflags, extra_sycl_cflags, extra_ldflags, extra_include_paths, with_sycl)
    memo = ("torch-load", name, _fingerprint(listed, files=True), stable, target, python_module, is_standalone,
            with_cuda, repr(flags), os.getcwd(), _where(cache), str(build_directory), keep_intermediates, use_pch)
    build = lambda: _plans().build_load(name, listed, args)  # noqa: E731
    if is_standalone:
        return _load_once(memo, build, lambda art: str(art.file()))
    return _load_once(memo, build, lambda art: _load(os.fspath(art.file()), name, stable, python_module),
                      lambda fresh=True: _served("torch.load", name, _paths(listed), args, stable, python_module,
                                                 fresh))


def _paths(listed: Sequence[str | os.PathLike[str]]) -> list[Any]:
    """The sources as a record names them (paths, never code: hits/naming.py), made where the
    memo does not answer."""
    from pathlib import Path  # torch imports it anyway: a load needs torch

    return [Path(item) for item in listed]


def _served(frontend: str, name: str, sources: Any, args: Mapping[str, Any], stable: bool,
            python_module: bool, fresh: bool = True) -> Any:
    """The call served by its hit record (hits/naming.py torch_call), or None: the full lookup.
    torch is imported first: the record names the torch this process runs, and loading the
    extension needs it anyway."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None  # the full lookup says that torch is missing
    from .hits import naming, vouch

    root = _record_root(args["cache"]) if fresh else None
    if root is not None:
        vouch.reach(root)  # the store's keeper wakes while the call is named and its record read
    try:
        called = naming.torch_call(frontend, name, sources, args)
        if called is None:
            return None
        return _serve(called[0], args["cache"], lambda path: _load(path, name, stable, python_module), fresh)
    finally:
        vouch.leave()


def _plans() -> Any:
    from .frontends import torch_plans

    return torch_plans


#: abicache's own keywords of load and load_inline, which torch's functions do not take
_OURS = ("stable", "target", "cache", "newer")


def _torchs_own(function: str, given: Mapping[str, Any], newer: Mapping[str, Any], **ours: Any) -> Any:
    """A call with a parameter of a newer torch than abicache knows, handed to torch's own
    function (uncached), with one warning naming it: every torch release may add one, and
    the drop-in must not turn it into a TypeError in someone's program. The arguments given
    are passed on as keywords, those left at torch's defaults not at all (an older torch may
    lack them); a parameter torch does not know either is torch's own TypeError."""
    import importlib
    import inspect

    from .errors import UsageError, warn_once

    mine = globals()[function]
    if any(value is not None and value is not False for value in ours.values()):
        named = ", ".join(f"{k}=" for k, v in ours.items() if v is not None and v is not False)
        raise UsageError(f"abicache.torch.{function}: {', '.join(sorted(newer))} is not a parameter abicache "
                         f"knows, and torch's own {function} takes no {named}: drop one or the other")
    defaults = {p.name: p.default for p in inspect.signature(mine).parameters.values()}
    passed = {k: v for k, v in given.items() if k not in _OURS and k in defaults and v is not defaults[k]}
    original = _patch().saved.get(function) or getattr(importlib.import_module("torch.utils.cpp_extension"), function)
    if original is mine:
        raise UsageError(f"abicache.torch.{function}: torch's own {function} cannot be found (it was replaced)")
    warn_once(f"abicache.torch.{function}: {', '.join(sorted(newer))} is a parameter of a newer torch than "
              f"abicache knows; this call runs torch's own {function}, uncached (upgrade abicache to cache it)")
    return original(**passed, **newer)


def _load(path: str, name: str, stable: bool, python_module: bool) -> Any:
    """Load the extension at path: import a module, or load an op library into torch.ops
    (its path is what the call returns)."""
    import torch  # the extension links libtorch: torch must be loaded first

    if python_module:
        return import_extension(name, path)
    if stable:
        _one_build_per_op_library(path, name)
    torch.ops.load_library(path)
    return path


#: the stable op libraries loaded in this process: path -> extension name
_stable_loaded: dict[str, str] = {}
_stable_namespaces: dict[str, frozenset[str]] = {}  # path -> the namespaces it defines, once read
_STABLE_LIBRARY = rb"STABLE_TORCH_LIBRARY_static_init_(\w+)\x00"  # in .symtab (compiled by re once used)


def _one_build_per_op_library(path: str, name: str) -> None:
    """torch crashes (SIGSEGV in torch.ops.load_library) when a second build of
    one STABLE_TORCH_LIBRARY namespace is loaded into a process that has the
    first: refuse it with the reason instead. A library's namespaces are read
    (the whole file) only once a second library comes: the first of a process,
    the common case, is loaded without reading it."""
    if path not in _stable_loaded and _stable_loaded:
        found = _namespaces_of(path, name)
        for loaded, other in _stable_loaded.items():
            for ns in sorted(found & _namespaces_of(loaded, other)):
                from .errors import UsageError

                raise UsageError(f"the stable op library {ns!r} is already loaded in this process from {loaded}; "
                                 f"torch cannot load a second build of it ({path}) without crashing. Start a new "
                                 "process to use the new build, or give the new code another library name")
    _stable_loaded[path] = name


def _namespaces_of(path: str, name: str) -> frozenset[str]:
    """The namespaces a stable op library defines; a stripped one, or one whose entry was
    evicted since this process loaded it, is known by its extension name."""
    found = _stable_namespaces.get(path)
    if found is None:
        import re

        try:
            with open(path, "rb") as f:
                found = frozenset(n.decode() for n in re.findall(_STABLE_LIBRARY, f.read()))
        except OSError:
            found = frozenset()
        found = _stable_namespaces[path] = found or frozenset({f"({name})"})
    return found


_patches: list[Any] = []


def _patch() -> Any:
    """The Patch of torch.utils.cpp_extension (frontends/patching.py), made at its first use."""
    if not _patches:
        from .frontends.patching import Patch

        _patches.append(Patch("torch.utils.cpp_extension", load=load, load_inline=load_inline))
    return _patches[0]


def install() -> None:
    """Route torch.utils.cpp_extension.load and load_inline through abicache in
    this process, for code that calls them as `cpp_extension.load_inline(...)`
    (a name imported before install() keeps the original). uninstall() undoes it."""
    _patch().install()


def uninstall() -> None:
    """Give torch.utils.cpp_extension its own load and load_inline back."""
    _patch().uninstall()


def __getattr__(name: str) -> Any:
    """abicache.torch.compile_cache (torch_compile.py), imported on its first use: an
    extension's hit does not load torch.compile's cache; the plans' names
    (frontends/torch_plans.py), imported on the first miss."""
    if name == "compile_cache":
        from .frontends import torch_compile

        globals()[name] = torch_compile
        return torch_compile
    if not name.startswith("__"):
        plans = _plans()
        if hasattr(plans, name):
            return getattr(plans, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# build_inline, lenient, plan and target_macro are the plans' (__getattr__): a star import imports them
__all__ = ["build_inline", "install", "lenient", "load", "load_inline", "plan", "target_macro", "uninstall"]  # noqa: F822
