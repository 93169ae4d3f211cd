"""store/lock.py takes flock(2) itself (filelock's import was 7 ms of the ~17 before the
first compiler of a cold build starts). It must exclude filelock's UnixFileLock both
ways: abicache versions that locked with filelock may share a store with this one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from abicache.errors import LockTimeout
from abicache.store.lock import key_lock

filelock = pytest.importorskip("filelock")


def test_our_lock_excludes_filelock(tmp_path: Path) -> None:
    lock = tmp_path / "k.lock"
    with key_lock(lock, "t x", 5) as held:
        assert held
        with pytest.raises(filelock.Timeout):
            filelock.UnixFileLock(lock, thread_local=False).acquire(timeout=0.2)
    other = filelock.UnixFileLock(lock, thread_local=False)
    other.acquire(timeout=1)  # released on leaving the block
    other.release()


def test_filelock_excludes_ours_and_the_timeout_names_the_wait(tmp_path: Path) -> None:
    lock = tmp_path / "k.lock"
    other = filelock.UnixFileLock(lock, thread_local=False)
    other.acquire(timeout=1)
    said = []
    try:
        with pytest.raises(LockTimeout, match="gave up after 2 s waiting for the build lock of t x"):
            with key_lock(lock, "t x", 1.5, said.append):
                pytest.fail("took a lock filelock holds")
    finally:
        other.release()
    assert said and "to finish building t x" in said[0]
    with key_lock(lock, "t x", 1) as held:
        assert held


def test_the_lock_file_gets_the_stores_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        with key_lock(tmp_path / "g.lock", "t x", 1, mode=0o660):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "g.lock").stat().st_mode) == 0o660


def test_a_lock_is_released_when_its_block_raises(tmp_path: Path) -> None:
    lock = tmp_path / "k.lock"
    with pytest.raises(RuntimeError):
        with key_lock(lock, "t x", 1):
            raise RuntimeError("the build failed")
    filelock.UnixFileLock(lock, thread_local=False).acquire(timeout=0.2)
