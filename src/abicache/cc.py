"""C/C++ frontend: shared libraries and CPython extension modules, built with
the system compiler ($CC/$CXX or cc/c++) and cached by abicache.

    lib = load_library("add", ['extern "C" int add(int a, int b) { return a + b; }'])
    mod = load_module("fast", [MODULE_SOURCE], abi3="3.10")

`sources` items: a str is source code, a Path is a file to read, a mapping is
{file name: code} (headers included; only .c/.cc/.cpp/.cxx files are compiled).
The compiler's identity (version and target, never its path) is in the key.
"""

from __future__ import annotations

import ctypes  # cc is imported with abicache, so the first hit does not pay for ctypes
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, NamedTuple, Sequence, Union

from .cache import Artifact, Cache, default_cache
from .env import Facts
from .errors import AbicacheError, BuildError
from .key import Inputs

Source = Union[str, "os.PathLike[str]", Mapping[str, str]]
_COMPILED = (".c", ".cc", ".cpp", ".cxx", ".c++")
_LANGS = {"c": ("CC", "cc", "compiler.cc", ".c"), "c++": ("CXX", "c++", "compiler.cxx", ".cpp")}
_loaded: dict[tuple[Any, ...], Any] = {}


def _lang(lang: str) -> tuple[str, str, str, str]:
    try:
        return _LANGS[lang]
    except KeyError:
        raise AbicacheError(f"unknown lang {lang!r}; use 'c' or 'c++'") from None


def collect_sources(sources: Sequence[Source] | Source, ext: str) -> dict[str, str]:
    """Name every source; inline strings become source0.cpp, source1.cpp, ..."""
    if isinstance(sources, (str, os.PathLike, Mapping)):
        sources = [sources]
    named: dict[str, str] = {}
    for i, item in enumerate(sources):
        if isinstance(item, Mapping):
            named.update({str(k): str(v) for k, v in item.items()})
        elif isinstance(item, os.PathLike):
            path = Path(item)
            try:
                named[path.name] = path.read_text()
            except OSError as exc:
                raise AbicacheError(f"cannot read source file {path}: {exc.strerror}") from None
        elif isinstance(item, str):
            named[f"source{i}{ext}"] = item
        else:
            raise AbicacheError(f"source {i} is a {type(item).__name__}; pass str code, a Path or a dict")
    if not any(n.endswith(_COMPILED) for n in named):
        raise AbicacheError("no source to compile (.c, .cc, .cpp or .cxx) among " + ", ".join(named))
    return named


def compiler_command(lang: str) -> list[str]:
    variable, default, _, _ = _lang(lang)
    return (os.environ.get(variable) or default).split()


def run_compiler(argv: list[str], cwd: Path, what: str, verbose: bool = False) -> None:
    """Run one compiler command; on failure, BuildError with its output."""
    import subprocess

    if verbose:
        print("abicache: " + " ".join(argv), file=sys.stderr, flush=True)
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, errors="replace")
    except FileNotFoundError:
        raise BuildError(
            f"compiler {argv[0]!r} not found while building {what}; install it or set CC/CXX",
            command=tuple(argv),
        ) from None
    if done.returncode != 0:
        raise BuildError(
            f"building {what} failed (exit {done.returncode})",
            command=tuple(argv),
            output=done.stdout + done.stderr,
        )


def _compile(
    argv_head: list[str],
    named: dict[str, str],
    out: Path,
    argv_tail: list[str],
    what: str,
    *,
    verbose: bool = False,
    objects: Callable[[Path], list[str]] | None = None,
) -> None:
    """Write sources into a scratch dir, compile and link straight into `out`.

    objects(scratch) may first build object files there (e.g. nvcc for .cu
    sources); they are linked in.
    """
    import tempfile

    from . import progress

    with tempfile.TemporaryDirectory(prefix="abicache-cc-") as scratch:
        work = Path(scratch)
        for name, code in named.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(code)
        compiled = [n for n in sorted(named) if n.endswith(_COMPILED)]
        with progress.step(f"compiling {what} ({', '.join(sorted(named))})", force=verbose):
            extra = objects(work) if objects is not None else []
            run_compiler(argv_head + compiled + extra + ["-o", str(out)] + argv_tail, work, what, verbose)


def library_filename(name: str) -> str:
    return f"{name}.dll" if os.name == "nt" else (
        f"lib{name}.dylib" if sys.platform == "darwin" else f"lib{name}.so"
    )


class Plan(NamedTuple):
    """Everything the cache needs to find or build one artifact."""

    kind: str
    name: str
    inputs: Inputs
    build: Callable[[Path], None]
    requires: tuple[str, ...] = ()

    def run(self, cache: Cache | None = None) -> Artifact:
        cache = cache or default_cache()
        return cache.get_or_build(self.kind, self.name, self.inputs, self.build, self.requires)


def library_plan(
    name: str,
    sources: Sequence[Source] | Source,
    *,
    lang: str = "c++",
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
) -> Plan:
    _, _, tool, ext = _lang(lang)
    named = collect_sources(sources, ext)
    filename = library_filename(name)
    soname = [f"-Wl,-soname,{filename}"] if sys.platform.startswith("linux") else []
    head = compiler_command(lang) + ["-shared", "-fPIC", "-O2", *cflags]
    tail = [*soname, *ldflags]

    def build(out: Path) -> None:
        _compile(head, named, out / filename, tail, f"library {name}")

    inputs = Inputs.make(named, flags=[*head[1:], "|", *tail], tools=[tool], extra={"lang": lang})
    return Plan("cc.library", name, inputs, build)


def build_library(
    name: str,
    sources: Sequence[Source] | Source,
    *,
    lang: str = "c++",
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
    cache: Cache | None = None,
) -> Artifact:
    """The cached shared library (not loaded). It declares no requirement."""
    return library_plan(name, sources, lang=lang, cflags=cflags, ldflags=ldflags).run(cache)


def load_library(
    name: str,
    sources: Sequence[Source] | Source,
    *,
    lang: str = "c++",
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
    cache: Cache | None = None,
) -> ctypes.CDLL:
    """Build (once) and load a shared library with ctypes."""
    memo = ("lib", name, _fingerprint(sources), lang, tuple(cflags), tuple(ldflags), _where(cache))
    return _load_once(
        memo,
        lambda: build_library(name, sources, lang=lang, cflags=cflags, ldflags=ldflags, cache=cache),
        lambda art: ctypes.CDLL(str(art.file())),
    )


def _where(cache: Cache | None) -> Any:
    """Which store a memo entry belongs to, without building a Path on every hit."""
    return cache.root if cache is not None else ("default", os.environ.get("ABICACHE_DIR"))


def _fingerprint(sources: Sequence[Source] | Source) -> Any:
    """A cheap, hashable picture of the sources for the in-process memo."""
    items = [sources] if isinstance(sources, (str, os.PathLike, Mapping)) else list(sources)
    out: list[Any] = []
    for item in items:
        if isinstance(item, Mapping):
            out.append(tuple(sorted(item.items())))
        elif isinstance(item, os.PathLike):
            try:
                st = os.stat(item)
                out.append((os.fspath(item), st.st_size, st.st_mtime_ns, st.st_ino))
            except OSError:
                out.append((os.fspath(item), None))  # collect_sources reports it
        else:
            out.append(item)
    return tuple(out)


def _load_once(memo: tuple[Any, ...], get: Callable[[], Artifact], load: Callable[[Artifact], Any]) -> Any:
    """Load an artifact once per process. gc may remove the entry between
    lookup and load: then look it up (or build it) once more."""
    loaded = _loaded.get(memo)
    if loaded is None:
        art = get()
        try:
            loaded = load(art)
        except OSError:
            if art.path.exists():
                raise
            loaded = load(get())
        _loaded[memo] = loaded
    return loaded


def _python_flags(abi3: str | None, facts: Facts) -> tuple[list[str], str, dict[str, str], list[str]]:
    """(compile flags, file suffix, key extras, declared requirements) for a module."""
    import sysconfig

    include = sysconfig.get_paths()["include"]
    if abi3 is None:
        abi = facts.get("python.abi") or "unknown"
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        return [f"-I{include}"], suffix, {"python.abi": abi}, [f"python.abi == {abi}"]
    major, _, minor = abi3.partition(".")
    if not (major == "3" and minor.isdigit()):
        raise AbicacheError(f"abi3={abi3!r} is not a Python version like '3.10'")
    hexversion = f"0x03{int(minor):02X}0000"
    flags = [f"-I{include}", f"-DPy_LIMITED_API={hexversion}"]
    suffix = ".abi3.so" if os.name != "nt" else ".pyd"
    return flags, suffix, {"abi3": abi3}, [f"python.abi3 >= {abi3}"]


def module_plan(
    name: str,
    sources: Sequence[Source] | Source,
    *,
    abi3: str | None = None,
    lang: str = "c",
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
    facts: Facts | None = None,
) -> Plan:
    _, _, tool, ext = _lang(lang)
    named = collect_sources(sources, ext)
    pyflags, suffix, extra, declared = _python_flags(abi3, facts or default_cache().facts)
    filename = name + suffix
    head = compiler_command(lang) + ["-shared", "-fPIC", "-O2", *pyflags, *cflags]
    tail = list(ldflags)

    def build(out: Path) -> None:
        _compile(head, named, out / filename, tail, f"module {name}")

    # The include path names this interpreter's install: the ABI stands for it in the key.
    flags = [f for f in head[1:] if not f.startswith("-I")] + ["|", *tail]
    inputs = Inputs.make(named, flags=flags, tools=[tool], extra={"lang": lang, **extra})
    return Plan("cc.module", name, inputs, build, tuple(declared))


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
    cache = cache or default_cache()
    plan = module_plan(name, sources, abi3=abi3, lang=lang, cflags=cflags, ldflags=ldflags,
                       facts=cache.facts)
    return plan.run(cache)


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
    memo = ("mod", name, _fingerprint(sources), abi3, lang, tuple(cflags), tuple(ldflags), _where(cache))
    return _load_once(
        memo,
        lambda: build_module(name, sources, abi3=abi3, lang=lang, cflags=cflags, ldflags=ldflags, cache=cache),
        lambda art: import_extension(name, art.file()),
    )


def import_extension(name: str, path: Path) -> ModuleType:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise AbicacheError(f"cannot import {path} as module {name!r}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module
