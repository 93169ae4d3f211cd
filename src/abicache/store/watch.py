"""Knowing that files have not changed since they were checked, without a
system call per file: an in-process memo of a build that read 200 headers
must see an edit (a notebook editing a header and loading again) and still
answer in microseconds.

Linux, with inotify (store/inotify.py): one inotify instance per process watches each
checked file (a write, a chmod, a link count changed: whatever name it is reached by) and
the folders that hold them for their names (a file created, moved or deleted, the folder
itself moved), and the folder a linked file leads to; any event bumps that watch's
generation. A folder is watched for its names only because watching it for its files'
writes costs the kernel a pass over every name it has cached there: 0.03 to 0.1 ms for
/usr/include or /usr/lib, 32 ms for a /tmp after a day of test runs, against 3 us a
file. Where a folder holds many checked files (MANY), or is one this process may not write
(the system's: it changes when someone upgrades it), it is watched for all of them.
A Watch records the generations of its watches *before* its files are verified,
so an edit during the check is never missed; asking it drains pending events
(one non-blocking read) and compares generations, none where no event came since.
Elsewhere, when watches run out, or after the event queue overflowed: stat
every file and compare its witness (inode, size, mtime, ctime), trusting no
witness younger than a clock tick can tell apart.
"""

from __future__ import annotations

from _thread import allocate_lock, start_new_thread  # threading's own, without importing threading on a hit
import os
from stat import S_ISLNK

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Callable, Mapping, Protocol, Sequence

    class Native(Protocol):
        """hits/native.py Native's calls a watch makes where it is given one."""

        def arm(self, fd: int, paths: Sequence[str], masks: Sequence[int]) -> list[int] | None:
            """Arms paths for masks on an inotify descriptor, all or none."""

        def holders(self, folders: Sequence[str]) -> list[str] | None:
            """_link_holders of each folder, one after another; None: not told."""

Witness = tuple[int, int, int, int]  # (inode, size, mtime_ns, ctime_ns)


def masks() -> tuple[int, int, int]:
    """What a watch asks of a file (its own events), of a folder (its names), and of a folder
    watched for its names and its files' events."""
    from . import inotify

    file_mask = (inotify.IN_MODIFY | inotify.IN_ATTRIB | inotify.IN_CLOSE_WRITE | inotify.IN_DELETE_SELF
                 | inotify.IN_MOVE_SELF)
    # no IN_ATTRIB, IN_MODIFY or IN_CLOSE_WRITE: on a folder those are its files' events,
    # and asking for them makes the kernel mark each name it has cached there
    names_mask = (inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO | inotify.IN_CREATE | inotify.IN_DELETE
                  | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF)
    return file_mask, names_mask, file_mask | names_mask


class _Events:
    """The process's inotify instance and the generation of each watched folder."""

    def __init__(self) -> None:
        from . import inotify

        self._inotify = inotify.Inotify()
        import atexit

        atexit.register(_close_at_exit)
        self.file_mask, self.names_mask, self.all_mask = masks()
        self._add_mask = inotify.IN_MASK_ADD  # a second Watch's mask adds to the first's
        self._overflow, self._ignored = inotify.IN_Q_OVERFLOW, inotify.IN_IGNORED
        self.armed: dict[str, int] = {}  # path -> the masks asked of what it reached (what tests look at)
        self.generation: dict[int, int] = {}  # watch descriptor -> events seen
        self.seen = 0  # events of every watch: a Watch made since then compares none of its marks
        self.lock = allocate_lock()

    def arm(self, path: str, mask: int) -> int | None:
        """The watch descriptor of path (a folder or a file), watched for at least mask: by
        what the name reaches now (a link retargeted since names another inode, and the
        kernel another descriptor). One system call, as a stat to tell whether it is
        watched already would be: the kernel answers an inode it watches with its descriptor."""
        try:
            wd = self._inotify.add_watch(path, mask | self._add_mask)
        except OSError:
            return None  # out of watches, or no such folder: stat instead
        self.armed[path] = self.armed.get(path, 0) | mask
        self.generation.setdefault(wd, 0)
        return wd

    def arm_all(self, paths: Sequence[str], masks: Sequence[int], native: Native | None = None) -> list[int] | None:
        """arm() each path for its mask, in one native call where native is given (hits/native.py);
        None where one could not be armed."""
        if native is None:
            wds = []
            for path, mask in zip(paths, masks):
                wd = self.arm(path, mask)
                if wd is None:
                    return None
                wds.append(wd)
            return wds
        found = native.arm(self._inotify.fd, paths, [mask | self._add_mask for mask in masks])
        if found is None:
            return None
        generation, armed = self.generation, self.armed
        for path, wd, mask in zip(paths, found, masks):
            armed[path] = armed.get(path, 0) | mask
            generation.setdefault(wd, 0)
        return found

    def close(self) -> None:
        self._inotify.close()

    def detach(self) -> int:
        """The instance's descriptor, no longer this object's to use (-1: closed already)."""
        return self._inotify.detach()

    def drain(self) -> None:
        for event_wd, mask in self._inotify.read():
            self.seen += 1
            if mask & self._overflow:  # events were lost: everything may have changed
                for wd in self.generation:
                    self.generation[wd] += 1
                continue
            self.generation[event_wd] = self.generation.get(event_wd, 0) + 1
            if mask & self._ignored:  # the watch is gone (folder deleted): never trust it again
                self.generation[event_wd] = -1 - self.generation[event_wd]


_events: _Events | None = None
_tried = False


def _forget_in_child() -> None:
    """A forked child shares its parent's inotify instance (one open file): a read there
    would take events the parent's watches are waiting for, and the parent's memo would
    miss an edit (a DataLoader's workers loading an extension the parent loaded). The
    child closes its copy and makes its own at its next Watch; the Watches it inherited
    then ask it nothing (see unchanged)."""
    global _events, _tried
    if _events is not None:
        _events.close()
    _events, _tried = None, False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _close_at_exit() -> None:
    """The instance closed when the interpreter exits, on a thread of its own: closing an
    inotify instance that holds watches waits for the kernel to let them go (an RCU grace
    period: 5-15 ms in half of the processes a record served here, in wall time), and so does
    the process's exit where it is left open. On a thread, that wait overlaps the interpreter's
    own shutdown (~14 ms after a hit's last line). A call made after it (an exit handler
    registered before abicache's runs after it) finds no instance: its Watches fall back to
    stat, and new ones to the full check (unchanged, _shared)."""
    global _events
    events = _events
    if events is None:
        return
    with events.lock:
        _events = None  # _tried stays: no new instance at exit
        fd = events.detach()
    if fd < 0:
        return
    try:
        start_new_thread(os.close, (fd,))
    except RuntimeError:  # no thread to be had: the wait is the exit's
        os.close(fd)


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
#: path -> whether it is a symbolic link: the folders of one entry share most of their parts
_links: dict[str, bool] = {}


def _link_holders(folder: str) -> tuple[str, ...]:
    """The folders that hold a symbolic link among folder's parts (one lstat a
    part, remembered: a Watch is armed once per entry and process)."""
    known = _holders.get(folder)
    if known is None:
        found, prefix = [], ""
        for part in folder.strip("/").split("/"):
            parent, prefix = prefix or "/", f"{prefix}/{part}"
            link = _links.get(prefix)
            if link is None:
                link = _links[prefix] = os.path.islink(prefix)
            if link:
                found.append(parent)
        known = _holders[folder] = tuple(found)
    return known


def _behind(paths: Sequence[str]) -> tuple[set[str], set[str]]:
    """For these files: the folder of each link their symbolic links lead through (a link
    retargeted, or the target replaced, is a name changed there, not in the first link's
    folder), and the files a write may reach by another name, links and files with other
    hard links (an event of that name's folder only; a watch on the file itself is told
    whatever the name: inotify watches the inode a name leads to). One lstat a file, and a
    readlink a hop where it is a link: os.path.realpath stats every part of every path
    (0.3 ms for a compiler's 35 files), and a readlink tried on every file raised for all
    but the links (a torch extension's 540: 1 ms)."""
    links: list[str] = []
    files: set[str] = set()
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if S_ISLNK(st.st_mode):
            links.append(path)
            files.add(path)
        elif st.st_nlink > 1:
            files.add(path)
    return link_folders(links), files


def link_folders(links: Sequence[str]) -> set[str]:
    """The folder of each link these symbolic links lead through (a readlink a hop)."""
    return {folder for path in links for _, folder in link_hops(path)}


def link_hops(path: str) -> list[tuple[str, str]]:
    """(link, the folder its target is in) for each symbolic link met from path on, in
    order: a readlink a hop, at most 40 (the kernel's own limit on links in a row); the
    walk ends at the first name that is no link. A hit record's writer witnesses each link
    (hits/writer.py)."""
    hops: list[tuple[str, str]] = []
    hop = path
    for _ in range(40):
        try:
            target = os.readlink(hop)
        except OSError:
            break
        following = os.path.join(os.path.dirname(hop), target)
        hops.append((hop, os.path.dirname(following)))
        hop = following
    return hops


#: a folder holding more checked files than this is watched for its files' events as a
#: whole (one pass over its cached names), not file by file
MANY = 32


def _writable(folder: str) -> bool:
    """Whether this process may write in folder. One it may not (the system's headers and
    compiler, a read-only install or filesystem) changes when someone else upgrades it, not
    while one works beside it: it is watched as a whole, one watch for all its files however
    few (a torch extension's record, for a user who is not root: 51 watches, not 209, armed
    by its hit in 0.83 ms, not 1.19). One it may write (a project, /tmp) is watched file by
    file, so that writing one's other files there sends no call the full way; root may write
    anywhere, so its folders are watched as before."""
    try:
        return os.access(folder, os.W_OK, effective_ids=os.access in os.supports_effective_ids)
    except (OSError, ValueError):
        return True  # as before: file by file


def plan(paths: Sequence[str], folders: Sequence[str] = (),
         behind: tuple[set[str], set[str]] | None = None) -> list[tuple[str, int]]:
    """What to watch for what (see _masks), in path order, but the folders that hold the
    symbolic links met on the way to a watched folder: what a hit record keeps (hits/), so
    that its hit computes none of it; Watch(plan=...) adds those folders as it is armed
    (where a link is, or is not, may change between the record and the hit)."""
    wanted = _wanted(masks(), paths, folders, behind)
    return sorted(wanted.items())


def _masks(events: _Events, paths: Sequence[str], folders: Sequence[str],
           behind: tuple[set[str], set[str]] | None = None) -> dict[str, int]:
    """What to watch for what: each file for its own events, and each folder that holds
    one for its names (for all of its files' events where it holds MANY); the folders
    watched for names alone; the folder a link leads to and, where a folder is reached
    through a symbolic link, the folder that holds the link, for everything. behind:
    _behind(paths) where the caller knows it already (a record says: hits/)."""
    wanted = _wanted((events.file_mask, events.names_mask, events.all_mask), paths, folders, behind)
    return _holders_added(wanted, events.file_mask, events.names_mask)


def _wanted(masks: tuple[int, int, int], paths: Sequence[str], folders: Sequence[str],
            behind: tuple[set[str], set[str]] | None) -> dict[str, int]:
    """_masks without the folders that hold links on the way to a watched folder."""
    file_mask, names_mask, all_mask = masks
    listed = set(folders)  # a folder whose listing was read is among the paths too: its names are watched
    paths = [p for p in paths if p not in listed]
    by_folder: dict[str, list[str]] = {}
    for path in paths:  # the folder: what the last '/' leaves (os.path.dirname costs twice that; where
        by_folder.setdefault(path.rpartition("/")[0] or "/", []).append(path)  # '//' ends it, the same inode)
    wanted: dict[str, int] = {}
    for folder, files in by_folder.items():
        if len(files) > MANY or not _writable(folder):
            wanted[folder] = all_mask
            continue
        wanted[folder] = names_mask
        for path in files:
            wanted[path] = file_mask
    behind_links, reached_otherwise = behind if behind is not None else _behind(paths)
    for path in reached_otherwise:  # in a folder watched as a whole too
        wanted[path] = file_mask
    for folder in {*folders, *behind_links}:  # a file watched by a name that is a link: its inode is watched
        wanted[folder] = wanted.get(folder, 0) | names_mask
    return wanted


def _holders_added(wanted: dict[str, int], file_mask: int, names_mask: int,
                   native: Native | None = None) -> dict[str, int]:
    """wanted, with the folder that holds each symbolic link on the way to a folder watched
    for its names (a link retargeted: a name changed there) watched for its names too; found
    by native where it is given (one call: a torch extension's 47 folders took 0.5 ms here)."""
    folders_only = names_mask & ~file_mask  # a name created or removed: asked of folders alone
    folders = [path for path, mask in wanted.items() if mask & folders_only]
    found = native.holders(folders) if native is not None else None
    if found is None:
        found = [holder for folder in folders for holder in _link_holders(folder)]
    for holder in found:
        wanted[holder] = wanted.get(holder, 0) | names_mask
    return wanted


class Watch:
    """Whether a set of files is unchanged since the Watch was made (see module)."""

    __slots__ = ("marks", "files", "seen", "owner", "_later")

    def __init__(self, paths: Sequence[str], folders: Sequence[str] = (),
                 behind: tuple[set[str], set[str]] | None = None, native: Native | None = None,
                 planned: Mapping[str, int] | Sequence[tuple[str, int]] | None = None) -> None:
        """Watch paths (files) and the folders that hold them, and folders themselves (for
        entries created or removed in them); and, where a folder is reached through a
        symbolic link, the folder that holds the link (a link retargeted to another
        folder is an event there, not in the old one). See _masks for what for, and behind;
        native: arm them in one native call, and find the folders holding links so
        (hits/native.py); planned: plan() of them, made
        before (a hit record's), for paths, folders and behind."""
        self.files: list[tuple[str, Witness]] | None = None  # the stat fallback, set by settle()
        self._later: Callable[[], list[tuple[str, Witness]]] | None = None
        #: (watch descriptors, the generation of each when armed): two lists, not a tuple a
        #: watch (~200 tuples made after `import torch` set off a collection of its objects)
        self.marks: tuple[list[int], list[int]] | None = None
        self.seen = -1
        events = self.owner = _shared()
        if events is None:
            return
        if planned is None:
            wanted = _masks(events, paths, folders, behind)
        else:
            wanted = _holders_added(dict(planned), events.file_mask, events.names_mask, native)
        with events.lock:
            if events is not _events:  # closed at exit while this waited for it: stat instead
                return
            events.drain()
            order = sorted(wanted)
            wds = events.arm_all(order, [wanted[path] for path in order], native)
            if wds is None:
                return
            generation = events.generation
            self.marks, self.seen = (wds, [generation[wd] for wd in wds]), events.seen

    def settle(self, witnesses: Sequence[tuple[str, Witness]]) -> Watch:
        """The witnesses the check found (the fallback's baseline)."""
        self.files = list(witnesses)
        return self

    def settle_later(self, witnesses: Callable[[], list[tuple[str, Witness]]]) -> Watch:
        """settle(), with the witnesses made only where the fallback is asked (a record's:
        hits/record.py)."""
        self._later = witnesses
        return self

    def unchanged(self) -> bool:
        events = _events
        if self.marks is not None and events is not None and events is self.owner:  # not a forked parent's
            with events.lock:
                if events is _events:  # not closed at exit while this waited for it
                    events.drain()
                    if events.seen == self.seen:
                        return True
                    generation = events.generation
                    return all(generation.get(wd) == g for wd, g in zip(*self.marks))
        if self.files is None and self._later is not None:
            self.files = self._later()
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
