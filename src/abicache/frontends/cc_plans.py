"""What cc.py's calls are made of: the plans (kind, name, inputs, the engine's job, the
recipe `abicache check` rebuilds from), the compiler runs, and importing a module. cc.py
imports this on a call its hit record (hits/) did not serve.

The calls, and what their sources may be, are cc.py's (its docstring).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from collections.abc import Mapping

from ..engine import steer, tree as trees
from ..engine.job import Job
from ..core.artifact import Artifact, BuildResult
from ..core.cache import Cache, default_cache
from ..env import Facts
from ..errors import AbicacheError, BuildError
from ..core.key import Inputs
from ..values.records import named_tuple

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Callable, Sequence, Union

    Source = Union[str, "os.PathLike[str]", Mapping[str, str]]

_COMPILED = (".c", ".cc", ".cpp", ".cxx", ".c++")  # what cc compiles (torch adds .cu)
_LANGS = {"c": ("CC", "cc", "compiler.cc", ".c"), "c++": ("CXX", "c++", "compiler.cxx", ".cpp")}


def _lang(lang: str) -> tuple[str, str, str, str]:
    try:
        return _LANGS[lang]
    except KeyError:
        raise AbicacheError(f"unknown lang {lang!r}; use 'c' or 'c++'") from None


def compiler_command(lang: str) -> list[str]:
    """$CC or $CXX (cc, c++) as words: a wrapper and flags after the compiler included."""
    variable, default, _, _ = _lang(lang)
    return list(steer.command(variable, default))


def run_compiler(argv: list[str], cwd: Path, what: str, verbose: bool = False, *,
                 env: Mapping[str, str] | None = None, fds: Sequence[int] = ()) -> None:
    """Run one compiler command (env: variables added to this process's); on
    failure, BuildError with its output. It runs in a process group of its own,
    stopped with the build when the build is interrupted (engine/interrupt.py)."""
    import subprocess

    from ..engine import interrupt

    if interrupt.stopping():
        raise interrupt.Stopped(f"building {what}: interrupted")
    if verbose:
        print("abicache: " + " ".join(argv), file=sys.stderr, flush=True)
    try:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", env={**os.environ, **env} if env else None,
                                pass_fds=tuple(fds), start_new_session=True)
    except FileNotFoundError:
        raise BuildError(
            f"compiler {argv[0]!r} not found while building {what}; install it or set CC/CXX",
            command=tuple(argv), missing_tool=argv[0],
        ) from None
    with interrupt.running(proc):
        stdout, stderr = _communicate(proc)
    if proc.returncode != 0:
        if interrupt.stopping():
            raise interrupt.Stopped(f"building {what}: interrupted")
        _refuse_full_disk(argv, cwd, stdout + stderr)
        raise BuildError(
            f"building {what} failed (exit {proc.returncode})",
            command=tuple(argv),
            output=stdout + stderr,
        )


#: what a tool prints when the disk or the quota is full (its own words around it vary: the
#: assembler's "can't fill ... in section", ld's "final link failed", BFD's assertions)
_FULL = {errno.ENOSPC: os.strerror(errno.ENOSPC), errno.EDQUOT: os.strerror(errno.EDQUOT)}


def _refuse_full_disk(argv: Sequence[str], cwd: str | None, output: str) -> None:
    """A tool that failed for want of space is the store's (or the disk's) failure, not the
    source's: an OSError naming the output it was writing, which the cache turns into the
    same one line a full disk gives when it publishes (errors.unwritable_store)."""
    for code, text in _FULL.items():
        if text in output:
            out = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-o"), None)
            raise OSError(code, text, os.path.join(cwd or os.getcwd(), out) if out else (cwd or os.getcwd()))


def _communicate(proc: Any) -> tuple[str, str]:
    """proc's output once it exits, waiting in slices (engine/interrupt.py: a signal another
    thread received is handled at once); a retried communicate() loses no output."""
    import subprocess

    from ..engine import interrupt

    while True:
        try:
            return proc.communicate(timeout=interrupt.SLICE)
        except subprocess.TimeoutExpired:
            continue


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
    from ..console import progress
    from ..engine import scratch as scratches

    with scratches.scratch() as scratch:  # swept by a later build where this process is killed
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


@named_tuple
class Plan:
    """Everything the cache needs to find or build one artifact."""

    kind: str
    name: str
    inputs: Inputs
    build: Callable[[Path], Any] | None  # None: the build engine runs `job`
    requires: tuple[str, ...] = ()
    bases: Mapping[str, str] = {}  # where the folders its dependencies are recorded against are
    job: Job | None = None
    custom: Callable[[Path, Cache], Any] | None = None  # a builder that drives the engine itself
    recipe: Mapping[str, Any] | None = None  # how to make the same call again (abicache check)

    def builder(self, cache: Cache) -> Callable[[Path], Any]:
        if self.build is not None:
            return self.build
        if self.custom is not None:
            custom = self.custom
            built: Callable[[Path], Any] = lambda out: custom(out, cache)  # noqa: E731
        else:
            assert self.job is not None
            built = _engine(self.job, cache)
        if self.recipe is not None:
            built.recipe = dict(self.recipe)  # type: ignore[attr-defined]  # kept in the manifest
        built.for_cache = self.builder  # type: ignore[attr-defined]  # the same build, into another store
        return built

    def run(self, cache: Cache | None = None) -> Artifact:
        cache = cache or default_cache()
        art = cache.get_or_build(self.kind, self.name, self.inputs, self.builder(cache), self.requires,
                                 bases=self.bases)
        if art.origin == "local" and checking():
            from . import check_spawn

            check_spawn.maybe_check(cache, art)
        return art


def checking() -> bool:
    """ABICACHE_CHECK is set to something (the environment, or the user's config file)."""
    if "ABICACHE_CHECK" in os.environ:
        return os.environ["ABICACHE_CHECK"].strip() not in ("", "0")
    from ..settings import config

    return config.text("ABICACHE_CHECK") not in ("", "0")


def library_plan(
    name: str,
    sources: Sequence[Source] | Source,
    *,
    lang: str | None = None,
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
) -> Plan:
    """lang None: each file's language by its extension, as a compiler driver
    decides it (.c is C, compiled with $CC; the rest C++, and str code is
    C++); "c" or "c++" compiles every source in that language."""
    _, _, tool, ext = _lang(lang or "c++")
    tree = trees.make(sources, ext, cflags, _COMPILED, name)
    filename = library_filename(name)
    soname = [f"-Wl,-soname,{filename}"] if sys.platform.startswith("linux") else []
    tail = (*soname, *ldflags)
    job = _job(f"library {name}", tree, lang, ("-fPIC", "-O2"), ("-fPIC", "-O2"), ("-shared",), tail, filename)
    inputs = Inputs.make(tree.key_sources(), flags=["-shared", "-fPIC", "-O2", *tree.key_flags, "|", *tail],
                         tools=_tools(job), extra={"lang": _key_lang(job), **dict(job.steer)})
    recipe = _recipe("cc.library", name, sources, lang=lang, cflags=list(cflags), ldflags=list(ldflags))
    return Plan("cc.library", name, inputs, None, bases=tree.bases, job=job, recipe=recipe)


def _recipe(frontend: str, name: str, sources: Sequence[Source] | Source, **args: Any) -> dict[str, Any]:
    """The call, as JSON: `abicache check` makes it again, in the same folder, to
    compare a fresh build with the cached one. Sources: code, a file, or files."""
    single = type(sources) not in (list, tuple) and isinstance(sources, (str, os.PathLike, Mapping))
    listed: list[dict[str, Any]] = []
    for item in [sources] if single else sources:
        if isinstance(item, str):
            listed.append({"code": item})
        elif hasattr(item, "__fspath__"):
            listed.append({"path": os.fsdecode(os.fspath(item))})
        else:
            listed.append({"files": {str(k): str(v) for k, v in dict(item).items()}})
    return {"frontend": frontend, "name": name, "sources": listed, "cwd": os.getcwd(), **args}


def plan_of(recipe: Mapping[str, Any]) -> Plan:
    """The Plan a recipe describes, made in this process's working directory."""
    from pathlib import Path as P

    sources: list[Source] = []
    for item in recipe["sources"]:
        sources.append(item["code"] if "code" in item else P(item["path"]) if "path" in item else item["files"])
    common = dict(lang=recipe.get("lang"), cflags=recipe.get("cflags", ()), ldflags=recipe.get("ldflags", ()))
    if recipe.get("frontend") == "cc.module":
        return module_plan(recipe["name"], sources, abi3=recipe.get("abi3"), **common)
    if recipe.get("frontend") == "cc.library":
        return library_plan(recipe["name"], sources, **common)
    raise AbicacheError(f"cannot rebuild from a recipe of {recipe.get('frontend')!r}")


def _job(what: str, tree: trees.Tree, lang: str | None, cflags: tuple[str, ...], key_cflags: tuple[str, ...],
         link: tuple[str, ...], tail: tuple[str, ...], filename: str, covered: tuple[str, ...] = ()) -> Job:
    """A job of this frontend: lang None lets each unit's extension decide
    (the C++ driver links, unless every unit is C)."""
    cc, cxx = tuple(compiler_command("c")), tuple(compiler_command("c++"))
    units = [f.name for f in tree.units]
    if lang is None:
        lang = "c" if units and all(n.endswith(".c") for n in units) else "c++"
        c_units = any(n.endswith(".c") for n in units) and lang == "c++"
    else:
        c_units = False
    _, _, tool, _ = _lang(lang)
    main = cc if lang == "c" else cxx
    commands = (("cxx", cxx), ("cc", cc)) if c_units else ((("cc" if lang == "c" else "cxx"), main),)
    return Job(what, main, tool, lang, tree, cflags, key_cflags, link, tail, filename, covered,
               c_compiler=cc if c_units else (), steer=tuple(sorted(steer.key_extra(*commands, cuda=False).items())))


def _key_lang(job: Job) -> str:
    """The languages the units compile in: lang=None over .cpp files is the same build as lang="c++"."""
    return f"{job.lang}+c" if job.c_compiler else job.lang


def _tools(job: Job) -> list[str]:
    return [job.tool, *(["compiler.cc"] if job.c_compiler else [])]


def _engine(job: Job, cache: Cache) -> Callable[[Path], BuildResult]:
    def build(out: Path) -> BuildResult:
        from ..console import progress
        from ..engine import units

        with progress.step(f"compiling {job.what} ({', '.join(f.name for f in job.tree.files)})"):
            return units.build(job, cache, out, runner(job.verbose))

    build.__qualname__ = f"engine.units({job.what})"
    return build


def runner(verbose: bool) -> Callable[..., None]:
    return lambda argv, cwd, what, **watched: run_compiler(argv, cwd, what, verbose, **watched)


def python_include() -> str:
    """This interpreter's include folder. sysconfig takes ~1 ms (it loads the
    build's config data), a fifth of a hit: on POSIX the folder is where its
    default scheme puts it, checked to exist; else ask sysconfig, once."""
    found = _python_paths.get("include")
    if found is None:
        guess = os.path.join(sys.base_prefix, "include",
                             f"python{sys.version_info[0]}.{sys.version_info[1]}{getattr(sys, 'abiflags', '')}")
        if os.name != "posix" or not os.path.isfile(os.path.join(guess, "Python.h")):
            import sysconfig

            guess = sysconfig.get_paths()["include"]
        found = _python_paths["include"] = guess
    return found


_python_paths: dict[str, str] = {}


def ext_suffix() -> str:
    """The file suffix of this interpreter's extension modules (EXT_SUFFIX),
    without loading sysconfig's data: the import system's first suffix."""
    import importlib.machinery

    return importlib.machinery.EXTENSION_SUFFIXES[0]


def _python_flags(abi3: str | None, facts: Facts) -> tuple[list[str], str, dict[str, str], list[str]]:
    """(compile flags, file suffix, key extras, declared requirements) for a module."""
    include = python_include()
    if abi3 is None:
        abi = facts.get("python.abi") or "unknown"
        suffix = ext_suffix()
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
    tree = trees.make(sources, ext, cflags, _COMPILED, name)
    pyflags, suffix, extra, declared = _python_flags(abi3, facts or default_cache().facts)
    filename = name + suffix
    include = [f for f in pyflags if f.startswith("-I")]
    defines = tuple(f for f in pyflags if not f.startswith("-I"))
    # The include path names this interpreter's install: the ABI stands for it in the key.
    job = _job(f"module {name}", tree, lang, ("-fPIC", "-O2", *defines, *include), ("-fPIC", "-O2", *defines),
               ("-shared",), tuple(ldflags), filename, covered=tuple(f[2:] for f in include))
    flags = ["-shared", "-fPIC", "-O2", *defines, *tree.key_flags, "|", *ldflags]
    inputs = Inputs.make(tree.key_sources(), flags=flags, tools=_tools(job),
                         extra={"lang": _key_lang(job), **extra, **dict(job.steer)})
    recipe = _recipe("cc.module", name, sources, lang=lang, abi3=abi3, cflags=list(cflags), ldflags=list(ldflags))
    return Plan("cc.module", name, inputs, None, tuple(declared), bases=tree.bases, job=job, recipe=recipe)
