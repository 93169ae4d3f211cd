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

from .hits import _fingerprint, _load_once, _record_root, _serve, _where, import_extension

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

    from .core.cache import Cache

# The plans (what to build, how it is keyed) are in frontends/torch_plans.py: a call its hit
# record serves (hits/__init__.py torch_call) imports none of them. Their public names
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
    (frontends/torch_newer.py), never a TypeError where torch would run it."""
    if newer:
        return _newer().call("load_inline", load_inline, _patch().saved.get("load_inline"), locals(), newer,
                             stable=stable, target=target, cache=cache)
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
        return _newer().call("load", load, _patch().saved.get("load"), locals(), newer, stable=stable,
                             target=target, cache=cache)
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
    """The sources as a record names them (paths, never code: hits/__init__.py call_of), made where the
    memo does not answer."""
    from pathlib import Path  # torch imports it anyway: a load needs torch

    return [Path(item) for item in listed]


def _served(frontend: str, name: str, sources: Any, args: Mapping[str, Any], stable: bool,
            python_module: bool, fresh: bool = True) -> Any:
    """The call served by its hit record (hits/__init__.py torch_call), or None: the full lookup.
    torch is imported first: the record names the torch this process runs, and loading the
    extension needs it anyway."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None  # the full lookup says that torch is missing
    from .hits import leave, reach, torch_call

    root = _record_root(args["cache"]) if fresh else None
    real = reach(root) if root is not None else None  # the keeper wakes while the call is named and read
    try:
        called = torch_call(frontend, name, sources, args)
        if called is None:
            return None
        return _serve(called[0], args["cache"], lambda path: _load(path, name, stable, python_module), fresh,
                      root, real)
    finally:
        leave()


def _plans() -> Any:
    from .frontends import torch_plans

    return torch_plans


def _newer() -> Any:
    """frontends/torch_newer.py: a call with a parameter of a newer torch, torch's own."""
    from .frontends import torch_newer

    return torch_newer


def _load(path: str, name: str, stable: bool, python_module: bool) -> Any:
    """Load the extension at path: import a module, or load an op library into torch.ops
    (its path is what the call returns)."""
    import torch  # the extension links libtorch: torch must be loaded first

    if python_module:
        return import_extension(name, path)
    if stable:
        from .frontends import torch_oplibs

        torch_oplibs.one_build(path, name)
    torch.ops.load_library(path)
    return path


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
