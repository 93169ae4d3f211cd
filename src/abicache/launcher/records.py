"""The launcher's hit records: what lets the native front (front.c) serve the next run of
the same compile by stat alone, never starting Python.

After a lookup found or made a compile's entry, its record is written under
`<root>/v3/hits/<name>` as hits/record.py's are, the name holding everything its witnesses
do not cover (name()): the store as written, the working directory, the user and groups,
the machine, abicache's version, the whole environment (but VOLATILE: what a shell and
make set anew for every run) and every word of the command.
Its witnesses are hits/writer.py's (the store's folders and the entry's files, the config
files, the compiler PATH finds and its identity's memo, abicache's own modules, what the
build read and looked for), and the source's stat. front.c computes the same name, checks
every witness, writes each output where the compiler writes it (a copy, renamed into
place) and prints what the compile printed; anything else runs this launcher in Python.

    abicache-launch 2 <witnesses> <outputs> <length of the text>\\n
    <4 x 64-bit integers a witness>
    <text: NUL-separated: deadline, the store's real root, the entry's folder, the names in
     it ('/'-separated), the seconds between last-use touches, the build seconds a hit
     saves, one letter a witness, each output's path as the compiler writes it, each
     witness's path, then each witness's sha256 where the front may hash the file when its
     stat moved (the source and the project's own files: a configure step writes them again
     into a clean build folder, the same bytes), else nothing>

A record is written once its witnesses are older than a clock tick (store/stamps.py): a
compile that just published its entry leaves that to a child, which waits out the tick
after the launcher has exited (the build goes on meanwhile), detached from its output.
"""

from __future__ import annotations

import os
import sys

from .. import __version__
from ..values.digest import sha256_hex

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Sequence

    from ..core.artifact import Artifact
    from ..core.cache import Cache
    from .command import Compile

FORMAT = b"abicache-launch 2"
#: variables the name leaves out: set anew for every run by the shell (`_`, the program it
#: runs) and by make (its flags, which name the job server's fifo by make's pid, and its
#: depth and terminals); no compiler reads them (engine/steer.py HARMLESS), and a record is
#: not written for an entry whose build was seen reading one. front.c leaves out the same.
VOLATILE = ("_", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKE_TERMOUT", "MAKE_TERMERR")
_VOLATILE = frozenset(os.fsencode(v) for v in VOLATILE)
_RAW = getattr(os.environ, "_data", None) if os.name == "posix" else None


def name(root: str, argv: Sequence[str]) -> str | None:
    """The record's name for this command and store here, as front.c computes it."""
    if _RAW is None:
        return None
    try:
        here = os.getcwd()
    except OSError:
        return None
    groups = " ".join(str(g) for g in sorted(set(os.getgroups())))
    who = f"{os.getuid()} {os.geteuid()} {os.getgid()} {os.getegid()} {groups}"
    uname = " ".join(os.uname())
    env = b"\0".join(sorted(k + b"=" + v for k, v in _RAW.items() if k not in _VOLATILE))
    words = b"\0".join(os.fsencode(w) for w in argv)
    return sha256_hex(b"\0\0".join((FORMAT, __version__.encode(), os.fsencode(root), os.fsencode(here),
                                    who.encode(), os.fsencode(uname), env, words)))


def encode(deadline: float, root: str, entry: str, names: Sequence[str], touch: float, seconds: float,
           outputs: Sequence[str], witnesses: Sequence[tuple[str, str, tuple[int, int, int, int]]],
           shas: Mapping[str, str] = {}) -> bytes:
    """shas: the sha256 of files the front may hash where their stat moved (the source, the
    project's headers: a configure step writes them again, the same bytes, into a clean build
    folder); "" for the rest."""
    from struct import Struct

    number = Struct("<4q")
    text = b"\0".join([b"%.6f" % deadline, os.fsencode(root), os.fsencode(entry),
                       os.fsencode("/".join(sorted(names))), b"%.6f" % touch, b"%.6f" % seconds,
                       "".join(k for k, _, _ in witnesses).encode(), *(os.fsencode(p) for p in outputs),
                       *(os.fsencode(p) for _, p, _ in witnesses),
                       *(shas.get(p, "").encode() if k == "s" else b"" for k, p, _ in witnesses)])
    numbers = b"".join(number.pack(*w) for _, _, w in witnesses)
    return b"%s %d %d %d\n" % (FORMAT, len(witnesses), len(outputs), len(text)) + numbers + text


def before(cache: Cache, compiler: str, what: str) -> list | None:
    """The config files and the compiler as the lookup is about to read them (hits/writer.py)."""
    from ..hits import writer

    return writer.looked_at(cache, [(compiler, what)])


Witness = tuple[int, int, int, int]


def note(cache: Cache, root: str, argv: Sequence[str], asked: Compile, art: Artifact, what: str,
         seen: list | None, built: bool, source: Witness, source_sha: str) -> None:
    """Write the record of this compile: now, or (a compile just published, its witnesses too
    young) from a detached child once they have settled. source: the source file's witness
    when the key read its bytes (a record binds the entry to that, never to a later stat)."""
    record_name = name(root, argv)
    if record_name is None or seen is None or _refused(cache, art):
        return
    why = "unsettled" if built else _write(cache, record_name, root, argv, asked, art, what, seen, source,
                                           source_sha)
    if why == "unsettled" and hasattr(os, "fork"):  # a build, or a lookup that stamped the entry again
        _later(cache, record_name, root, argv, asked, art, what, seen, source, source_sha)


def _refused(cache: Cache, art: Artifact) -> bool:
    from ..hits import writer
    from ..settings import checked
    from ..store.manifest import uncached_reason

    facts = {r.name for r in art.requirements}
    return (not cache.as_opened() or art.origin not in ("local", "built") or bool(checked.unknown_variables())
            or not facts <= writer.COVERED_FACTS or uncached_reason(art.manifest.deps) is not None
            or any(variable in VOLATILE for variable, _ in art.manifest.env))  # the variables the name leaves out


def _write(cache: Cache, record_name: str, root: str, argv: Sequence[str], asked: Compile, art: Artifact,
           what: str, seen: list, source: Witness, source_sha: str) -> str | None:
    from .. import hits
    from ..hits import writer

    real = os.path.realpath(root)
    if name(root, argv) != record_name or real != os.fspath(cache.store.root):
        return "another environment or store"
    try:
        st = os.stat(asked.source)
    except OSError as exc:
        return f"source: {exc}"
    if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != source:
        return "the source changed since its bytes were read"  # the next lookup keys the new bytes
    witnessed = [("s", os.path.abspath(asked.source), source)]
    shas = _project_shas(art, os.getcwd())
    shas[os.path.abspath(asked.source)] = source_sha
    taken = writer.witnessed(cache, art, [(argv[0], what)], {"cwd": os.getcwd()}, seen, witnessed, _verification)
    if isinstance(taken, str):
        return taken
    names, deadline, taken_witnesses, _ = taken
    witnesses = [("s" if k in "fnk" else k, p, w) for k, p, w in taken_witnesses]  # the front stats each through links
    if any("\n" in p for _, p, _ in witnesses) or any(os.fsencode(p).count(b"\0") for p in asked.outputs):
        return "a path the record cannot hold"
    data = encode(deadline, real, os.fspath(art.path), names, cache.touch_interval,
                  art.manifest.build_seconds or 0.0, asked.outputs, witnesses, shas)
    writer.put(cache.store, hits.folder(real), record_name, data)
    return None


def _project_shas(art: Artifact, cwd: str) -> dict[str, str]:
    """The sha256 of each file the build read under the working directory (the project's own,
    not a system's), by the path its witness names."""
    from ..store import deps as depcheck
    from ..store.manifest import LISTING

    out = {}
    for dep in art.manifest.deps:
        if dep.base == "cwd" and not dep.sha256.startswith(LISTING):
            path = depcheck.resolve(dep, {"cwd": cwd})
            if path is not None:
                out[path] = dep.sha256
    return out


def _verification(name: str) -> bool:
    """An entry's stamps (store/stamps.py): what a lookup found current, rewritten by a lookup
    whenever a witness moved (an output written beside a path the build looked for moves its
    folder). Neither listed nor witnessed: every file of the entry is, by its own stat."""
    from ..store import stamps

    return name in (stamps.FILENAME, stamps.DEPS_FILENAME) or name.startswith(stamps.NAME_PREFIX)


#: how many clock ticks a child waits, at most, for a compile's witnesses to settle
_TRIES = 10


def _later(cache: Cache, record_name: str, root: str, argv: Sequence[str], asked: Compile, art: Artifact,
           what: str, seen: list, source: Witness, source_sha: str) -> None:
    """A child that waits out a clock tick, checks the entry as the next lookup would (which
    stamps it), and writes the record, trying again while a witness is too young (the build
    system removed a depfile, wrote an object beside a path the compile looked for); the
    launcher's own process exits meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() != 0:
        return
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)  # the build system waits for the end of the output it reads: not ours
        import time

        from ..store import stamps

        store = cache.store
        bases = {"cwd": os.getcwd()}
        for _ in range(_TRIES):  # a build system writes beside a path the build looked for: later, again
            time.sleep(stamps.FINE_SECONDS * 2)
            if store.check(art.path, art.manifest, max_age=cache.verify_age) is not None or (
                    art.manifest.recorded and store.deps_changed(art.path, art.manifest, bases) is not None):
                break
            if _write(cache, record_name, root, argv, asked, art, what, seen, source, source_sha) != "unsettled":
                break
    except BaseException:  # noqa: BLE001  a record only saves time
        pass
    finally:
        os._exit(0)
