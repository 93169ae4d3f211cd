"""A build's private scratch folder: made in the temporary folder, removed when the build
ends, and swept by a later build where its process died before it could remove it.

A build killed by SIGKILL (the OOM killer, a CI job's timeout, `kill -9`) runs no cleanup:
its scratch, the sources placed there, the objects and the observer's reports, stayed in
/tmp (a day of this suite's crash tests left 130). Each scratch folder holds a lock file
whose lock its process holds while the build runs (flock: the kernel lets it go when the
process ends, however it ends; it holds across PID namespaces, where a PID would not).
The first build of a process, in the background, removes the scratch folders of this user
whose lock nobody holds, at most once in EVERY seconds a user (a marker file says when).
A folder written to in the last GRACE seconds is left alone: its lock is taken right after
it is made. Only a folder with a lock file is ever swept: where flock cannot be had, a
build's folder has none, and is left as before.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import Iterator

from ..store import lock

#: a scratch folder's name starts with this (mkdtemp adds 8 random characters)
PREFIX = "abicache-scratch-"
#: its lock file, held by the build's process while it runs
ALIVE = ".alive"
#: how long a folder is left alone after it was last written to, whatever its lock says
GRACE = 60.0
#: the folders earlier versions made (no lock), swept once nothing could still be building there
LEGACY = ("abicache-build-", "abicache-launch-", "abicache-nvcc-", "abicache-cc-", "abicache-check-")
LEGACY_AGE = 7 * 86400.0
#: a user's sweeps, at most one in this many seconds (the mtime of a marker file beside the
#: folders): the compiler launcher under `make -j` starts a process a compile
EVERY = 600.0
MARKER = "abicache-swept-"

#: when this process may start a sweep next (time.monotonic)
_next_sweep = [0.0]


@contextmanager
def scratch() -> Iterator[str]:
    """A private temporary folder for one build, removed once the build ended: at once where
    it failed (its output is then gone with it), in the background where it succeeded
    (freeing its objects took 2 ms between the link and the load; the interpreter waits for
    that thread before it exits)."""
    folder = tempfile.mkdtemp(prefix=PREFIX)
    alive = _hold(folder)
    if time.monotonic() >= _next_sweep[0]:
        _next_sweep[0] = time.monotonic() + EVERY
        threading.Thread(target=_sweep_quietly, name="abicache-sweep", daemon=True).start()
    try:
        yield folder
    except BaseException:
        _remove(folder, alive)
        raise
    threading.Thread(target=_remove, args=(folder, alive), name="abicache-scratch").start()


def _hold(folder: str) -> int:
    """Take the folder's lock (store/lock.py's flock); -1 where it cannot be had (no flock
    here): the folder then has no lock file, and no sweep ever removes it."""
    path = os.path.join(folder, ALIVE)
    fd = lock.hold(Path(path), 0o600)
    if fd is None:
        with suppress(OSError):
            os.unlink(path)
        return -1
    return fd


def _remove(folder: str, alive: int) -> None:
    try:
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        if alive >= 0:
            os.close(alive)  # after: a sweeper never finds it unheld while it is being removed here


def _sweep_quietly() -> None:
    try:
        where = tempfile.gettempdir()
        if _due(where):
            sweep(where)
    except Exception:  # noqa: BLE001  tidying the temporary folder is never a reason for a build to say more
        pass


def _due(where: str) -> bool:
    """Whether this user's last sweep of where is EVERY seconds old (or unknown); the marker is
    touched if so. Another user's file by that name is no marker: sweeps then go on as due."""
    marker = os.path.join(where, f"{MARKER}{os.geteuid()}")
    try:
        st = os.lstat(marker)
        if S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and 0 <= time.time() - st.st_mtime < EVERY:
            return False
    except FileNotFoundError:
        pass
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError:
        return True
    try:
        os.utime(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    return True


def sweep(where: str | None = None) -> list[str]:
    """Remove the scratch folders in where (the temporary folder) that this user's builds
    left behind; the ones removed."""
    where = where or tempfile.gettempdir()
    now, me, removed = time.time(), os.geteuid(), []
    try:
        with os.scandir(where) as entries:
            found = [e.name for e in entries if e.name.startswith((PREFIX, *LEGACY))]
    except OSError:
        return removed
    for name in found:
        path = os.path.join(where, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        # a folder, of this user (in a sticky /tmp no one else can rename or remove it then)
        if not S_ISDIR(st.st_mode) or st.st_uid != me:
            continue
        if name.startswith(PREFIX):
            if now - st.st_mtime >= GRACE and _abandoned(path):
                removed.append(path)
        elif now - st.st_mtime >= LEGACY_AGE:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _abandoned(folder: str) -> bool:
    """Remove the folder if no process holds its lock; whether it did. One without a lock file
    is left alone: its build could not take one."""
    path = os.path.join(folder, ALIVE)
    if not os.path.isfile(path):
        return False
    fd = lock.hold(Path(path), 0o600)
    if fd is None:
        return False  # a build is running there
    try:
        shutil.rmtree(folder, ignore_errors=True)  # held by this sweep while it removes it
    finally:
        os.close(fd)
    return True
