"""What a compile's entry records of the files it read, the paths it looked
for and did not find, and the variables it read — from the observer's
records (observe.py) and the compiler's dependency file together.

- Files read: every regular file opened for reading, whichever tool opened it
  (headers, system ones included; specs and response files; `.incbin` data;
  archives, libraries and linker scripts on the link line), and the programs
  that ran (an `as` or `ld` upgraded apart from the compiler), each by its
  bytes. Not recorded: the entry's own sources (in the key), the scratch
  folder and the store, /proc /sys /dev, and the covered roots (folders whose
  identity the key holds: the torch install, the CUDA toolkit, Python's
  headers; and the compiler's own folders with ABICACHE_SLOPPINESS=system_headers).
- Paths looked for and not found, outside the same places: grouped under the
  nearest folder that existed (manifest.Absent).
- Variables read, but those known to change nothing (steer.HARMLESS).
- Folders listed (opendir, scandir, glob), outside the same places, other
  than those the build wrote in (its own work), by the names in them
  (deps.listing_digest): a tool that picks among versions by listing a folder
  picks another when an entry appears there.

Without the observer the dependency file alone gives the files read (the
preprocessor's); with neither, nothing is known of what the compiler read,
and the entry is recorded so that no later lookup takes it (NOT_CACHED). So
is one whose trace is incomplete: a process of the build ran where the
observer could not follow (observe.Observed.unobserved), and its reads are unknown.
"""

from __future__ import annotations

import os
import stat
import uuid
from typing import TYPE_CHECKING, Iterable, Mapping, NamedTuple, Sequence

from ..store.deps import env_digest, is_system, listing_digest
from ..store import manifest
from ..store.manifest import Absent, Dependency, System, system_digest
from . import roots, steer
from . import tree as trees

if TYPE_CHECKING:
    from pathlib import Path

    from .observe import Observed

#: never inputs: the kernel's views, not files
_PSEUDO = ("/proc", "/sys", "/dev")
#: a dependency on this base never holds: the entry is published, loaded, and never found again
NOT_CACHED = manifest.UNCACHED


class Record(NamedTuple):
    deps: list[Dependency]
    absent: list[Absent]
    env: list[tuple[str, str]]
    system: list[System] = []  # files read in system folders (store/deps.SYSTEM), a group a folder


def of(observed: Observed | None, depfile: Sequence[str] | None, cwd: str, tree: trees.Tree,
       covered: Sequence[str], skip: Sequence[str], memo_dir: Path | None) -> Record:
    """The record of one compile. skip: folders that hold nothing the next
    build would read again (the scratch folder, the store)."""
    own = {f.path for f in tree.files if f.path}
    outside = roots.Within([*covered, *skip, *_PSEUDO])
    if observed is not None and not observed.complete:
        return Record([never("unobserved program", _unobserved(observed))], [], [], [])
    seen = observed is not None
    if not seen and depfile is None:
        return Record([never("no dependency file", f"{tree.files[0].name}: the compiler wrote no dependency file "
                              "and could not be watched, so what it read is unknown")], [], [], [])
    read = [roots.normal(p, cwd) for p in depfile or ()]
    lost = next((p for p in read if not os.path.lexists(p)), None)
    if seen:
        # The depfile still counts (a statically linked tool's reads escape the observer), but a
        # name in it that does not exist is a path with a line break, split: the observer has it whole.
        assert observed is not None
        kept = read if lost is None else [p for p in read if os.path.lexists(p)]
        read = kept + [p for p in observed.read if _regular(p)]
    elif lost is not None:
        return Record([never("unrecordable path", f"the compiler's dependency file names {lost!r}, which does not "
                              "exist (a path with a line break, which a dependency file cannot spell)")], [], [], [])
    files = sorted({p for p in read if p not in own and not outside(p)})
    programs = sorted(p for p in observed.programs if not outside(p)) if seen and observed else []
    missing = sorted(p for p in observed.missing if not outside(p) and p not in observed.read) if seen and observed \
        else []
    broken = next((p for p in [*files, *programs] if "\n" in p), None)  # names a system group joins by lines
    if broken is not None:
        return Record([never("unrecordable path",
                              f"a tool read {broken!r}, a path with a line break, which abicache cannot record")],
                      [], [], [])
    deps, system = _split(files, programs, tree.bases, memo_dir)
    if not seen:
        return Record(deps, [], [], system)
    assert observed is not None
    absent, odd = _grouped(missing, tree.bases)
    deps += _listings(observed.listed, observed.written, cwd, outside, tree.bases)
    env = [(name, env_digest(name)) for name in steer.recorded_env(observed.env)]
    if odd:
        deps.append(never("unrecordable path",
                           f"a tool looked for {odd!r}, a path with a line break, which abicache cannot record"))
    return Record(deps, absent, env, system)


def _split(files: list[str], programs: list[str], bases: Mapping[str, str],
           memo_dir: Path | None) -> tuple[list[Dependency], list[System]]:
    """Dependencies one by one, and the files of system folders (outside every
    base) as one group a folder, each file hashed as the others (a program, tens
    of MB, once per version of it)."""
    deps: list[Dependency] = []
    groups: dict[str, list[tuple[str, str]]] = {}
    for path in [*files, *programs]:
        base, rel = trees.locate(path, bases)
        if base != "abs" or not is_system(path):
            deps.append(_program(path, bases, memo_dir) if path in programs else trees.dependency(path, bases))
            continue
        folder, _, name = path.rpartition("/")
        sha = _memoized_sha(path, memo_dir)  # a system file: remembered by its stat, as a program is
        groups.setdefault(folder, []).append((name, sha))
    system = []
    for folder, entries in sorted(groups.items()):
        entries.sort()
        names = [n for n, _ in entries]
        system.append(System(folder, "\n".join(names), system_digest(names, [sha for _, sha in entries])))
    return deps, system


def _listings(listed: Iterable[str], written: Iterable[str], cwd: str, outside: roots.Within,
              bases: Mapping[str, str]) -> list[Dependency]:
    """The folders listed, each by its names now, but those the build wrote in (a folder
    gone since was a tool's own too)."""
    changed = {roots.normal(p, cwd) for p in written}
    own = changed | {os.path.dirname(p) for p in changed}
    out = []
    for folder in sorted({roots.normal(p, cwd) for p in listed}):
        if outside(folder) or folder in own:
            continue
        if "\n" in folder:
            out.append(never("unrecordable path",
                              f"a tool listed {folder!r}, a path with a line break, which abicache cannot record"))
            continue
        try:
            digest = listing_digest(folder)
        except OSError:
            continue
        base, rel = trees.locate(folder, bases)
        out.append(Dependency(base, rel or ".", digest))
    return out


def _unobserved(observed: Observed) -> str:
    """Why a build whose trace is incomplete is not cached: the programs that ran unobserved."""
    names = ", ".join(sorted(observed.unobserved))
    return (f"{names} ran unobserved (statically linked, setuid, or with LD_PRELOAD cleared), so what it read "
            "is unknown; ABICACHE_OBSERVE=0 caches by the compiler's dependency files alone")


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False  # read, then removed (a temporary file of the tool's)


def _program(path: str, bases: Mapping[str, str], memo_dir: Path | None) -> Dependency:
    base, rel = trees.locate(path, bases)
    return Dependency(base, rel, _memoized_sha(path, memo_dir))


def _memoized_sha(path: str, memo_dir: Path | None) -> str:
    """A program that ran or a system file, by its bytes: hashed once per version of it (a
    compiler proper is tens of MB; a system's headers are hashed by every compile that reads
    them), remembered by its stat under the store's tools/."""
    from pathlib import Path as P

    from ..env import toolid
    from ..store import blobs

    from ..store import deps

    before = os.stat(path)
    sha = toolid.memoized(P(path), "sha256", lambda p: blobs.hash_file(p)[0], memo_dir)
    if sha is None:
        return trees.dependency(path, {}).sha256
    if deps.witness(os.stat(path)) == deps.witness(before):  # the check after the build need not hash it again
        deps.learn(path, deps.witness(before), sha)
    return sha


def _grouped(missing: Iterable[str], bases: Mapping[str, str]) -> tuple[list[Absent], str]:
    """Missing paths under the nearest folder that exists; and the first path that cannot be recorded."""
    groups: dict[str, list[str]] = {}
    existing: dict[str, bool] = {}
    for path in missing:
        if "\n" in path:
            return [], path
        folder = os.path.dirname(path)
        while folder not in ("/", "") and not _is_dir(folder, existing):
            folder = os.path.dirname(folder)
        groups.setdefault(folder or "/", []).append(path[len(folder.rstrip("/")) + 1:])
    out = []
    for folder, names in sorted(groups.items()):
        base, rel = trees.locate(folder, bases) if folder != "/" else ("abs", "/")
        out.append(Absent(base, rel, "\n".join(sorted(names))))
    return out, ""


def _is_dir(folder: str, known: dict[str, bool]) -> bool:
    found = known.get(folder)
    if found is None:
        found = known[folder] = os.path.isdir(folder)
    return found


def never(reason: str, why: str) -> Dependency:
    """A dependency that holds nowhere, so the entry is never a hit; unique, so
    each such build is its own variant (never another build's files). reason: a
    short name, what `abicache stats` counts uncacheable builds by."""
    return Dependency(NOT_CACHED, f"[{reason}] {why} [{uuid.uuid4().hex}]", "0" * 64)


def not_cached(deps: Sequence[Dependency]) -> str:
    """Why an entry with these dependencies is not cached ("" if it is)."""
    found = manifest.uncached_reason(deps)
    return found[1] if found else ""
