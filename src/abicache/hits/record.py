"""A hit record's format, its writing, and the check a process makes of one itself.

`<root>/v3/hits/<name>` (hits/__init__.py name), written by writer.py with one rename:

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

Reading and judging a record is the package's own (hits/__init__.py (the hit path: all a served call runs); here is
what a hit runs only where no keeper vouched for the record: the check of its witnesses by
this process (check), in one native call where the record names the helper (native.py), and
the watch of what the build read, armed before that check.
"""

from __future__ import annotations

import os
import sys
from stat import S_ISLNK
from struct import unpack

from . import _MASK, _WITNESS, _WORTH, FORMAT, _loaded, _own, _parse, read_identified

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

    from ..store.watch import Watch
    from .native import Native
    from . import _Parsed

_ENCODING, _ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


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
    return b"%s %d %d %d\n" % (FORMAT, len(witnesses), len(plan), len(text)) + numbers + masks + text


def check(parsed: _Parsed, folder: str, names: bytes, helper: str) -> Watch | None:
    """The record's witnesses, checked by this process (in one native call each where helper
    names the native check: native.py), with the watch of what its build read armed before
    that build's are: the watch, or None where one moved (the store, the entry, the config
    files or the compiler: nothing is armed for them)."""
    if not decode(parsed):
        return None
    kinds, paths, start, built, plan = parsed.kinds, parsed.paths, parsed.start, parsed.built, parsed.plan
    found = _native(helper, parsed.n - start)
    if found is None:
        if not _hold(parsed.stored()) or _listing(os.listdir(folder)) != names:
            return None
        watch = _arm(plan)  # before what the build read is checked: nothing slips between
        return _settled(watch, built) if _hold(built.items()) else None
    paths_held = held_paths(parsed)  # the witnesses' paths, each NUL-terminated
    cut = _after(paths_held, start)
    if not found.hold(kinds[:start], paths_held[:cut], numbers(parsed, 0, start)) or \
            not _runtime(kinds[:start], paths, found) or _listing(os.listdir(folder)) != names:
        return None
    watch = _arm(plan, found)  # before what the build read is checked: nothing slips between
    if not found.hold(kinds[start:], paths_held[cut:], built.numbers):  # checked once
        return None
    return _settled(watch, built)


def rewatched(parsed: _Parsed) -> Watch | None:
    """What Served.current asks where its watch saw a change (or the keeper's word lapsed):
    the build's witnesses watched again, then checked; None where one moved."""
    if not decode(parsed):
        return None
    watch = _arm(parsed.plan)
    return _settled(watch, parsed.built) if _hold(parsed.built.items()) else None


def read(path: str) -> bytes | None:
    """A record's bytes, if it is a regular file of this user that no one else may write."""
    got = read_identified(path)
    return None if got is None else got[0]


def recorded(memo: tuple[Any, ...], held: tuple[Any, Any, Any], serve: Callable[..., Any]) -> bool:
    """The second call of a process whose first took the full lookup (no record held then):
    the record that lookup wrote, if it holds and names the entry loaded, stands for it, checked
    and its watch armed in one native call each, as a served call's are (issue 49: asking the
    full lookup's own witnesses in Python cost this call 2 ms for a C library, 10 ms for a
    torch extension). Asked once: otherwise the full lookup's witnesses answer, as before."""
    got = serve(False)
    if got is None or got[0].path != os.path.realpath(held[0].path):
        return False  # none written (a build's witnesses too young: at exit), or another entry's
    got[0].warm()
    _loaded[memo] = (got[0], held[1], held[2])
    return True


def numbers(parsed: _Parsed, first: int = 0, last: int | None = None) -> bytes:
    """The numbers of the record's witnesses from the first-th to the last-th (all: to the end)."""
    at, size = parsed.at, _WITNESS.size
    return parsed.data[at + first * size:at + (parsed.n if last is None else last) * size]


def parsed(data: bytes, real: str) -> _Parsed | None:
    """A record's parts, its paths read (what the keeper watches: keeper.py); None where it is
    not one of this format and store."""
    got = _parse(data, real)
    return got if got is not None and decode(got) else None


def decode(parsed: _Parsed) -> bool:
    """The record's paths, the plan and the build's witnesses, read into it (once); False
    where they do not add up."""
    if parsed.paths is not None:
        return True
    n, p, data = parsed.n, parsed.p, parsed.data
    # at once: os.fsdecode a path at a time cost 4 ms a torch record
    paths = data[parsed.text:].decode(_ENCODING, _ERRORS).split("\0")
    if len(paths) != n + p:
        return False
    # a dict, not a tuple a path: ~200 objects fewer for the collector (a process that just
    # imported torch runs a ~3 ms collection of its objects after ~930 more)
    masks = parsed.at + n * _WITNESS.size
    parsed.plan = dict(zip(paths[n:], unpack("<%dI" % p, data[masks:masks + p * _MASK.size])))
    parsed.paths = paths
    start = parsed.start
    parsed.built = Built(parsed.kinds[start:].decode(), paths[start:n], numbers(parsed, start))
    return True


def held_paths(parsed: _Parsed) -> bytes:
    """The witnesses' paths, each NUL-terminated (witness.c's)."""
    blob, p = parsed.data[parsed.text:], parsed.p
    return (blob.rsplit(b"\0", p)[0] if p else blob) + b"\0"


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
            elif kind in "tc":  # what only the asker checks, where a keeper vouches for the rest
                if not _own(((kind, path, w),)):
                    return False
                continue
            elif kind in "am":
                lstat(path)
                return False
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


def _listing(names: Sequence[str]) -> bytes:
    return os.fsencode("/".join(sorted(names)))
