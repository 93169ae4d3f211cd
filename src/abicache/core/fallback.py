"""Where a miss builds when the store cannot be written.

A store on a read-only mount (a container layer, a remounted disk) or one that
is no longer ours to write (EACCES, EPERM) still serves its hits; a miss there
builds into a store of the user's own instead of failing, and says where, once
per process. Later processes find that entry there: a miss in the read-only
store looks in the fallback before building (Cache.get_or_build and
Cache.lookup).

A full disk or an exhausted quota (ENOSPC, EDQUOT) is not a reason to fall
back: the fallback is most likely on the same disk or under the same quota,
and the user must hear about it (errors.unwritable_store).

Search order, the first that is neither the store itself nor inside it:
  1. the user's cache directory ($XDG_CACHE_HOME/abicache, ~/.cache/abicache,
     or the platform's), whatever ABICACHE_DIR says;
  2. <the temporary directory>/abicache-<uid>.
Either must pass the same trust checks as any store (owned by this user,
nobody else may write it): a folder another user planted there is refused.
"""

from __future__ import annotations

import errno
import os
import tempfile
import warnings
from pathlib import Path

from ..errors import AbicacheWarning

#: the errors a fallback store answers; the rest stay errors
READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})

_said: set[tuple[str, str]] = set()


def unwritable(store_root: Path) -> int | None:
    """EROFS or EACCES where the store cannot be written, else None (asked after a miss only)."""
    try:
        if os.statvfs(store_root).f_flag & os.ST_RDONLY:
            return errno.EROFS
    except OSError:
        return None
    return None if os.access(store_root, os.W_OK) else errno.EACCES


def roots() -> list[Path]:
    """The fallback stores, in the order they are tried."""
    from ..settings import config

    user = config.user_root()
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return [user, Path(tempfile.gettempdir()) / f"abicache-{uid}"]


def root_for(store_root: Path) -> Path | None:
    """The fallback of the store at store_root, or None where every one is that store."""
    real = os.path.realpath(store_root)
    for root in roots():
        there = os.path.realpath(root)
        if there != real and not there.startswith(real.rstrip(os.sep) + os.sep):
            return root
    return None


def say(error: int, store_root: Path, root: Path) -> None:
    """One warning per process and pair of stores: why, and where the builds go instead."""
    if (str(store_root), str(root)) in _said:
        return
    _said.add((str(store_root), str(root)))
    why = os.strerror(error).lower()
    warnings.warn(f"abicache: the cache store {store_root} cannot be written ({why}): its hits still load, "
                  f"and misses build into {root}, a store of your own (set ABICACHE_DIR to choose another)",
                  AbicacheWarning, stacklevel=5)
