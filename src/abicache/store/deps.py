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
import time
from typing import Mapping, Sequence

from . import blobs, stamps
from .manifest import Dependency

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


def _settled(w: Witness) -> bool:
    return max(w[2], w[3]) < time.time_ns() - int(stamps.RACY_SECONDS * 1e9)


def digest(path: str, w: Witness, remembered: Mapping[str, Sequence[int]], recorded: str) -> str:
    """The file's sha256, from a witness where one vouches for it."""
    known = _known.get(path)
    if known is not None and known[0] == w:
        return known[1]
    if tuple(remembered.get(path, ())) == w:  # the stamp: at this witness it held `recorded`
        return recorded
    sha, _ = blobs.hash_file(path)  # type: ignore[arg-type]
    if _settled(w):
        _known[path] = (w, sha)
    return sha


def first_changed(deps: Sequence[Dependency], bases: Mapping[str, str],
                  remembered: Mapping[str, Sequence[int]] = {}) -> tuple[Dependency | None, dict[str, Witness]]:
    """(the first dependency whose file changed or is gone, or None; the
    settled witnesses of the files found current, to remember)."""
    current: dict[str, Witness] = {}
    for dep in deps:
        path = resolve(dep, bases)
        if path is None:
            return dep, current
        try:
            w = witness(os.stat(path))
        except OSError:
            return dep, current
        if digest(path, w, remembered, dep.sha256) != dep.sha256:
            return dep, current
        if _settled(w):
            current[path] = w
    return None, current


def forget() -> None:
    """Drop what this process remembers (tests)."""
    _known.clear()
