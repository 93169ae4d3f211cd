"""Errors a shared filesystem gives while another machine writes or removes.

On NFS, Lustre or a volume shared by pods, a file or folder of the store can
vanish between two calls (ENOENT: another machine's gc or quarantine), a
handle can go stale (ESTALE: the inode was replaced on the server), or a
rename can find its target busy (EBUSY). None of these means the store is
damaged: the operation is tried again, a lookup that keeps failing is a miss,
and nothing is quarantined because of one.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

TRANSIENT = frozenset({errno.ENOENT, errno.EBUSY, errno.ESTALE})
#: tries of one operation before its error is raised (or, for a lookup, it is a miss)
TRIES = 4


_NOT_OURS = "_abicache_not_ours"


def mark_not_ours(exc: OSError) -> None:
    """exc came from user code (a builder writing its output): not the store's."""
    setattr(exc, _NOT_OURS, True)


def in_store(exc: BaseException, root: Path) -> bool:
    """Whether exc is a transient error about a path inside the store at root
    (also EEXIST for a folder that is there: a check that it was there failed)."""
    if not isinstance(exc, OSError) or getattr(exc, _NOT_OURS, False):
        return False
    if exc.errno not in TRANSIENT and not (exc.errno == errno.EEXIST and _is_dir(exc.filename)):
        return False
    top = os.fspath(root).rstrip(os.sep) + os.sep
    return any(isinstance(name, (str, os.PathLike)) and (os.fspath(name) + os.sep).startswith(top)
               for name in (exc.filename, exc.filename2))


def underlying(exc: BaseException, root: Path) -> OSError | None:
    """The transient store error behind exc (an audit or build error that
    wrapped it), if any: that is retried, not reported as the build's fault."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 8:
        if isinstance(cause, OSError) and in_store(cause, root):
            return cause
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return None


def _is_dir(name: object) -> bool:
    return isinstance(name, (str, os.PathLike)) and os.path.isdir(name)


def pause(attempt: int) -> None:
    """A short, growing wait before the next try (10, 20, 40 ms)."""
    time.sleep(0.01 * (1 << attempt))
