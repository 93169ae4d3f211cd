"""A hit record on disk, and serving a call from it.

`<root>/v3/hits/<name>` (naming.py), written by writer.py with one rename:

    abicache-hit 1 <witnesses> <length of the text>\\n
    <4 x 64-bit integers a witness>
    <text: NUL-separated: deadline, the store's real root, the file to load, its entry's
     folder, the names in that folder ('/'-separated), the seconds between last-use
     touches, the build seconds a hit saves, where the build's witnesses start (the
     in-process memo watches those, as it watches an Artifact's dependencies), one letter
     a witness, then a path a witness>

A witness is a path and what to compare (os.stat's fields):
    l  lstat: inode, size, mtime, ctime (the store's files and folders: any write, chmod,
       chown, link or rename moves the ctime, which no one can set back)
    s  stat: the same, through links (a dependency, a system file, a compiler)
    d  stat of a folder whose names a lookup relied on (missing paths, a listing): a name
       created, removed or renamed there moves its mtime
    t  lstat: inode, mode, owner and group (a folder above the store: whom it trusts, not
       when it last changed)
    a  lstat fails: nothing there, not even a link
    m  the same, for a path the build looked for and did not find (its folder is watched
       for names later in the process, as store/deps.py's missing paths are)
    c  the C++ runtime this process loads is this file (native/loaded.py), as stat'ed:
       what platform.glibcxx and platform.cxxabi were read from

The entry's folder is witnessed by its owner and mode (t) and its names: a use touches
its mtime (the last use gc evicts by), which a served hit does as a full lookup would,
every touch interval, without making the record stale.

A record is read only if it is a regular file of this user that no one else may write
(as every file a hit uses); one whose root is not where the store resolves now, whose
deadline passed, or whose witnesses moved serves nothing.
"""

from __future__ import annotations

import os
import time
from stat import S_ISREG
from struct import Struct

from . import naming

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Sequence

    from ..store.watch import Watch

#: the store's layout (store/layout.py LAYOUT_VERSION; tests/test_hits.py keeps them equal)
LAYOUT = "v3"
FOLDER = "hits"
#: a record's size at most (a build that read 10^4 headers: about 1 MiB)
MAX_BYTES = 8 << 20
_WITNESS = Struct("<4q")
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_KINDS = frozenset(b"lsdtamc")


def folder(root: str) -> str:
    return os.path.join(root, LAYOUT, FOLDER)


def encode(deadline: float, root: str, file: str, entry: str, names: Sequence[str], touch: float, seconds: float,
           build: int, witnesses: Sequence[tuple[str, str, tuple[int, int, int, int]]]) -> bytes:
    """A record's bytes; witnesses: (kind letter, path, the four numbers)."""
    text = b"\0".join([repr(deadline).encode(), os.fsencode(root), os.fsencode(file), os.fsencode(entry),
                       _listing(names), repr(float(touch)).encode(), repr(float(seconds)).encode(), b"%d" % build,
                       "".join(k for k, _, _ in witnesses).encode(),
                       *(os.fsencode(p) for _, p, _ in witnesses)])
    numbers = b"".join(_WITNESS.pack(*w) for _, _, w in witnesses)
    return b"%s %d %d\n" % (naming.FORMAT, len(witnesses), len(text)) + numbers + text


class Served:
    """A record that held: the file to load, and whether it still holds later in this
    process (the in-process memo asks, as it asks an Artifact: current())."""

    __slots__ = ("file", "path", "root", "seconds", "_watched", "_env", "_cwd", "_watch")

    def __init__(self, file: str, path: str, root: str, seconds: float,
                 watched: list[tuple[str, str, tuple[int, ...]]], watch: Watch | None = None) -> None:
        self.file, self.path, self.root, self.seconds = file, path, root, seconds
        self._watched = watched  # the witnesses of what the build read: what Artifact.current() asks
        self._env, self._cwd = naming.environment(), _cwd()
        self._watch = watch

    def current(self) -> bool:
        """What an entry's in-process memo asks (core/artifact.py Artifact.current): whether
        the files its build read still hold, microseconds once asked (store/watch.py); and
        the environment and working directory its name was made of."""
        if not naming.same_environment(self._env) or _cwd() != self._cwd:
            return False
        if self._watch is not None and self._watch.unchanged():
            return True
        watch = _arm(self._watched)
        if not _hold(self._watched):
            return False
        self._watch = _settled(watch, self._watched)
        return True


def _arm(watched: Sequence[tuple[str, str, tuple[int, ...]]]) -> Watch:
    """A watch of what the build read, armed before its witnesses are checked (nothing slips
    between): armed by the call a record serves, so that the process's next call asks it in
    microseconds (issue 49: arming it there cost the second call 1.4 ms)."""
    from ..store.watch import Watch

    files = [p for k, p, _ in watched if k == "s"]
    folders = {*(p for k, p, _ in watched if k == "d"), *(os.path.dirname(p) for k, p, _ in watched if k == "m")}
    return Watch(files, sorted(folders))


def _settled(watch: Watch, watched: Sequence[tuple[str, str, tuple[int, ...]]]) -> Watch:
    """The stat fallback compares witnesses (where inotify is out of watches): a missing
    path has none, so a build that looked for one keeps no fallback."""
    if all(k != "m" for k, _, _ in watched):
        watch.settle([(p, w) for _, p, w in watched])  # type: ignore[misc]
    return watch


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None  # removed: the full lookup says what that means


def serve(call: bytes, root: str) -> Served | None:
    """The record of this call in this store, if there is one and it holds now."""
    record_name = naming.name(call, root)
    if record_name is None:
        return None
    real = os.path.realpath(root)
    data = read(os.path.join(folder(real), record_name))
    if data is None:
        return None
    try:
        return _judge(data, real)
    except (ValueError, IndexError, OverflowError):
        return None  # not a record this abicache wrote: the full lookup writes one
    except OSError:
        return None  # the entry went while it was checked (gc): the full lookup


def read(path: str) -> bytes | None:
    """A record's bytes, if it is a regular file of this user that no one else may write."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022 or st.st_size > MAX_BYTES:
            return None
        return os.read(fd, st.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _judge(data: bytes, real: str) -> Served | None:
    head, _, body = data.partition(b"\n")
    magic, count, length = head.rsplit(b" ", 2)
    n, size = int(count), int(length)
    if magic != naming.FORMAT or len(body) != n * _WITNESS.size + size:
        return None
    numbers = _WITNESS.iter_unpack(body[:n * _WITNESS.size])
    fields = body[n * _WITNESS.size:].split(b"\0")
    deadline, root, file, entry, names, touch, seconds, build, kinds = fields[:9]
    paths = fields[9:]
    if len(paths) != n or len(kinds) != n or not _KINDS.issuperset(kinds) or os.fsdecode(root) != real:
        return None
    if time.time() >= float(deadline):
        return None  # the entry is due to be hashed in full again (its verify age): the full lookup does it
    witnesses = [(chr(k), os.fsdecode(p), w) for k, p, w in zip(kinds, paths, numbers)]
    folder = os.fsdecode(entry)
    stored, watched = witnesses[:int(build)], witnesses[int(build):]
    if not _hold(stored) or _listing(os.listdir(folder)) != names:
        return None  # the store, the entry, the config files or the compiler moved: nothing armed for it
    watch = _arm(watched)  # before what the build read is checked: nothing slips between
    if not _hold(watched):
        return None
    _touch(folder, float(touch))
    return Served(os.fsdecode(file), os.fsdecode(entry), real, float(seconds), watched, _settled(watch, watched))


def _listing(names: Sequence[str]) -> bytes:
    return os.fsencode("/".join(sorted(names)))


def _touch(folder: str, interval: float) -> None:
    """A use of the entry, at most once per interval (store/local.py Store.touch)."""
    try:
        if time.time() - os.stat(folder).st_mtime >= interval:
            os.utime(folder)
    except OSError:
        pass  # a read-only or shared store still serves hits


def _hold(witnesses: Sequence[tuple[str, str, tuple[int, ...]]]) -> bool:
    """Whether every witness stands as recorded (module docstring)."""
    stat, lstat = os.stat, os.lstat
    for kind, path, w in witnesses:
        try:
            if kind == "l":
                st = lstat(path)
            elif kind == "t":
                st = lstat(path)
                if (st.st_ino, st.st_mode, st.st_uid, st.st_gid) != w:
                    return False
                continue
            elif kind in "am":
                lstat(path)
                return False
            elif kind == "c":
                from ..native.loaded import libstdcxx_path  # a C++ library's: it loads libstdc++ anyway

                if libstdcxx_path() != path:
                    return False
                st = stat(path)
            else:
                st = stat(path)
        except (FileNotFoundError, NotADirectoryError):
            if kind in "am":
                continue
            return False
        except OSError:
            return False
        if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != w:
            return False
    return True
