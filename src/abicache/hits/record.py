"""A hit record on disk, and serving a call from it.

`<root>/v3/hits/<name>` (naming.py), written by writer.py with one rename:

    abicache-hit 4 <witnesses> <watched> <length of the text>\\n
    <4 x 64-bit integers a witness>
    <a 32-bit inotify mask a watched path>
    <text: NUL-separated: deadline, the store's real root, the file to load, its entry's
     folder, the names in that folder ('/'-separated), the seconds between last-use
     touches, the build seconds a hit saves, where the build's witnesses start (the
     in-process memo watches those, as it watches an Artifact's dependencies), the native
     check of the build's witnesses or nothing (native.py), what the GPU facts stand on or
     nothing (cuda_witness.py), one letter a witness, then a path a witness, then a path a
     watched path (the watch's plan: store/watch.py plan)>

A witness is a path and what to compare (os.stat's fields):
    l  lstat: inode, size, mtime, ctime (the store's files and folders: any write, chmod,
       chown, link or rename moves the ctime, which no one can set back; among the build's
       witnesses, each symbolic link met on the way to a k file: one put back is a new inode)
    s  stat: the same, through links (a compiler, a config file)
    f  lstat: the same, of a file the build read that no symbolic link leads to (a
       dependency, a system file); n the same, for a file with other hard links; k the
       same through a symbolic link, which it must still be. The in-process watch needs to
       know which files are reached through a link or another name (store/watch.py): the
       record says so, and the hit arms the watch before it checks a witness of the build.
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
import sys
import time
from stat import S_ISLNK, S_ISREG
from struct import Struct, unpack

from . import naming

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Mapping, Sequence

    from ..store.watch import Watch
    from .native import Native

#: the store's layout (store/layout.py LAYOUT_VERSION; tests/test_hits.py keeps them equal)
LAYOUT = "v3"
FOLDER = "hits"
#: a record's size at most (a build that read 10^4 headers: about 1 MiB)
MAX_BYTES = 8 << 20
_WITNESS = Struct("<4q")
_MASK = Struct("<I")
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_KINDS = frozenset(b"lsdtamcfnk")
#: the text's fields before the paths (encode)
_HEAD = 11
_ENCODING, _ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def folder(root: str) -> str:
    return os.path.join(root, LAYOUT, FOLDER)


def encode(deadline: float, root: str, file: str, entry: str, names: Sequence[str], touch: float, seconds: float,
           build: int, witnesses: Sequence[tuple[str, str, tuple[int, int, int, int]]], helper: str = "",
           plan: Sequence[tuple[str, int]] = (), gpu: str = "") -> bytes:
    """A record's bytes; witnesses: (kind letter, path, the four numbers); helper: witness.c
    built (native.py), or ""; plan: the watch of the build's witnesses (store/watch.py plan);
    gpu: what the GPU facts stand on (cuda_witness.py), or ""."""
    text = b"\0".join([repr(deadline).encode(), os.fsencode(root), os.fsencode(file), os.fsencode(entry),
                       _listing(names), repr(float(touch)).encode(), repr(float(seconds)).encode(), b"%d" % build,
                       os.fsencode(helper), gpu.encode(), "".join(k for k, _, _ in witnesses).encode(),
                       *(os.fsencode(p) for _, p, _ in witnesses), *(os.fsencode(p) for p, _ in plan)])
    numbers = b"".join(_WITNESS.pack(*w) for _, _, w in witnesses)
    masks = b"".join(_MASK.pack(m) for _, m in plan)
    return b"%s %d %d %d\n" % (naming.FORMAT, len(witnesses), len(plan), len(text)) + numbers + masks + text


class Served:
    """A record that held: the file to load, and whether it still holds later in this
    process (the in-process memo asks, as it asks an Artifact: current())."""

    __slots__ = ("file", "path", "root", "seconds", "_watched", "_plan", "_cwd", "_watch")

    def __init__(self, file: str, path: str, root: str, seconds: float, watched: Built,
                 plan: Mapping[str, int], watch: Watch | None = None) -> None:
        self.file, self.path, self.root, self.seconds = file, path, root, seconds
        self._watched = watched  # the witnesses of what the build read: what Artifact.current() asks
        self._plan = plan  # its watch's
        self._cwd = _cwd()
        self._watch = watch

    def warm(self) -> None:
        """Ask the watch once, as the process's next call will: the first ask's own costs
        (ctypes' first ioctl, its code run cold) fall on the call the record served, which
        costs milliseconds, not on the next one (issue 49: 10-20 us of the second call's ~50).
        Its verdict is the next call's to act on; a watch that fell back to stats (no inotify)
        is not asked: making its witnesses' tuples after `import torch` sets off a collection."""
        if self._watch is not None and self._watch.marks is not None:
            self._watch.unchanged()

    def unasked(self) -> bool:
        """As Artifact.unasked: a served call armed its watch, asked once (warm)."""
        return False

    def current(self) -> bool:
        """What an entry's in-process memo asks (core/artifact.py Artifact.current): whether
        the files its build read still hold, microseconds once asked (store/watch.py); and
        the working directory its name was made of. The memo compares the environment, the
        rest of the name, itself (cc.py _load_once: every entry holds the one it was made in)."""
        if _cwd() != self._cwd:
            return False
        if self._watch is not None and self._watch.unchanged():
            return True
        watch = _arm(self._plan)
        if not _hold(self._watched.items()):
            return False
        self._watch = _settled(watch, self._watched)
        return True


class Built:
    """The witnesses of what a record's build read, as the record holds them: made into a
    tuple each only where asked (the check in Python, the watch's stat fallback). ~600 tuples
    made after `import torch` set off a collection of its young objects: ~5 ms."""

    __slots__ = ("kinds", "paths", "numbers", "_items")

    def __init__(self, kinds: str, paths: list[str], numbers: bytes) -> None:
        self.kinds, self.paths, self.numbers = kinds, paths, numbers
        self._items: list[tuple[str, str, tuple[int, ...]]] | None = None

    def items(self) -> list[tuple[str, str, tuple[int, ...]]]:
        if self._items is None:
            self._items = list(zip(self.kinds, self.paths, _WITNESS.iter_unpack(self.numbers)))
        return self._items


def _arm(plan: Mapping[str, int], native: Native | None = None) -> Watch:
    """A watch of what the build read, armed by the call a record serves, so that the
    process's next call asks it in microseconds (issue 49: arming it there cost the second
    call 1.4 ms); armed before any of its witnesses is checked, so nothing slips between.
    The record holds its plan (store/watch.py plan: which paths for what, made by the writer
    from the witnesses, which say which files are links or have other names); native:
    native.py's arming, in one call, and its search for the folders holding links."""
    from ..store import watch

    return watch.Watch((), (), None, native, plan)


def _settled(watch: Watch, built: Built) -> Watch:
    """The stat fallback compares witnesses (where inotify is out of watches): a missing
    path has none, so a build that looked for one keeps no fallback."""
    if "m" not in built.kinds:  # what a stat through links compares: not a link's own (l) nor a folder's owner (t)
        watch.settle_later(lambda: [(p, w) for k, p, w in built.items() if k not in "lt"])
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
    magic, count, planned, length = head.rsplit(b" ", 3)
    n, p, size = int(count), int(planned), int(length)
    at = n * _WITNESS.size + p * _MASK.size
    if magic != naming.FORMAT or len(body) != at + size:
        return None
    numbers, masks = body[:n * _WITNESS.size], body[n * _WITNESS.size:at]
    fields = body[at:].split(b"\0", _HEAD)
    deadline, root, file, entry, names, touch, seconds, build, helper, gpu, kinds, blob = fields
    if len(kinds) != n or not _KINDS.issuperset(kinds) or os.fsdecode(root) != real:
        return None
    if time.time() >= float(deadline):
        return None  # the entry is due to be hashed in full again (its verify age): the full lookup does it
    if gpu:
        from . import cuda_witness  # GPU code's records only

        if not cuda_witness.holds(gpu.decode()):
            return None
    paths = blob.decode(_ENCODING, _ERRORS).split("\0")  # at once: os.fsdecode a path cost 4 ms a torch record
    if len(paths) != n + p:
        return None
    # a dict, not a tuple a path: ~200 objects fewer for the collector (a process that just
    # imported torch runs a ~3 ms collection of its objects after ~930 more)
    plan = dict(zip(paths[n:], unpack("<%dI" % p, masks)))
    folder, start = os.fsdecode(entry), int(build)
    stored_end = start * _WITNESS.size  # the store's witnesses' numbers end there, the build's begin
    built = Built(kinds[start:].decode(), paths[start:n], numbers[stored_end:])
    found = _native(os.fsdecode(helper), len(built.kinds))
    if found is None:
        stored = list(zip(kinds[:start].decode(), paths[:start], _WITNESS.iter_unpack(numbers[:stored_end])))
        if not _hold(stored) or _listing(os.listdir(folder)) != names:
            return None  # the store, the entry, the config files or the compiler moved: nothing armed for it
        watch = _arm(plan)  # before what the build read is checked: nothing slips between
        if not _hold(built.items()):
            return None
    else:
        held = (blob.rsplit(b"\0", p)[0] if p else blob) + b"\0"  # the witnesses' paths, each NUL-terminated
        cut = _after(held, start)
        if not found.hold(kinds[:start], held[:cut], numbers[:stored_end]) or \
                not _runtime(kinds[:start], paths, found) or _listing(os.listdir(folder)) != names:
            return None
        watch = _arm(plan, found)  # before what the build read is checked: nothing slips between
        if not found.hold(kinds[start:], held[cut:], built.numbers):  # checked once
            return None
    _touch(folder, float(touch))
    return Served(os.fsdecode(file), folder, real, float(seconds), built, plan, _settled(watch, built))


#: native.py WORTH, here so that a record too small for the native check imports nothing more
#: (tests/test_torch_hits.py keeps them equal)
_WORTH = 200


def _native(helper: str, count: int) -> Native | None:
    """native.py's calls, where the record names a library that may be loaded and has
    enough witnesses of its build for it to save time; None: checked in Python."""
    if not helper or count < _WORTH:
        return None
    from . import native

    return native.holder(helper)


def _after(blob: bytes, start: int) -> int:
    """Where the start-th path begins: the paths before it, each NUL-terminated (witness.c's
    paths), are blob[:_after(blob, start)]."""
    at = 0
    for _ in range(start):
        at = blob.index(b"\0", at) + 1
    return at


def _runtime(kinds: bytes, paths: Sequence[str], found: Native) -> bool:
    """The c witnesses' other half (the native check stats them): each names the C++ runtime
    this process loads."""
    if b"c" not in kinds:
        return True
    loaded = found.loaded(b"libstdc++.so.6")  # native/loaded.py LIBSTDCXX
    if loaded is None:
        from ..native.loaded import libstdcxx_path  # not loaded yet: it loads it, as a C++ library would

        loaded = libstdcxx_path()
    return all(paths[i] == loaded for i, k in enumerate(kinds) if k == 99)  # 99: b"c"


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
            elif kind in "fn":
                st = lstat(path)
                if S_ISLNK(st.st_mode):
                    return False
            elif kind == "k":
                if not S_ISLNK(lstat(path).st_mode):
                    return False
                st = stat(path)
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
