"""Refuse a store root that someone else could write: loading a .so runs its code."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import UntrustedRootError


def ensure_private_root(root: Path, *, shared: bool) -> None:
    """Create root (0700, or 0770 when shared) if needed, then check who can write it."""
    try:
        root.mkdir(mode=0o770 if shared else 0o700, parents=True, exist_ok=True)
        st = root.stat()
    except OSError as exc:
        raise UntrustedRootError(
            f"cannot use cache root {root}: {exc.strerror}. "
            "Set ABICACHE_DIR to a directory you own and can write."
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedRootError(f"cache root {root} is not a directory; set ABICACHE_DIR elsewhere")
    check_root_stat(root, st, shared=shared)


def check_root_stat(root: Path, st: os.stat_result, *, shared: bool) -> None:
    if not hasattr(os, "geteuid"):
        return  # Windows: ACLs, not mode bits; nothing portable to check here
    me = os.geteuid()
    if st.st_uid != me and not shared:
        raise UntrustedRootError(
            f"cache root {root} is owned by uid {st.st_uid}, not by you (uid {me}); "
            "loading a library from it would run code that user controls. "
            "Use a root of your own (ABICACHE_DIR), or set ABICACHE_SHARED=1 "
            "if it is a cache shared by a group you trust."
        )
    writable = st.st_mode & (stat.S_IWOTH if shared else (stat.S_IWGRP | stat.S_IWOTH))
    if writable:
        who = "others" if writable & stat.S_IWOTH else "its group"
        fix = f"chmod o-w {root}" if shared else f"chmod go-w {root}"
        hint = "" if shared else ", or set ABICACHE_SHARED=1 for a cache shared by a trusted group"
        raise UntrustedRootError(
            f"cache root {root} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}); "
            f"anyone who can write there can run code in your processes. Fix: {fix}{hint}."
        )
