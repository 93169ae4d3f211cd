"""Whether the files an entry was compiled from still hold the bytes recorded
in its manifest (its dependencies: project headers and the like).

A dependency names a base ("src", "inc0", ...) and a path inside it; the
caller says where each base is now, so the check does not depend on where the
project is checked out. A file is current if it hashes to the recorded
sha256. Hashing is avoided with witnesses, as in ninja and ccache's direct
mode: (inode, size, mtime, ctime) of a file when it last hashed to a known
digest, remembered in this process and in the entry's stamp (stamps.py) for
the next one. So a hit stats each dependency and hashes only those whose
witness changed; a witness younger than stamps.RACY_SECONDS is never trusted
(an edit in the same clock tick could leave it unchanged).
"""

from __future__ import annotations

import os
import stat
import time
from typing import Mapping, Sequence

from . import blobs, stamps
from .manifest import Dependency
from .watch import Watch

Witness = tuple[int, int, int, int]  # (inode, size, mtime_ns, ctime_ns)

#: absolute path -> (witness, sha256) of files hashed in this process
_known: dict[str, tuple[Witness, str]] = {}


def resolve(dep: Dependency, bases: Mapping[str, str]) -> str | None:
    """The file a dependency names here, or None if its base is not given."""
    if dep.base == "abs":
        return dep.path
    root = bases.get(dep.base)
    return None if root is None else os.path.join(root, dep.path)


def witness(st: os.stat_result) -> Witness:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _settled(w: Witness, seen_ns: int | None = None) -> bool:
    seen = time.time_ns() if seen_ns is None else seen_ns
    return stamps.settled(w[2], seen) and stamps.settled(w[3], seen)


def digest(path: str, w: Witness, remembered: Mapping[str, Sequence[int]], recorded: str,
           seen_ns: int | None = None) -> str:
    """The file's sha256, from a witness where one vouches for it."""
    known = _known.get(path)
    if known is not None and known[0] == w:
        return known[1]
    if remembered.get(path) == [*w]:  # the stamp (JSON lists): at this witness it held `recorded`
        return recorded
    sha, _ = blobs.hash_file(path)  # type: ignore[arg-type]
    if _settled(w, seen_ns):
        _known[path] = (w, sha)
    return sha


def first_changed(deps: Sequence[Dependency], bases: Mapping[str, str],
                  remembered: Mapping[str, Sequence[int]] = {}) -> tuple[Dependency | None, dict[str, Witness]]:
    """(the first dependency whose file changed or is gone, or None; the
    settled witnesses of the files found current, to remember)."""
    current: dict[str, Witness] = {}
    seen = time.time_ns()  # before any stat: witnesses are judged against it
    roots = {name: root.rstrip("/") + "/" for name, root in bases.items()}  # resolve(), without a join per file
    for dep in deps:
        root = roots.get(dep.base)
        path = root + dep.path if root is not None else resolve(dep, bases)
        if path is None:
            return dep, current
        try:
            st = os.stat(path)
        except OSError:
            return dep, current
        if not stat.S_ISREG(st.st_mode):
            return dep, current  # never read a device or a pipe in its place
        w = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if digest(path, w, remembered, dep.sha256, seen) != dep.sha256:
            return dep, current
        if _settled(w, seen):
            current[path] = w
    return None, current


class Current:
    """Whether an entry's dependencies still hold their bytes, asked again and
    again in one process (the in-process memos): the first call checks them
    and arms a Watch; later calls ask the Watch, and check again only when it
    saw something (a touch is not a change: still current)."""

    __slots__ = ("deps", "bases", "watch")

    def __init__(self, deps: Sequence[Dependency], bases: Mapping[str, str]) -> None:
        self.deps, self.bases = deps, bases
        self.watch: Watch | None = None

    def __call__(self) -> bool:
        if self.watch is not None and self.watch.unchanged():
            return True
        changed, _, self.watch = watched(self.deps, self.bases)
        return changed is None


def watched(deps: Sequence[Dependency], bases: Mapping[str, str],
            remembered: Mapping[str, Sequence[int]] = {}) -> tuple[Dependency | None, dict[str, Witness], Watch | None]:
    """first_changed, and when all are current a Watch that says cheaply
    whether they still are (armed before the check: nothing slips between)."""
    paths = [p for p in (resolve(d, bases) for d in deps) if p is not None]
    watch = Watch(paths)
    changed, current = first_changed(deps, bases, remembered)
    if changed is not None:
        return changed, current, None
    if len(current) == len(paths):  # every witness settled: the stat fallback is sound too
        watch.settle(list(current.items()))
    return None, current, watch


def forget() -> None:
    """Drop what this process remembers (tests)."""
    _known.clear()
