"""Per-key single flight with flock (filelock).

The kernel drops a flock when its holder dies, so a build killed with SIGKILL
never leaves a lock behind. Beside the lock we write who holds it, so a wait
that times out can name the holder. Where the filesystem cannot lock, builds
go ahead unlocked: atomic publish keeps the result correct, at worst built twice.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from ..errors import AbicacheWarning, LockTimeout

_UNSUPPORTED = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP}
_warned_unlocked = False


def _holder_file(lock: Path) -> Path:
    return lock.with_suffix(".holder")


def _write_holder(lock: Path, what: str) -> None:
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "what": what,
        "command": " ".join(sys.argv)[:300],
        "since": time.time(),
    }
    try:
        _holder_file(lock).write_text(json.dumps(info))
    except OSError:
        pass


def describe_holder(lock: Path) -> str:
    try:
        info = json.loads(_holder_file(lock).read_text())
        age = time.time() - float(info["since"])
        return (
            f"pid {info['pid']} on {info['host']} ({info['what']}; command: {info['command']!r}), "
            f"holding it for {age:.0f} s"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process"


@contextmanager
def key_lock(
    lock: Path, what: str, timeout: float, on_wait: Callable[[str], None] | None = None
) -> Iterator[bool]:
    """Hold the lock for one key; yields False when the filesystem cannot lock."""
    from filelock import FileLock, Timeout  # ~25 ms to import: only on a miss

    lock.parent.mkdir(parents=True, exist_ok=True)
    flock = FileLock(lock, fallback_to_soft=False, thread_local=False)
    try:
        try:
            flock.acquire(timeout=min(timeout, 1.0))
        except Timeout:
            if on_wait is not None:
                on_wait(f"waiting for {describe_holder(lock)} to finish building {what}")
            flock.acquire(timeout=max(timeout - 1.0, 0.0))
    except Timeout:
        raise LockTimeout(
            f"gave up after {timeout:.0f} s waiting for the build lock of {what}, held by "
            f"{describe_holder(lock)}. If that process is stuck, stop it; otherwise raise "
            "ABICACHE_LOCK_TIMEOUT."
        ) from None
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
        _warn_unlocked(lock, exc)
        yield False
        return
    try:
        _write_holder(lock, what)
        yield True
    finally:
        flock.release()


def _warn_unlocked(lock: Path, exc: OSError) -> None:
    global _warned_unlocked
    if not _warned_unlocked:
        _warned_unlocked = True
        warnings.warn(
            f"cannot lock {lock.parent} ({exc.strerror}); building without a lock. "
            "Results stay correct, but concurrent processes may build the same key twice.",
            AbicacheWarning,
            stacklevel=4,
        )
