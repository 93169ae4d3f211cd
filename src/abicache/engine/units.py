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

Every compile and link runs watched (observe.py) and writes a depfile
(-MD -MF); record.py turns what they read, looked for and were steered by
into the entry's record. The files read are hashed first and checked after:
one (or a source) written since the compile started makes that compile run
again, once: the recorded bytes must be the ones compiled.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple, Sequence

from ..errors import AbicacheError, BuildError
from ..core.key import Inputs
from ..store import blobs, deps as depcheck, lock
from . import depfile, interrupt, observe, pool, record, roots
from . import scratch as scratches
from . import tree as trees
from .ahead import Ahead
from .job import Job
from .tree import File, prefix_maps

if TYPE_CHECKING:
    from ..core.cache import BuildResult, Cache

#: runs one compiler command in a folder, with variables added to its
#: environment and descriptors it inherits; raises BuildError (cc.run_compiler)
Runner = Callable[..., None]


class _Context(NamedTuple):
    """What every command of one build shares."""

    covered: Callable[[], Sequence[str]]  # the covered roots, once the first compile has ended
    scratch: str
    skip: tuple[str, ...]  # folders whose files are not inputs: the scratch folder, the store
    observer: Path | None  # observe.c, built (None: depfiles only)
    tools: Path  # the store's tools/ (memos)
    pins: list[int]  # object entries handed to the linker, held until the link ends (store/lock.pin)


def build(job: Job, cache: Cache, out: Path, run: Runner) -> BuildResult:
    """Write job.output into out; returns what to record of the files read."""
    interrupt.resume()  # an interrupted build before this one (a notebook, a REPL) has unwound
    covered = _covered(job, cache.store.layout.tools)
    try:
        with interrupt.sigterm_stops_compilers():
            return _build(job, cache, out, run, covered)
    except KeyboardInterrupt:
        interrupt.stop()
        sys.stderr.write(f"abicache: interrupted; the compilers of {job.what} were stopped\n")
        raise
    finally:
        covered()  # reaps the include-list probe, should the build end before any compile did


def _build(job: Job, cache: Cache, out: Path, run: Runner, covered: Callable[[], Sequence[str]]) -> BuildResult:
    tools = cache.store.layout.tools
    with _scratch() as scratch, _pins() as pins:
        ctx = _Context(covered, scratch, (scratch, str(cache.root)),
                       observe.library(tools, trusted=cache.store.trust.ok), tools, pins)
        paths = job.tree.place(Path(scratch))
        units = job.tree.units
        if len(units) == 1 and not _is_cuda(units[0]) and job.embed is None:
            unit = units[0]
            argv = [*_compiler(job, unit), *job.link, *job.cflags, *job.tree.flags, *_inline_include(job, scratch),
                    *prefix_maps(job.tree.bases, scratch)]
            rec = _compile(argv, unit, paths[unit.name], out / job.output, list(job.ldflags), job, ctx, run)
            _write_back(out / job.output)
            return _result([rec])
        limited = pool.compilers(run)
        objects: Ahead[list[Any]] = Ahead(len(units))

        def unit_object(item: tuple[int, File]) -> Any:
            index, unit = item
            return _object(job, cache, unit, paths[unit.name], ctx, limited,
                           lambda path: objects.put(index, path), lambda: objects.missing() <= pool.max_jobs())

        objects.start(lambda: pool.run(unit_object, list(enumerate(units)), lambda item: item[1].name, job.what,
                                       2 * pool.max_jobs()))
        linked = None
        try:
            inputs = objects.files()
            if inputs is not None:  # else a unit failed: result() raises its error
                linked = _link(job, inputs, ctx, out, run)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, SIGTERM: every compiler stopped now, not after the queue
            interrupt.stop()
            objects.abandon(interrupt.GRACE * 4)  # their errors are the interrupt's own
            raise
        except BaseException:
            objects.result()  # a unit's error, if one failed, is the build's (as a link's would be)
            raise
        built = objects.result()
        recs = [record.Record(list(a.manifest.deps), list(a.manifest.absent), list(a.manifest.env),
                              list(a.manifest.system)) for a in built]
        return _result([*recs, *([linked] if linked else [])])


def _result(recs: Sequence[record.Record]) -> BuildResult:
    """One output's record: the union of its commands' (a unit's object is not
    cached where what its compiler read is unknown, and then neither is the output)."""
    from ..core.cache import BuildResult

    deps = sorted({d for r in recs for d in r.deps})
    why = record.not_cached(deps)
    if why:
        _warn_not_cached(why)
    # one system folder's group from each unit: identical ones are one; others are all kept
    return BuildResult(deps=deps, absent=_merged_absent(recs), env=sorted({e for r in recs for e in r.env}),
                       system=sorted({g for r in recs for g in r.system}))


def _merged_absent(recs: Sequence[record.Record]) -> list[Any]:
    from ..store.manifest import Absent

    names: dict[tuple[str, str], set[str]] = {}
    for r in recs:
        for a in r.absent:
            names.setdefault((a.base, a.folder), set()).update(a.paths())
    return [Absent(base, folder, "\n".join(sorted(n))) for (base, folder), n in sorted(names.items())]


_warned: set[str] = set()


def _warn_not_cached(why: str) -> None:
    import warnings

    from ..errors import AbicacheWarning

    if why not in _warned:
        _warned.add(why)
        warnings.warn(f"abicache: built and loaded, but not cached (each use builds again): {why}",
                      AbicacheWarning, stacklevel=6)


def _link(job: Job, inputs: list[str], ctx: _Context, out: Path, run: Runner) -> record.Record:
    """Link, watched: the libraries, archives and scripts the linker read, and
    the ones it looked for, are inputs too."""
    if job.embed is not None:
        inputs = [_embedded(job, inputs, Path(ctx.scratch), out, run)]
    argv = link_command(job, inputs, str(out / job.output))
    with observe.watching(ctx.observer, ctx.scratch) as session:
        run(argv, Path(os.getcwd()), job.what, **_watched(session))
        observed = session.result(argv, os.getcwd()) if session else None
    _write_back(out / job.output)
    # a link writes no depfile: unwatched, it records nothing, as before (its inputs are flags in the key)
    return record.of(observed, [], os.getcwd(), job.tree, ctx.covered(), ctx.skip, ctx.tools)


def _watched(session: observe.Session | None) -> dict[str, Any]:
    return {} if session is None else {"env": session.env, "fds": session.fds}


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
    """The build's private scratch folder (scratch.py: removed when it ends, swept where its
    process died first); a failed build's output names its inline code without it."""
    with scratches.scratch() as folder:
        try:
            yield folder
        except BuildError as exc:  # inline code by the name the user knows it by: the folder is gone
            exc.output = exc.output.replace(folder + os.sep, "")
            raise


def _covered(job: Job, tools: Path) -> Callable[[], Sequence[str]]:
    """The covered roots, needed once the first compile ends: the frontend's,
    and with ABICACHE_SLOPPINESS=system_headers the compiler's own search
    list (a compiler process in a fresh store, 10 ms), started now, beside
    the first compiles, and read then. That probe preprocesses an empty
    input, so it runs outside MAX_JOBS."""
    if not roots.sloppy_system_headers():
        return lambda: job.covered
    dirs = roots.compiler_dirs_later(job.compiler, _driver_lang(job.lang), tools, (*job.cflags, *job.tree.flags))
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


def _object(job: Job, cache: Cache, unit: File, path: str, ctx: _Context, run: Runner,
            ready: Callable[[str], None], last_round: Callable[[], bool]) -> Any:
    """The unit's object entry; ready(file) is called with its file, in the
    last round as soon as its bytes exist, before it is published (ahead.py)."""
    from ..core.cache import BuildResult

    others = {f.name: f.code for f in job.tree.inline() if not f.compiled}  # inline headers it may read
    argv, key_flags, tool, lang = unit_command(job, unit, ctx.scratch)
    inputs = Inputs.make({unit.name: unit.code, **others}, flags=["-c", *key_flags],
                         tools=[tool], extra={"lang": lang, **dict(job.steer)})

    def compile_object(out: Path) -> BuildResult:
        target = out / (Path(unit.name).name + ".o")

        def compiled() -> None:
            if last_round():
                ready(_hand_over(target, Path(ctx.scratch)))

        rec = _compile(argv, unit, path, target, [], job, ctx, run, compiled)
        _prewarm_audit(cache.facts)
        return BuildResult(deps=rec.deps, absent=rec.absent, env=rec.env, system=rec.system)

    entries = objects_of(cache)
    for _ in range(3):
        found = entries.get_or_build("cc.object", unit.name, inputs, compile_object, bases=job.tree.bases)
        fd = lock.pin(entries.store.layout.lock_file(found.key), entries.store.trust.file_mode)
        if fd is None:  # locks do not work here: the linker gets a link of its own to the bytes
            ready(_hand_over(found.file(), Path(ctx.scratch)))
            return found
        ctx.pins.append(fd)
        if os.path.exists(found.file()):  # else gc took it between the lookup and the pin: again
            ready(str(found.file()))  # a hit, or another process's build (a second call is ignored)
            return found
    raise BuildError(f"{job.what}: the object of {unit.name} keeps disappearing from the store (gc?)")


@contextmanager
def _pins() -> Iterator[list[int]]:
    """The build's pins (store/lock.pin), let go when it ends, its link done or failed."""
    held: list[int] = []
    try:
        yield held
    finally:
        for fd in held:
            os.close(fd)


def unit_command(job: Job, unit: File, scratch: str) -> tuple[list[str], tuple[str, ...], str, str]:
    """(the command that compiles a unit to an object, before its source, -o and
    depfile; its flags as the object's key holds them; the fact naming its
    compiler; its language)."""
    if _is_cuda(unit):
        if job.cuda is None:
            raise BuildError(f"{job.what} has CUDA source {unit.name} but no nvcc settings")
        tree_flags, tree_keys = (job.tree.flags, job.tree.key_flags) if job.cuda.tree_flags else ((), ())
        argv = [*job.cuda.nvcc, "-c", *job.cuda.flags, *tree_flags, *_inline_include(job, scratch)]
        return argv, (*job.cuda.key_flags, *tree_keys), "cuda.nvcc", "cuda"
    tool, lang = _tool(job, unit)
    argv = [*_compiler(job, unit), "-c", *job.cflags, *job.tree.flags, *_inline_include(job, scratch),
            *prefix_maps(job.tree.bases, scratch)]
    return argv, (*job.key_cflags, *job.tree.key_flags), tool, lang


def link_command(job: Job, inputs: Sequence[str], output: str) -> list[str]:
    return [*job.compiler, *job.link, *_link_flags(job.cflags), *inputs, "-o", output, *job.ldflags]


def command_lines(job: Job, scratch: str, output: str) -> list[list[str]]:
    """The commands a build of job runs when it compiles every unit to an object
    and links them (as torch's ninja file does), without running them."""
    paths = {f.name: f.path or os.path.join(scratch, f.name) for f in job.tree.units}
    objects = [os.path.join(scratch, Path(u.name).name + ".o") for u in job.tree.units]
    compiles = [[*unit_command(job, u, scratch)[0], paths[u.name], "-o", o] for u, o in zip(job.tree.units, objects)]
    return [*compiles, link_command(job, objects, output)]


def _compiler(job: Job, unit: File) -> tuple[str, ...]:
    return job.c_compiler if job.unit_lang(unit.name) != job.lang else job.compiler


def _tool(job: Job, unit: File) -> tuple[str, str]:
    """(the fact naming the unit's compiler, its language)."""
    return ("compiler.cc", "c") if job.unit_lang(unit.name) != job.lang else (job.tool, job.lang)


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
    return cache.unaudited("object")


def _compile(argv: list[str], unit: File, path: str, target: Path, tail: list[str], job: Job, ctx: _Context,
             run: Runner, compiled: Callable[[], None] = lambda: None) -> record.Record:
    """Compile, watched, and return what to record of what it read; compiled()
    is called once target holds the bytes to keep and the files read are
    hashed. Those files are hashed first and checked after: a file written
    since the compile started (by the filesystem's own clock) may not hold
    the bytes compiled, and the unit compiles again."""
    cwd = os.getcwd()
    for attempt in range(2):
        dfile = Path(ctx.scratch) / f"{os.getpid()}-{time.monotonic_ns()}.d"
        started = filesystem_now(ctx.scratch)
        with observe.watching(ctx.observer, ctx.scratch) as session:
            run([*argv, path, "-o", str(target), *tail, "-MD", "-MF", str(dfile)], Path(cwd), job.what,
                **_watched(session))
            observed = session.result(argv, cwd) if session else None
        read = depfile.read(dfile) if dfile.exists() else None
        rec = record.of(observed, read, cwd, job.tree, ctx.covered(), ctx.skip, ctx.tools)
        files = [depcheck.resolve(d, job.tree.bases) for d in rec.deps]
        moved = changed_since(started, [path if unit.path else "", *(f for f in files if f)])
        if not moved and _same(unit, path):
            compiled()
            return rec
    raise BuildError(f"{moved or path} changed while {job.what} was compiling, twice; "
                     "build again once your edits are saved")


def filesystem_now(scratch: str) -> int:
    """Now, as the filesystems stamp files (a coarse clock, up to a tick behind
    time.time_ns()): a file written later has this stamp or a later one."""
    marker = os.path.join(scratch, f"clock-{os.getpid()}-{threading.get_ident()}")
    with open(marker, "wb"):
        pass
    return os.stat(marker).st_mtime_ns


def changed_since(started: int, files: Sequence[str]) -> str | None:
    for item in files:
        if not item:
            continue
        try:
            st = os.stat(item)
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
