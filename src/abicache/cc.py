"""C/C++ frontend: shared libraries and CPython extension modules, built with
the system compiler ($CC/$CXX or cc/c++) and cached by abicache.

    lib = load_library("add", ['extern "C" int add(int a, int b) { return a + b; }'])
    mod = load_module("fast", [MODULE_SOURCE], abi3="3.10")

`sources` items: a str is source code, a Path is a file compiled where it
lives (so `#include "sibling.h"` and relative -I work as with the compiler run
by hand here), a mapping is {file name: code} (headers included; only
.c/.cc/.cpp/.cxx files are compiled). The compiler's identity (version and
target, never its path) is in the key; the headers it read are recorded
with their hashes, and a lookup whose headers changed is a miss (engine/).
Several translation units are compiled in parallel, each a cached object.
"""

from __future__ import annotations

from _collections_abc import Mapping  # collections.abc's, without importing collections
import ctypes  # cc is imported with abicache, so the first hit does not pay for ctypes
import os

# The call's load once per process, and its hit record's serving, are the hit path's
# (the hits package's own module): a torch extension's hit imports it and not this one. The memo
# (_loaded) and the hits counted at exit (_served) are named here too, as before.
from .hits import _loaded, _served  # noqa: F401
from .hits import _fingerprint, _load_once, _record_root, _serve, _where, call_of, import_extension

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Sequence, Union

    from .core.artifact import Artifact
    from .core.cache import Cache
    from .frontends.cc_plans import Plan

    Source = Union[str, "os.PathLike[str]", Mapping[str, str]]


def __getattr__(name: str) -> Any:
    """The plans, the compiler runs and the rest live in frontends/cc_plans.py: a call its
    hit record serves (hits/) imports none of it."""
    if name.startswith("__"):  # asked by `from abicache.cc import x` (__path__): no reason to import the plans
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .frontends import cc_plans

    if not hasattr(cc_plans, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(cc_plans, name)


def build_library(
    name: str,
    sources: Sequence[Source] | Source,
    *,
    lang: str | None = None,
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
    cache: Cache | None = None,
) -> Artifact:
    """The cached shared library (not loaded). It declares no requirement."""
    from .frontends import cc_plans

    call = call_of("cc.library", name, sources, lang=lang, cflags=cflags, ldflags=ldflags)
    return _run(cc_plans.library_plan(name, sources, lang=lang, cflags=cflags, ldflags=ldflags), cache, call)


def load_library(
    name: str,
    sources: Sequence[Source] | Source,
    *,
    lang: str | None = None,
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
    cache: Cache | None = None,
) -> ctypes.CDLL:
    """Build (once) and load a shared library with ctypes."""
    memo = ("lib", name, _fingerprint(sources), lang, tuple(cflags), tuple(ldflags), _where(cache),
            _here(sources, cflags))
    return _load_once(
        memo,
        lambda: build_library(name, sources, lang=lang, cflags=cflags, ldflags=ldflags, cache=cache),
        lambda art: ctypes.CDLL(str(art.file())),
        lambda fresh=True: _serve(call_of("cc.library", name, sources, lang=lang, cflags=cflags, ldflags=ldflags),
                                  cache, ctypes.CDLL, fresh),
    )


def build_module(
    name: str,
    sources: Sequence[Source] | Source,
    *,
    abi3: str | None = None,
    lang: str = "c",
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
    cache: Cache | None = None,
) -> Artifact:
    """The cached CPython extension module (not imported).

    abi3="3.10" builds against the limited API: one build serves every
    CPython >= 3.10. Otherwise the module is tied to this interpreter's ABI.
    """
    from .core.cache import default_cache
    from .frontends import cc_plans

    cache = cache or default_cache()
    plan = cc_plans.module_plan(name, sources, abi3=abi3, lang=lang, cflags=cflags, ldflags=ldflags,
                                facts=cache.facts)
    return _run(plan, cache, call_of("cc.module", name, sources, abi3=abi3, lang=lang, cflags=cflags, ldflags=ldflags))


def load_module(
    name: str,
    sources: Sequence[Source] | Source,
    *,
    abi3: str | None = None,
    lang: str = "c",
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
    cache: Cache | None = None,
) -> ModuleType:
    """Build (once) and import a CPython extension module."""
    memo = ("mod", name, _fingerprint(sources), abi3, lang, tuple(cflags), tuple(ldflags), _where(cache),
            _here(sources, cflags))
    return _load_once(
        memo,
        lambda: build_module(name, sources, abi3=abi3, lang=lang, cflags=cflags, ldflags=ldflags, cache=cache),
        lambda art: _import(name, os.fspath(art.file())),
        lambda fresh=True: _serve(call_of("cc.module", name, sources, abi3=abi3, lang=lang, cflags=cflags,
                                        ldflags=ldflags), cache, lambda path: _import(name, path), fresh),
    )


def _import(name: str, path: str) -> ModuleType:
    return import_extension(name, path)


def _run(plan: Plan, cache: Cache | None, call: bytes | None, named: Mapping[str, str | None] = {},
         files: Sequence[tuple[str, str | None]] = ()) -> Artifact:
    """The plan's artifact (found or built); then the hit record the next process's same
    call reads (hits/writer.py). named: facts the call names (the torch frontend's); files:
    what the lookup reads beyond its facts and compilers."""
    from .core.cache import default_cache
    from .frontends import cc_plans

    root = _record_root(cache)
    cache = cache or default_cache()
    if call is None or root is None:
        return plan.run(cache)
    from .hits import writer

    seen = writer.before(cache, call, root, plan.inputs.tools, named, files)
    art = plan.run(cache)
    writer.note(cache, call, root, art, plan.inputs.tools, dict(plan.bases), cc_plans.checking(), seen, named, files)
    return art


def _here(sources: Any, cflags: Sequence[str]) -> str | None:
    """The working directory, where relative paths in sources or flags depend on it."""
    if not cflags and type(sources) in (list, tuple) and all(type(s) is str for s in sources):
        return None  # inline code: the common hit, kept to a few hundred nanoseconds
    single = type(sources) not in (list, tuple) and isinstance(sources, (str, os.PathLike, Mapping))
    relative = any(hasattr(s, "__fspath__") and not os.path.isabs(s) for s in ([sources] if single else sources))
    return os.getcwd() if relative or any(f.startswith(("-I", "-isystem", "-iquote")) for f in cflags) else None
