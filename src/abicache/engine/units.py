"""Compile a source tree into one output: each translation unit where it
lives, with a dependency file, and link.

One unit: one compiler command writes the output directly (fastest for the
common inline case). Several units: each is compiled to an object that is a
cached entry of its own (kind "cc.object", keyed on the unit's bytes, its
compile flags and the compiler's identity, with its recorded dependencies),
in parallel on the pool, then linked. So editing one of N sources compiles
one unit and links; a header compiles only its includers; a unit shared by
two extensions is compiled once; and single flight and crash safety hold per
object as for any entry.

Every compile reports what it read (-MD -MF); files outside the covered roots
become the output's dependencies (tree.dependencies). A dependency (or a
source) that changes while the compiler runs makes that compile run again,
once: the recorded bytes must be the ones compiled.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from ..errors import AbicacheError, BuildError
from ..key import Inputs
from ..requirements import Requirements
from ..store import blobs
from ..store.manifest import Dependency
from . import depfile, pool, roots
from . import tree as trees
from .ahead import Ahead
from .job import Job
from .tree import File, prefix_maps

if TYPE_CHECKING:
    from ..cache import Cache

#: runs one compiler command in a folder; raises BuildError (cc.run_compiler)
Runner = Callable[[list[str], Path, str], None]


def build(job: Job, cache: Cache, out: Path, run: Runner) -> list[Dependency]:
    """Write job.output into out; returns the dependencies to record."""
    covered = _covered(job, cache.store.layout.tools)
    try:
        return _build(job, cache, out, run, covered)
    finally:
        covered()  # reaps the include-list probe, should the build end before any compile did


def _build(job: Job, cache: Cache, out: Path, run: Runner, covered: Callable[[], Sequence[str]]) -> list[Dependency]:
    with _scratch() as scratch:
        paths = job.tree.place(Path(scratch))
        units = job.tree.units
        if len(units) == 1 and not _is_cuda(units[0]) and job.embed is None:
            argv = [*job.compiler, *job.link, *job.cflags, *job.tree.flags, *_inline_include(job, scratch),
                    *prefix_maps(job.tree.bases, scratch)]
            deps = _compile(argv, units[0], paths[units[0].name], out / job.output, list(job.ldflags),
                            job, covered, scratch, run)
            _write_back(out / job.output)
            return deps
        limited = pool.compilers(run)
        objects: Ahead[list[Any]] = Ahead(len(units))

        def unit_object(item: tuple[int, File]) -> Any:
            index, unit = item
            return _object(job, cache, unit, paths[unit.name], covered, scratch, limited,
                           lambda path: objects.put(index, path), lambda: objects.missing() <= pool.max_jobs())

        objects.start(lambda: pool.run(unit_object, list(enumerate(units)), lambda item: item[1].name, job.what,
                                       2 * pool.max_jobs()))
        try:
            inputs = objects.files()
            if inputs is not None:  # else a unit failed: result() raises its error
                _link(job, inputs, scratch, out, run)
        finally:
            built = objects.result()
        return sorted({d for a in built for d in a.manifest.deps})


def _link(job: Job, inputs: list[str], scratch: str, out: Path, run: Runner) -> None:
    if job.embed is not None:
        inputs = [_embedded(job, inputs, Path(scratch), out, run)]
    argv = [*job.compiler, *job.link, *_link_flags(job.cflags), *inputs, "-o", str(out / job.output), *job.ldflags]
    run(argv, Path(os.getcwd()), job.what)
    _write_back(out / job.output)


def _write_back(path: Path) -> None:
    """Start writing the output to disk while it is audited: publishing fsyncs
    it before linking it into the blob store, and then finds it written (2 ms
    for a 1 MB library, between the link and the load otherwise)."""
    threading.Thread(target=_fsync_quietly, args=(path,), name="abicache-writeback", daemon=True).start()


def _fsync_quietly(path: Path) -> None:
    with suppress(OSError):  # publishing fsyncs it again, and reports what fails there
        blobs.fsync_file(path)


@contextmanager
def _scratch() -> Iterator[str]:
    """A private temporary folder, removed in the background once the build
    has succeeded (freeing its objects took 2 ms between the link and the
    load; the interpreter waits for that thread before it exits)."""
    folder = tempfile.mkdtemp(prefix="abicache-build-")
    try:
        yield folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    threading.Thread(target=shutil.rmtree, args=(folder,), kwargs={"ignore_errors": True},
                     name="abicache-scratch").start()


def _covered(job: Job, tools: Path) -> Callable[[], Sequence[str]]:
    """The covered roots, needed once the first compile ends: the compiler's
    search list (a compiler process in a fresh store, 10 ms) is started now,
    beside the first compiles, and read then. That probe preprocesses an
    empty input, so it runs outside MAX_JOBS."""
    dirs = roots.compiler_dirs_later(job.compiler, _driver_lang(job.lang), tools)
    return lambda: (*job.covered, *dirs())


def _prewarm_audit(facts: Any) -> None:
    """Import the audit, and probe the facts its findings are checked against
    (libstdc++'s version floors: 1 ms, once per store), while the compilers
    run: after the link they would add about 7 ms. Started once a compile
    has ended, so the import does not hold the GIL while the first compilers
    are being started."""
    if "abicache.audit" not in sys.modules:
        threading.Thread(target=_prewarm, args=(facts,), name="abicache-prewarm", daemon=True).start()


def _prewarm(facts: Any) -> None:
    try:
        importlib.import_module("abicache.audit")
        for name in ("platform.glibc", "platform.glibcxx", "platform.cxxabi"):
            facts.get(name)
    except Exception:
        pass  # the audit meets the same failure after the link, and says it in its own words


def _embedded(job: Job, objects: list[str], scratch: Path, out: Path, run: Runner) -> str:
    """One object: the units' objects merged, then each blob added by the
    embedding command. Each blob is also kept in the output folder, where the
    audit reads what it needs (a cubin's GPU target) as for any artifact."""
    assert job.embed is not None
    current = scratch / "merged.o"
    if len(objects) == 1:
        shutil.copyfile(objects[0], current)  # as tvm-ffi: `ld -r` of one object only rewrites it
    else:
        run(["ld", "-r", "-o", str(current), *objects], scratch, f"{job.what}: merging objects")
    for name, data in job.embed.blobs:
        blob = out / f"{name}.cubin"
        blob.write_bytes(data)
        following = scratch / f"merged_with_{name}.o"
        run([*job.embed.command, "--input-obj", str(current), "--output-obj", str(following), "--cubin", str(blob),
             "--name", name], scratch, f"{job.what}: embedding {name}")
        current = following
    return str(current)


def _object(job: Job, cache: Cache, unit: File, path: str, covered: Callable[[], Sequence[str]], scratch: str,
            run: Runner, ready: Callable[[str], None], last_round: Callable[[], bool]) -> Any:
    """The unit's object entry; ready(file) is called with its file, in the
    last round as soon as its bytes exist, before it is published (ahead.py)."""
    from ..cache import BuildResult

    others = {f.name: f.code for f in job.tree.inline() if not f.compiled}  # inline headers it may read
    if _is_cuda(unit):
        if job.cuda is None:
            raise BuildError(f"{job.what} has CUDA source {unit.name} but no nvcc settings")
        head, key_flags, tool, lang = job.cuda.nvcc, job.cuda.key_flags, "cuda.nvcc", "cuda"
        argv = [*head, "-c", *job.cuda.flags, *job.tree.flags, *_inline_include(job, scratch)]
    else:
        key_flags, tool, lang = job.key_cflags, job.tool, job.lang
        argv = [*job.compiler, "-c", *job.cflags, *job.tree.flags, *_inline_include(job, scratch),
                *prefix_maps(job.tree.bases, scratch)]
    inputs = Inputs.make({unit.name: unit.code, **others}, flags=["-c", *key_flags, *job.tree.key_flags],
                         tools=[tool], extra={"lang": lang})

    def compile_object(out: Path) -> BuildResult:
        target = out / (Path(unit.name).name + ".o")

        def compiled() -> None:
            if last_round():
                ready(_hand_over(target, Path(scratch)))

        deps = _compile(argv, unit, path, target, [], job, covered, scratch, run, compiled)
        _prewarm_audit(cache.facts)
        return BuildResult(deps=deps)

    found = objects_of(cache).get_or_build("cc.object", unit.name, inputs, compile_object, bases=job.tree.bases)
    ready(str(found.file()))  # a hit, or another process's build (a second call is ignored)
    return found


def _hand_over(target: Path, scratch: Path) -> str:
    """A name for the fresh object in the private scratch folder: the stage it
    was written to is renamed into the store while the linker reads it.
    (Publishing then copies the object, as it copies any file linked twice.)"""
    folder = scratch / "objects"
    folder.mkdir(exist_ok=True)
    name = folder / f"{time.monotonic_ns()}-{target.name}"
    try:
        os.link(target, name)
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(target, name)
    return str(name)


def _is_cuda(unit: File) -> bool:
    return unit.name.endswith(".cu")


def _inline_include(job: Job, scratch: str) -> list[str]:
    """Inline headers (a {name: code} source) are found by file sources too."""
    return [f"-I{scratch}"] if any(not f.compiled for f in job.tree.inline()) else []


def objects_of(cache: Cache) -> Cache:
    """The cache as objects use it: an object file needs no audit (the key
    holds the compiler's identity and target, and only a linker reads it)."""
    view = cache.__dict__.get("_objects_view")
    if view is None:
        view = cache._view(audit=lambda stage, paths, declared, facts: (Requirements(), {"kind": "object"}))
        cache.__dict__["_objects_view"] = view
    return view


def _compile(argv: list[str], unit: File, path: str, target: Path, tail: list[str], job: Job,
             covered: Callable[[], Sequence[str]], scratch: str, run: Runner,
             compiled: Callable[[], None] = lambda: None) -> list[Dependency]:
    """Compile, and return what to record of the files it read; compiled() is
    called once target holds the bytes to keep, before those files are hashed."""
    cwd = os.getcwd()
    for attempt in range(2):
        dfile = Path(scratch) / f"{os.getpid()}-{time.monotonic_ns()}.d"
        started = time.time_ns()
        run([*argv, path, "-o", str(target), *tail, "-MD", "-MF", str(dfile)], Path(cwd), job.what)
        read = depfile.read(dfile) if dfile.exists() else []
        record = trees.recorded(read, cwd, job.tree, covered(), scratch)
        # the files whose bytes the entry records (not the covered roots, which the key identifies)
        moved = _changed_since(started, [path if unit.path else "", *record], cwd)
        if not moved and _same(unit, path):
            compiled()
            return [trees.dependency(p, job.tree.bases) for p in record]
    raise BuildError(f"{moved or path} changed while {job.what} was compiling, twice; "
                     "build again once your edits are saved")


def _changed_since(started: int, files: Sequence[str], cwd: str) -> str | None:
    for item in files:
        if not item:
            continue
        try:
            st = os.stat(roots.normal(item, cwd))
        except OSError:
            continue  # a file the compiler read and someone removed: the next lookup misses
        if max(st.st_mtime_ns, st.st_ctime_ns) >= started:
            return item
    return None


def _same(unit: File, path: str) -> bool:
    """A file source still holds the bytes its key was computed from."""
    if unit.path is None:
        return True
    try:
        return trees.read_source(path) == unit.code
    except AbicacheError:
        return False


_TWO_WORDS = {"-I", "-D", "-U", "-isystem", "-iquote", "-idirafter", "-include", "-Xcompiler"}
_PREPROCESSOR = ("-I", "-D", "-U", "-isystem", "-iquote", "-idirafter", "-include", "-std=", "-W")


def _link_flags(cflags: Sequence[str]) -> list[str]:
    """Compile flags that matter at link time too (-fopenmp, -pthread, -m*, -O*, -g)
    without those only the preprocessor reads (and their separate arguments)."""
    out, skip = [], False
    for flag in cflags:
        if skip:
            skip = False
        elif flag in _TWO_WORDS:
            skip = True
        elif not flag.startswith(_PREPROCESSOR):
            out.append(flag)
    return out


def _driver_lang(lang: str) -> str:
    return "c" if lang == "c" else "c++"
