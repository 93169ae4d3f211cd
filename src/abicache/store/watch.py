"""Knowing that files have not changed since they were checked, without a
system call per file: an in-process memo of a build that read 200 headers
must see an edit (a notebook editing a header and loading again) and still
answer in microseconds.

Linux, with inotify (store/inotify.py): one inotify instance per process watches each
folder that holds checked files (and the folder a linked file leads to, and
a file with other hard links itself); any event in it (a write, a chmod, a
file created, moved or deleted, the folder itself moved) bumps that folder's
generation. A Watch records the generations of its folders *before* its
files are verified, so an edit during the check is never missed; asking it
drains pending events (one non-blocking read) and compares generations.
Elsewhere, when watches run out, or after the event queue overflowed: stat
every file and compare its witness (inode, size, mtime, ctime), trusting no
witness younger than a clock tick can tell apart.
"""

from __future__ import annotations

from _thread import allocate_lock  # threading.Lock itself, without importing threading on a hit
import os

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Sequence

Witness = tuple[int, int, int, int]  # (inode, size, mtime_ns, ctime_ns)


class _Events:
    """The process's inotify instance and the generation of each watched folder."""

    def __init__(self) -> None:
        from . import inotify

        self._inotify = inotify.Inotify()
        import atexit

        atexit.register(self._inotify.close)
        self._mask = (inotify.IN_MODIFY | inotify.IN_ATTRIB | inotify.IN_CLOSE_WRITE | inotify.IN_MOVED_FROM
                      | inotify.IN_MOVED_TO | inotify.IN_CREATE | inotify.IN_DELETE | inotify.IN_DELETE_SELF
                      | inotify.IN_MOVE_SELF)
        self._overflow, self._ignored = inotify.IN_Q_OVERFLOW, inotify.IN_IGNORED
        self.folders: dict[tuple[str, int, int], int] = {}  # (folder, device, inode) -> watch descriptor
        self.generation: dict[int, int] = {}  # watch descriptor -> events seen
        self.lock = allocate_lock()

    def arm(self, folder: str) -> int | None:
        try:  # by what the name reaches now: a link retargeted since names another folder
            st = os.stat(folder)
        except OSError:
            return None
        reached = (folder, st.st_dev, st.st_ino)
        wd = self.folders.get(reached)
        if wd is None:
            try:
                wd = self._inotify.add_watch(folder, self._mask)
            except OSError:
                return None  # out of watches, or no such folder: stat instead
            self.folders[reached] = wd
            self.generation.setdefault(wd, 0)
        return wd

    def drain(self) -> None:
        for event_wd, mask in self._inotify.read():
            if mask & self._overflow:  # events were lost: everything may have changed
                for wd in self.generation:
                    self.generation[wd] += 1
                continue
            self.generation[event_wd] = self.generation.get(event_wd, 0) + 1
            if mask & self._ignored:  # the watch is gone (folder deleted): never trust it again
                self.generation[event_wd] = -1 - self.generation[event_wd]
                self.folders = {f: w for f, w in self.folders.items() if w != event_wd}


_events: _Events | None = None
_tried = False


def _shared() -> _Events | None:
    global _events, _tried
    if not _tried:
        _tried = True
        try:
            _events = _Events()
        except (ImportError, OSError, AttributeError):
            _events = None  # not Linux, or no inotify instance left
    return _events


#: folder -> the folders holding the symbolic links met on the way to it
_holders: dict[str, tuple[str, ...]] = {}


def _link_holders(folder: str) -> tuple[str, ...]:
    """The folders that hold a symbolic link among folder's parts (one lstat a
    part, remembered: a Watch is armed once per entry and process)."""
    known = _holders.get(folder)
    if known is None:
        found, prefix = [], ""
        for part in folder.strip("/").split("/"):
            parent, prefix = prefix or "/", f"{prefix}/{part}"
            try:
                if os.path.islink(prefix):
                    found.append(parent)
            except OSError:
                break
        known = _holders[folder] = tuple(found)
    return known


def _behind(paths: Sequence[str]) -> set[str]:
    """What else must be watched for these files (one lstat each): the folder a symbolic link
    to a file leads to (an edit there is no event in the link's folder), and a file with other
    hard links, itself (written through another name, it is an event only in that name's
    folder; a watch on the file is told whatever the name)."""
    import stat

    more: set[str] = set()
    for path in paths:
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(path)
                more.add(os.path.dirname(target))
                st = os.stat(target)
                path = target
        except OSError:
            continue
        if st.st_nlink > 1:
            more.add(path)
    return more


class Watch:
    """Whether a set of files is unchanged since the Watch was made (see module)."""

    __slots__ = ("marks", "files")

    def __init__(self, paths: Sequence[str], folders: Sequence[str] = ()) -> None:
        """Watch the folders that hold paths, and folders themselves (for
        entries created or removed in them); and, where a folder is reached
        through a symbolic link, the folder that holds the link (a link
        retargeted to another folder is an event there, not in the old one)."""
        self.files: list[tuple[str, Witness]] | None = None  # the stat fallback, set by settle()
        self.marks: list[tuple[int, int]] | None = None
        events = _shared()
        if events is None:
            return
        watched = {os.path.dirname(p) for p in paths} | set(folders) | _behind(paths)
        watched |= {holder for folder in watched for holder in _link_holders(folder)}
        with events.lock:
            events.drain()
            marks = []
            for folder in sorted(watched):
                wd = events.arm(folder)
                if wd is None:
                    return
                marks.append((wd, events.generation[wd]))
            self.marks = marks

    def settle(self, witnesses: Sequence[tuple[str, Witness]]) -> Watch:
        """The witnesses the check found (the fallback's baseline)."""
        self.files = list(witnesses)
        return self

    def unchanged(self) -> bool:
        events = _events
        if self.marks is not None and events is not None:
            with events.lock:
                events.drain()
                return all(events.generation.get(wd) == g for wd, g in self.marks)
        if self.files is None:
            return False
        for path, w in self.files:
            try:
                st = os.stat(path)
            except OSError:
                return False
            if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != w:
                return False
        return True
