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
    from .vouch import Vouched

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

    __slots__ = ("file", "path", "root", "seconds", "_parsed", "_cwd", "_watch")

    def __init__(self, file: str, path: str, root: str, seconds: float, parsed: _Parsed,
                 watch: Watch | Vouched | None = None) -> None:
        self.file, self.path, self.root, self.seconds = file, path, root, seconds
        self._parsed = parsed  # the witnesses of what the build read, and their watch's plan: what current() asks
        self._cwd = _cwd()
        self._watch = watch

    def warm(self) -> None:
        """Ask the watch once, as the process's next call will: the first ask's own costs
        (ctypes' first ioctl, its code run cold) fall on the call the record served, which
        costs milliseconds, not on the next one (issue 49: 10-20 us of the second call's ~50).
        Its verdict is the next call's to act on; a watch that fell back to stats (no inotify)
        is not asked: making its witnesses' tuples after `import torch` sets off a collection."""
        if self._watch is not None and self._watch.marks is not None:  # the keeper's word (vouch.py): marks ()
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
        parsed = self._parsed
        if not parsed.decode():
            return False
        watch = _arm(parsed.plan)
        if not _hold(parsed.built.items()):
            return False
        self._watch = _settled(watch, parsed.built)
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
    got = read_identified(os.path.join(folder(real), record_name))
    if got is None:
        return None
    try:
        return _judge(got[0], real, record_name, got[1])
    except (ValueError, IndexError, OverflowError):
        return None  # not a record this abicache wrote: the full lookup writes one
    except OSError:
        return None  # the entry went while it was checked (gc): the full lookup


def read(path: str) -> bytes | None:
    """A record's bytes, if it is a regular file of this user that no one else may write."""
    got = read_identified(path)
    return None if got is None else got[0]


def read_identified(path: str) -> tuple[bytes, tuple[int, int, int, int]] | None:
    """read(), and the file's inode, size, mtime and ctime (what the keeper is asked of:
    keeper.py)."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022 or st.st_size > MAX_BYTES:
            return None
        return os.read(fd, st.st_size + 1), (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        return None
    finally:
        os.close(fd)


class _Parsed:
    """A record's parts, as _parse reads them (the module docstring's fields)."""

    __slots__ = ("n", "p", "numbers", "masks", "fields", "kinds", "paths", "plan", "start", "built")

    def __init__(self, n: int, p: int, numbers: bytes, masks: bytes, fields: list[bytes]) -> None:
        self.n, self.p, self.numbers, self.masks, self.fields = n, p, numbers, masks, fields
        self.kinds = fields[10]
        self.start = int(fields[7])
        self.paths: list[str] | None = None

    def decode(self) -> bool:
        """The paths, the plan and the build's witnesses, read (once); False where they do not add up."""
        if self.paths is not None:
            return True
        n, p = self.n, self.p
        paths = self.fields[11].decode(_ENCODING, _ERRORS).split("\0")  # at once: os.fsdecode a path cost 4 ms a torch record
        if len(paths) != n + p:
            return False
        # a dict, not a tuple a path: ~200 objects fewer for the collector (a process that just
        # imported torch runs a ~3 ms collection of its objects after ~930 more)
        self.plan = dict(zip(paths[n:], unpack("<%dI" % p, self.masks)))
        self.paths = paths
        start = self.start
        self.built = Built(self.kinds[start:].decode(), paths[start:n], self.numbers[start * _WITNESS.size:])
        return True

    def stored(self, only: str = "") -> list[tuple[str, str, tuple[int, ...]]]:
        """The store's witnesses (and the config files', the compiler's, the GPU facts'), as
        tuples; only: those of these kinds (no tuple made of the others: see Built)."""
        kinds, numbers = self.kinds[:self.start].decode(), self.numbers
        paths = self.paths if self.paths is not None else \
            self.fields[11].split(b"\0", self.start)[:self.start]  # the store's alone: the build's may not be read
        if not only:
            paths = [os.fsdecode(p) if type(p) is bytes else p for p in paths]
            return list(zip(kinds, paths, _WITNESS.iter_unpack(numbers[:self.start * _WITNESS.size])))
        return [(k, os.fsdecode(paths[i]), _WITNESS.unpack_from(numbers, i * _WITNESS.size))
                for i, k in enumerate(kinds) if k in only]

    def folder(self) -> str:
        """The entry's folder."""
        return os.fsdecode(self.fields[3])

    def held(self) -> bytes:
        """The witnesses' paths, each NUL-terminated (witness.c's)."""
        blob, p = self.fields[11], self.p
        return (blob.rsplit(b"\0", p)[0] if p else blob) + b"\0"


def _parse(data: bytes, real: str) -> _Parsed | None:
    """The record's parts, where it is one of this format and of this store; None otherwise."""
    head, _, body = data.partition(b"\n")
    magic, count, planned, length = head.rsplit(b" ", 3)
    n, p, size = int(count), int(planned), int(length)
    at = n * _WITNESS.size + p * _MASK.size
    if magic != naming.FORMAT or len(body) != at + size:
        return None
    fields = body[at:].split(b"\0", _HEAD)
    kinds, root = fields[10], fields[1]
    if len(kinds) != n or not _KINDS.issuperset(kinds) or os.fsdecode(root) != real:
        return None
    return _Parsed(n, p, body[:n * _WITNESS.size], body[n * _WITNESS.size:at], fields)


def parsed(data: bytes, real: str) -> _Parsed | None:
    """A record's parts, its paths read (what the keeper watches: keeper.py); None where it is
    not one of this format and store."""
    got = _parse(data, real)
    return got if got is not None and got.decode() else None


def _judge(data: bytes, real: str, record_name: str = "", identity: tuple[int, int, int, int] = (0, 0, 0, 0)
           ) -> Served | None:
    parsed = _parse(data, real)
    if parsed is None:
        return None
    deadline, _, file, entry, names, touch, seconds, _, helper, gpu = parsed.fields[:10]
    if time.time() >= float(deadline):
        return None  # the entry is due to be hashed in full again (its verify age): the full lookup does it
    if gpu:
        from . import cuda_witness  # GPU code's records only

        if not cuda_witness.holds(gpu.decode()):
            return None
    folder, count = os.fsdecode(entry), parsed.n - parsed.start
    large = helper and count >= _WORTH
    if large and record_name:  # the keeper's word, where one keeps the record (vouch.py): the build's
        from . import vouch  # paths are then read only where this process's watch is needed (Served.current)

        vouched = vouch.ask(real, record_name, identity) if vouch.wanted() else None
        if vouched is not None:  # it vouched for all but what this process alone can check: the
            if not _hold(parsed.stored("tc")):  # folders' owners and modes, the C++ runtime it loads
                return None
            _touch(folder, float(touch))
            return Served(os.fsdecode(file), folder, real, float(seconds), parsed, vouched)
    if not parsed.decode():
        return None
    kinds, paths, start, built, plan = parsed.kinds, parsed.paths, parsed.start, parsed.built, parsed.plan
    found = _native(os.fsdecode(helper), count) if large else None
    if found is None:
        if not _hold(parsed.stored()) or _listing(os.listdir(folder)) != names:
            return None  # the store, the entry, the config files or the compiler moved: nothing armed for it
        watch = _arm(plan)  # before what the build read is checked: nothing slips between
        if not _hold(built.items()):
            return None
    else:
        held = parsed.held()  # the witnesses' paths, each NUL-terminated
        cut = _after(held, start)
        stored_end = start * _WITNESS.size
        if not found.hold(kinds[:start], held[:cut], parsed.numbers[:stored_end]) or \
                not _runtime(kinds[:start], paths, found) or _listing(os.listdir(folder)) != names:
            return None
        watch = _arm(plan, found)  # before what the build read is checked: nothing slips between
        if not found.hold(kinds[start:], held[cut:], built.numbers):  # checked once
            return None
    _touch(folder, float(touch))
    return Served(os.fsdecode(file), folder, real, float(seconds), parsed, _settled(watch, built))


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


def _runs(path: str) -> bool:
    """Whether the C++ runtime this process loads (or loaded already: a library brought in first
    is the one it keeps; not loaded yet, it loads it, as a C++ library would) is the file at
    path: the dynamic loader's own answer, two dlopen calls (the library by its soname, and
    that file only if it is loaded: the same handle where it is the same file). Asking which
    file it is (native/loaded.py, through dlinfo) imported two modules on a hit: ~0.3 ms."""
    import ctypes
    from _ctypes import dlopen

    try:
        loaded = dlopen("libstdc++.so.6", ctypes.DEFAULT_MODE)  # native/loaded.py LIBSTDCXX
        return dlopen(path, ctypes.DEFAULT_MODE | os.RTLD_NOLOAD) == loaded
    except (OSError, AttributeError):  # none of that file loaded, or no dynamic loader to ask
        return False


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
                if not _runs(path):
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
