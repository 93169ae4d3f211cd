"""Per-key single flight with flock(2).

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
from contextlib import contextmanager, suppress
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
    _no_planted_link(lock)
    fd = _open(lock, mode)
    try:
        held = _wait(fd, min(timeout, 1.0))
        if not held:
            if on_wait is not None:
                on_wait(f"waiting for {describe_holder(lock)} to finish building {what}")
            held = _wait(fd, max(timeout - 1.0, 0.0))
        if not held:
            raise LockTimeout(
                f"gave up after {timeout:.0f} s waiting for the build lock of {what}, held by "
                f"{describe_holder(lock)}. If that process is stuck, stop it; otherwise raise "
                "ABICACHE_LOCK_TIMEOUT."
            )
    except OSError as exc:
        os.close(fd)
        if exc.errno not in _UNSUPPORTED:
            raise
        _warn_unlocked(lock, exc)
        yield False
        return
    except BaseException:
        os.close(fd)
        raise
    try:
        _write_holder(lock, what)
        yield True
    finally:
        # Unlinked while still held, so it never names a process that no longer holds the
        # lock, and a key built once keeps no 4 KiB file for it (the lock file is empty).
        with suppress(OSError):
            os.unlink(_holder_file(lock))
        _release(fd)


# The lock itself: flock(2) on the lock file, as filelock's UnixFileLock takes it (so
# abicache versions that used filelock exclude this one on a shared store; the tests
# cross-check both ways). filelock's import took 7 ms of the ~17 before the first
# compiler of a cold build starts (bench/build.py); these are the calls it makes.
_BUSY = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES})


def _open(lock: Path, mode: int) -> int:
    """The lock file, opened without following a link planted at its name (its
    folder made if missing: the cache makes it with the store's mode first)."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(lock, flags, mode)
    except FileNotFoundError:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, flags, mode)
    try:
        os.fchmod(fd, mode)  # the store's mode, whatever the umask
    except PermissionError:
        pass  # another user's lock file in a group-shared store: its creator set the mode
    return fd


def _wait(fd: int, seconds: float) -> bool:
    """Whether the lock was taken within seconds; polled (flock has no timeout),
    every 2 ms at first (a unit's object built by another process is often
    moments from done), backing off to 50 ms."""
    deadline = time.monotonic() + seconds
    pause = 0.002
    while not _try(fd):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)
    return True


def _try(fd: int) -> bool:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _BUSY:
            return False
        raise
    return True


def _release(fd: int) -> None:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)  # closing drops the lock anyway; unlocking first says so at once


def _no_planted_link(lock: Path) -> None:
    """The lock is opened with O_NOFOLLOW and fails on a symbolic link; one
    found at the lock's name (only someone able to write locks/ can plant
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


# ---- pins: entries in use that gc must leave alone ---------------------------------------------
#
# A build hands the linker an object entry's file in the store. gc (which runs
# beside builds) would remove that entry before the linker opens it. So the
# build holds a shared flock on the key's lock file from the hand-over until
# the link is done, and gc removes an entry only while it holds the exclusive
# one (a builder of the key holds it too, and is left alone as well).


def pin(lock: Path, mode: int, seconds: float = 5.0) -> int | None:
    """The lock file held shared (close it to let go), or None: locks do not work
    here, or a builder of the key held it for seconds."""
    import fcntl

    try:
        fd = _open(lock, mode)
    except OSError:
        return None
    deadline, pause = time.monotonic() + seconds, 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in _BUSY or time.monotonic() > deadline:
                os.close(fd)
                return None
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def hold(lock: Path, mode: int) -> int | None:
    """The lock file held exclusive, taken without waiting (close the descriptor, in every
    process that inherited it, to let go), or None: another holds it, or locks do not work here."""
    try:
        fd = _open(lock, mode)
    except OSError:
        return None
    try:
        if _try(fd):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


@contextmanager
def unless_in_use(lock: Path) -> Iterator[bool]:
    """True (the key's lock held exclusive meanwhile) when no build uses or builds the key."""
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(lock, flags)
    except OSError:
        yield True  # no lock file: nobody has pinned or built the key since it was made
        return
    try:
        try:
            free = _try(fd)
        except OSError:
            free = True  # locks do not work on this filesystem: nothing can be pinned either
        yield free
    finally:
        os.close(fd)
