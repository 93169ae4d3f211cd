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

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable, Sequence, Union

    from .core.artifact import Artifact
    from .core.cache import Cache
    from .frontends.cc_plans import Plan
    from .hits.record import Served

    Source = Union[str, "os.PathLike[str]", Mapping[str, str]]

#: memo -> (the artifact or the record that served it, what loading it made, the environment then)
_loaded: dict[tuple[Any, ...], Any] = {}
#: os.environ's own table (str on Windows, bytes elsewhere): what the memo compares
_ENVIRON = os.environ._data  # type: ignore[attr-defined]
_DIR_VARIABLE = os.environ.encodekey("ABICACHE_DIR")  # type: ignore[attr-defined]  # its key in that table


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

    call = _call("cc.library", name, sources, lang=lang, cflags=cflags, ldflags=ldflags)
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
        lambda fresh=True: _serve(_call("cc.library", name, sources, lang=lang, cflags=cflags, ldflags=ldflags),
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
    return _run(plan, cache, _call("cc.module", name, sources, abi3=abi3, lang=lang, cflags=cflags, ldflags=ldflags))


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
        lambda fresh=True: _serve(_call("cc.module", name, sources, abi3=abi3, lang=lang, cflags=cflags,
                                        ldflags=ldflags), cache, lambda path: _import(name, path), fresh),
    )


def _import(name: str, path: str) -> ModuleType:
    return import_extension(name, path)


#: module name -> the files imported under it in this process, in order
_imported: dict[str, list[str]] = {}


def import_extension(name: str, path: str | os.PathLike[str]) -> ModuleType:
    """Import the CPython extension module at path, as a cached build is imported. CPython
    keeps one module per name (a second file with the same PyInit_<name> gets the first
    module back), so a new build under a name already imported in this process (new code, or
    a header edit) is imported as `<name>_v<N>.<name>`: the init symbol is found, the module
    is new, the way cpp_extension's name_v1 is (without a rebuild). The first import under a
    name is also sys.modules[name]. Here, not in a module of its own: a torch extension's hit
    imports this module anyway, and each module more costs it ~0.1 ms (issue 49)."""
    import importlib.machinery
    import sys
    # importlib.util's own module_from_spec, without the 3 ms importlib.util imports
    from importlib._bootstrap import module_from_spec

    seen = _imported.setdefault(name, [])
    key = os.fspath(path)
    if key not in seen:
        seen.append(key)
    version = seen.index(key)
    full = name if version == 0 else f"{name}_v{version}.{name}"
    loader = importlib.machinery.ExtensionFileLoader(full, key)
    spec = importlib.machinery.ModuleSpec(full, loader, origin=key)
    spec.has_location = True  # as spec_from_file_location makes it: the module's __file__ is its path
    module = module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[full] = module
    return module


def _call(frontend: str, name: str, sources: Any, **args: Any) -> bytes | None:
    from .hits import naming

    return naming.call_of(frontend, name, sources, **args)


def _record_root(cache: Cache | None) -> str | None:
    """The store a hit record of a call with this cache is kept in, as written; None where
    no record may stand for it (a Cache given settings, or changed since: hits/)."""
    if cache is not None and not cache.as_opened():
        return None
    if cache is not None and cache.given_root is not None:
        return os.fspath(cache.given_root)
    from .hits import naming

    return naming.default_root()


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


def _serve(call: bytes | None, cache: Cache | None, load: Callable[[str], Any],
           fresh: bool = True) -> tuple[Served, Any] | None:
    """(the record that served the call, what load made of its file), or None: the full lookup.
    fresh=False: the record alone, checked and its watch armed, its file not loaded (nor the
    hit counted): what the process loaded in its first call stands on it (_load_once)."""
    root = _record_root(cache) if call is not None else None
    if root is None:
        return None
    from .hits import record

    served = record.serve(call, root)  # type: ignore[arg-type]
    if served is None:
        return None
    if not fresh:
        return served, None
    try:
        loaded = load(served.file)
    except OSError:
        return None  # removed between the check and the load (gc): the full lookup
    _count(served)
    served.warm()  # after the load, whose bytes pushed the watch's code out of the caches
    return served, loaded


#: the hits records served in this process, counted when it exits (hits/tally.py)
_served: list[tuple[str, float, str]] = []


def _count(served: Served) -> None:
    """A hit a record served, counted as the process exits, where the counts are written
    anyway: importing the counter on the call cost it ~0.15 ms (issue 49)."""
    if not _served:
        import atexit

        atexit.register(_count_at_exit)
    _served.append((served.root, served.seconds, served.path))


def _count_at_exit() -> None:
    from .hits import tally

    counted, _served[:] = list(_served), []
    for root, seconds, path in counted:
        tally.count(root, seconds, path)
    tally.flush()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_served.clear)  # a forked child's counts are its parent's (hits/tally.py)


def _recorded(memo: tuple[Any, ...], held: tuple[Any, Any, Any], serve: Callable[..., Any]) -> bool:
    """The second call of a process whose first took the full lookup (no record held then):
    the record that lookup wrote, if it holds and names the entry loaded, stands for it, checked
    and its watch armed in one native call each, as a served call's are (issue 49: asking the
    full lookup's own witnesses in Python cost this call 2 ms for a C library, 10 ms for a
    torch extension). Asked once: otherwise the full lookup's witnesses answer, as before."""
    got = serve(False)
    if got is None or got[0].path != os.path.realpath(held[0].path):
        return False  # none written (a build's witnesses too young: at exit), or another entry's
    got[0].warm()
    _loaded[memo] = (got[0], held[1], held[2])
    return True


def _where(cache: Cache | None) -> Any:
    """Which store a memo entry belongs to, as written (a Cache's root before it is opened).
    The variable is read from os.environ's table: os.environ.get of a variable that is not
    set raises and catches a KeyError inside, ~1-2.5 us of every call's 8-14."""
    return cache.given_root if cache is not None else ("default", _ENVIRON.get(_DIR_VARIABLE))


def _here(sources: Any, cflags: Sequence[str]) -> str | None:
    """The working directory, where relative paths in sources or flags depend on it."""
    if not cflags and type(sources) in (list, tuple) and all(type(s) is str for s in sources):
        return None  # inline code: the common hit, kept to a few hundred nanoseconds
    single = type(sources) not in (list, tuple) and isinstance(sources, (str, os.PathLike, Mapping))
    relative = any(hasattr(s, "__fspath__") and not os.path.isabs(s) for s in ([sources] if single else sources))
    return os.getcwd() if relative or any(f.startswith(("-I", "-isystem", "-iquote")) for f in cflags) else None


def _fingerprint(sources: Sequence[Source] | Source, files: bool = False) -> Any:
    """A cheap, hashable picture of the sources for the in-process memo. files: every item is
    a file's path, a str too (torch's load: no pathlib object made a call, where making them
    was half of a repeated call's 150 us)."""
    single = type(sources) not in (list, tuple) and isinstance(sources, (str, os.PathLike, Mapping))
    out: list[Any] = []
    for item in [sources] if single else sources:  # cheap tests first: isinstance(x, Mapping) is slow
        if type(item) is str and not files:
            out.append(item)
        elif files or hasattr(item, "__fspath__"):
            try:
                st = os.stat(item)
                out.append((os.fspath(item), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
            except OSError:
                out.append((os.fspath(item), None))  # collect_sources reports it
        elif isinstance(item, Mapping):
            out.append(tuple(sorted(item.items())))
        else:
            out.append(item)
    return tuple(out)


def _load_once(memo: tuple[Any, ...], get: Callable[[], Artifact], load: Callable[[Artifact], Any],
               serve: Callable[..., tuple[Served, Any] | None] | None = None) -> Any:
    """Load an artifact once per process, and again when a header it was
    compiled from changed (a notebook editing a header and loading again gets
    the new code). gc may remove the entry between lookup and load: then look
    it up (or build it) once more. serve: the first call's hit record (hits/), if
    one serves it (serve(False): the record alone, see _recorded). A memo entry holds the
    environment it was made in and serves no call
    after any variable changed: the compilers, $CC, the steering variables and every
    variable a compiler reads are in it (never looser than the key; a hit record's name
    holds the whole environment too: hits/naming.py); one comparison of os.environ's
    table, where picking the steering variables out of it cost each call 2.7 us."""
    held = _loaded.get(memo)
    if held is not None and held[2] == _ENVIRON:
        if serve is not None and held[0].unasked() and _recorded(memo, held, serve):
            return held[1]
        if held[0].current():
            return held[1]
    if held is None and serve is not None:
        got = serve()
        if got is not None:
            _loaded[memo] = (*got, dict(_ENVIRON))
            return got[1]
    art = get()
    if held is not None and os.fspath(art.path) == os.fspath(held[0].path):  # touched, not changed: the same build
        _loaded[memo] = (art, held[1], dict(_ENVIRON))
        return held[1]
    try:
        loaded = load(art)
    except OSError:
        if art.path.exists():
            raise
        art = get()
        loaded = load(art)
    _loaded[memo] = (art, loaded, dict(_ENVIRON))
    return loaded
