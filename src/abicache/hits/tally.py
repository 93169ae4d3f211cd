"""Counting the hits records serve, as store/counters.py counts every other hit (local
hits, and hits_record: which of them a record served): in memory, appended to the store's
stats log as one line when the process exits.

The common case writes the line itself (one O_APPEND write to a log that is there, is
a regular file and has room); anything else (no log yet, one to rotate) hands the
counts to store/counters.py, which imports the store to do it.
"""

from __future__ import annotations

import os
from stat import S_ISREG

from . import LAYOUT

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it

#: (store root, kind of entry) -> [hits, seconds saved]
_pending: dict[tuple[str, str], list[float]] = {}
_FLAGS = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
    | getattr(os, "O_CLOEXEC", 0)
#: store/logs.py MAX_BYTES and store/counters.py LOG (tests/test_hits.py keeps them equal)
_MAX_BYTES = 1 << 20
_LOG = "stats"


def _forget_in_child() -> None:
    """A forked child's counts are its parent's to write (store/counters.py does the same)."""
    _pending.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def count_served(served: list[tuple[str, float, str]]) -> None:
    """The hits records served in this process (the hits package's _served), counted and
    written as it exits; the list is emptied."""
    counted, served[:] = list(served), []
    for root, seconds, path in counted:
        count(root, seconds, path)
    flush()


def count(root: str, seconds: float, entry: str) -> None:
    """One hit of the entry at that path (its kind, counters.by_kind, is the folder it is in)."""
    kind = os.path.basename(os.path.dirname(os.path.dirname(entry)))
    held = _pending.get((root, kind))
    if held is None:
        if not _pending:
            import atexit

            atexit.register(flush)
        held = _pending[root, kind] = [0, 0.0]
    held[0] += 1
    held[1] += seconds


def flush() -> None:
    import time

    taken = list(_pending.items())
    _pending.clear()
    for (root, kind), (hits, seconds) in taken:
        if not os.path.isdir(os.path.join(root, LAYOUT)):
            continue  # removed since it served them (by its user): never made again for its counts
        named = kind.isprintable() and '"' not in kind and "\\" not in kind  # a kind is a name: cc.library
        line = b'{"time": %.3f, "pid": %d, "hits_local": %d, "hits_record": %d, %s"seconds_saved": %.3f}\n' % (
            time.time(), os.getpid(), hits, hits, b'"kind:%s:hits": %d, ' % (kind.encode(), hits) if named else b"",
            seconds)
        if not _append(os.path.join(root, LAYOUT, "log", f"{_LOG}.jsonl"), line):
            _by_counters(root, kind, int(hits), seconds)


def _append(path: str, line: bytes) -> bool:
    try:
        st = os.lstat(path)
        if not S_ISREG(st.st_mode) or st.st_size + len(line) > _MAX_BYTES:
            return False
        fd = os.open(path, _FLAGS)
    except OSError:
        return False
    try:
        if not S_ISREG(os.fstat(fd).st_mode):
            return False
        os.write(fd, line)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _by_counters(root: str, kind: str, hits: int, seconds: float) -> None:
    try:
        from ..settings import config
        from ..settings.owners import group_setting
        from ..store import Store, counters

        store = Store(root, group=group_setting(config.text("ABICACHE_SHARED")))
        counters.count(store, hits_local=hits, hits_record=hits, seconds_saved=seconds,
                       **{counters.by_kind(kind, "hits"): hits})
        counters.flush(store)
    except Exception:  # noqa: BLE001  statistics only inform: never a reason for an exit to fail
        pass
