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
    """Written to a new file, then renamed over the old one: a symbolic link
    planted at the holder's name is replaced, never followed."""
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "what": what,
        "command": " ".join(sys.argv)[:300],
        "since": time.time(),
    }
    temp = lock.with_name(f".{lock.stem}.{os.getpid()}-{time.monotonic_ns()}.holder")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, json.dumps(info).encode())
        finally:
            os.close(fd)
        os.replace(temp, _holder_file(lock))
    except OSError:
        try:
            os.unlink(temp)
        except OSError:
            pass


def describe_holder(lock: Path) -> str:
    try:
        fd = os.open(_holder_file(lock), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            info = json.loads(os.read(fd, 4096))
        finally:
            os.close(fd)
        age = time.time() - float(info["since"])
        return (
            f"pid {info['pid']} on {info['host']} ({info['what']}; command: {info['command']!r}), "
            f"holding it for {age:.0f} s"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process"


@contextmanager
def key_lock(
    lock: Path, what: str, timeout: float, on_wait: Callable[[str], None] | None = None,
    mode: int = 0o600,
) -> Iterator[bool]:
    """Hold the lock for one key; yields False when the filesystem cannot lock."""
    from filelock import FileLock, Timeout  # ~25 ms to import: only on a miss

    _no_planted_link(lock)
    flock = FileLock(lock, mode=mode, fallback_to_soft=False, thread_local=False)
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


def _no_planted_link(lock: Path) -> None:
    """filelock opens the lock with O_NOFOLLOW and fails on a symbolic link;
    one found at the lock's name (only someone able to write locks/ can plant
    it) is removed, with a warning, so builds go on."""
    try:
        if not os.path.islink(lock):
            return
        os.unlink(lock)
    except FileNotFoundError:
        return
    warnings.warn(f"abicache: removed a symbolic link planted at the lock file {lock}", AbicacheWarning,
                  stacklevel=4)


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
