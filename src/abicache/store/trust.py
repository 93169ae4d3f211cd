"""Who may write a store, and the checks that keep everyone else out.

Loading a cached .so runs its code, so the store is a security boundary.

Private mode (the default): the store belongs to one user. Every folder is
created 0700 whatever the umask, and everything a hit uses (the folders from
entries/<kind> down to the variant, its manifest and its files) must be
owned by that user or root and writable by nobody else.

Shared mode (ABICACHE_SHARED=<group>): the store belongs to one named group.
Folders are created 02770 (setgid: new files and folders inherit the group),
and everything a hit uses must be owned by root, the user, or a member of
that group; only that group may have write access, never others.

Checks use lstat (a symbolic link is never followed, and is never trusted).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import UntrustedRootError
from ..settings.owners import Trust, group_setting, quoted  # noqa: F401  (the store's policy; re-exported)
from . import transient

_POSIX = hasattr(os, "geteuid")


# ---- the root ----------------------------------------------------------------------------


def ensure_root(root: Path, trust: Trust, *, create: bool = True) -> Path:
    """Create the root if needed (create) and check it; returns it resolved (a
    symbolic link to the root is resolved once, here, and its target checked)."""
    for attempt in range(transient.TRIES):
        try:
            if create and not root.exists():
                trust.make_dir(root)
            real = root.resolve(strict=True)
            st = os.lstat(real)
            break
        except OSError as exc:
            if exc.errno in transient.TRANSIENT and attempt + 1 < transient.TRIES:
                transient.pause(attempt)  # a shared filesystem's passing error
                continue
            raise UntrustedRootError(
                f"cannot use cache root {root}: {exc.strerror}. Set ABICACHE_DIR to a directory you own and "
                "can write."
            ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedRootError(f"cache root {root} is not a directory; set ABICACHE_DIR elsewhere")
    _check_root(real, st, trust)
    _check_ancestors(real)
    return real


def _check_root(root: Path, st: os.stat_result, trust: Trust) -> None:
    problem = trust.problem(st, f"cache root {root}")
    if problem is None:
        return
    if "owned by" in problem:
        hint = ("Use a root of your own (ABICACHE_DIR), or set ABICACHE_SHARED=<group> if it is a cache "
                "shared by a group you trust and its owner is a member.")
        raise UntrustedRootError(f"{problem}; loading a library from it would run code that user controls. {hint}")
    fix = f"chmod o-w -- {quoted(root)}" if trust.shared else f"chmod go-w -- {quoted(root)}"
    hint = "" if trust.shared else ", or set ABICACHE_SHARED=<group> for a cache shared by a trusted group"
    raise UntrustedRootError(
        f"{problem}; anyone who can write there can run code in your processes. Fix: {fix}{hint}."
    )


def _check_ancestors(root: Path) -> None:
    """A folder above the root that others may write (without the sticky bit,
    as /tmp has) lets them rename the root away and put their own in its place."""
    if not _POSIX:
        return
    for folder in root.parents:
        st = os.lstat(folder)
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise UntrustedRootError(
                f"cache root {root} lies in {folder}, which anyone may write (mode {stat.S_IMODE(st.st_mode):o}, "
                f"no sticky bit): they could replace the cache. Fix: chmod o-w -- {quoted(folder)} (or +t), or move "
                "ABICACHE_DIR."
            )
