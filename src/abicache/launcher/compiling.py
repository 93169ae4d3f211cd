"""A launcher's miss: the compiler run as the build system asked, watched by the
observer, its outputs left where the build expects them and copied into the entry.

The entry of one compile holds every file it wrote (`output-0` the object, then the
files named after it, then the dependency file: Compile.outputs' order), what it printed
(`stdout`, `stderr`, where it printed anything: warnings are part of the result) and the record of everything its
tools read and looked for (engine/record.py), as an engine-built object's. A compile that
fails is not cached: its output and status are handed back as they were.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..core.artifact import BuildResult
from ..engine import depfile, observe, record, roots, units
from ..engine import scratch as scratches
from ..engine.tree import File, Tree
from ..store import deps as depcheck
from .entry import STDERR, STDOUT, Failed, Ran, output_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..core.cache import Cache
    from .command import Compile

__all__ = ["build"]


def build(cache: Cache, argv: list[str], compile: Compile, code: str, ran: Ran, out: Path) -> BuildResult:
    """Compile into place, watched; out: the entry's stage folder, which gets a copy of every output."""
    cwd = os.getcwd()
    source = roots.normal(compile.source, cwd)
    tree = Tree((File(compile.source, code, source),), {"cwd": cwd}, (), ())
    tools = cache.store.layout.tools
    observer = observe.library(tools, trusted=cache.store.trust.ok)
    with scratches.scratch() as scratch:  # swept by a later build where this process is killed
        for _ in range(2):  # once more where an input changed meanwhile, unless the front has its outputs
            rec, moved = _watched(argv, compile, tree, source, observer, scratch, tools, str(cache.root), ran, out)
            if not moved or ran.answered:
                break
        if moved:
            rec = record.Record([record.never("changed while compiling", f"{moved} changed while it was compiled")],
                                [], [], [])
    return BuildResult(deps=rec.deps, absent=rec.absent, env=rec.env, system=rec.system)


def _watched(argv: list[str], compile: Compile, tree: Tree, source: str, observer: Path | None, scratch: str,
             tools: Path, store: str, ran: Ran, out: Path) -> tuple[record.Record, str | None]:
    """One run of the compile, its outputs kept in out; (its record, a file read that changed
    while it ran, or None)."""
    cwd = tree.bases["cwd"]
    own = os.path.join(scratch, "deps.d") if compile.depfile is None and compile.family == "gcc" else None
    command = [*argv, "-MD", "-MF", own] if own else argv
    started = units.filesystem_now(scratch)
    with observe.watching(observer, scratch) as session:
        env = {**os.environ, **session.env} if session else None
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              pass_fds=session.fds if session else ())
    ran.stdout, ran.stderr = done.stdout, done.stderr
    if done.returncode != 0:
        raise Failed(argv, done.returncode, done.stdout, done.stderr)
    listed = own or (compile.depfile.path if compile.depfile else None)
    read = depfile.read(Path(listed)) if listed and os.path.exists(listed) else None
    _stage(compile, ran, out)  # before the front is answered: its build system may remove or rewrite them
    ran.answer()
    observed = session.result(argv, cwd) if session else None  # its trace is in scratch, the build's alone
    written = [roots.normal(path, cwd) for path in compile.outputs]  # looked for before they were made
    rec = record.of(observed, read, cwd, tree, (), (scratch, store, *written), tools)
    files = [depcheck.resolve(d, tree.bases) for d in rec.deps]
    moved = units.changed_since(started, [source, *(f for f in files if f)])
    if moved is None and _read_text(source) != tree.files[0].code:
        moved = source
    return rec, moved


def _read_text(path: str) -> str | None:
    from ..engine.tree import read_source
    from ..errors import AbicacheError

    try:
        return read_source(path)
    except AbicacheError:
        return None


def _stage(compile: Compile, ran: Ran, out: Path) -> None:
    """Copy what the compile wrote and printed into the entry's stage folder."""
    for index, path in enumerate(compile.outputs):
        shutil.copyfile(path, out / output_name(index))
    for name, data in ((STDOUT, ran.stdout), (STDERR, ran.stderr)):
        if data:  # none for nothing printed: an empty file would be one blob shared by every entry, whose
            (out / name).write_bytes(data)  # ctime each new entry moves (and with it every record's witness)
        else:
            (out / name).unlink(missing_ok=True)  # a first run's, compiled again
