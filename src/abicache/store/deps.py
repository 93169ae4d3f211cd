"""Whether the files an entry was compiled from still hold the bytes recorded
in its manifest (its dependencies: project headers and the like).

A dependency names a base ("src", "inc0", ...) and a path inside it; the
caller says where each base is now, so the check does not depend on where the
project is checked out. A file is current if it hashes to the recorded
sha256. Hashing is avoided with witnesses, as in ninja and ccache's direct
mode: (inode, size, mtime, ctime) of a file when it last hashed to a known
digest, remembered in this process and in the entry's stamp (stamps.py) for
the next one. So a hit stats each dependency and hashes only those whose
witness changed; a witness younger than stamps.RACY_SECONDS is never trusted
(an edit in the same clock tick could leave it unchanged).

The common hit changes nothing: `summary` digests the witnesses of all
dependencies at once, and a summary the entry's stamp holds (written only
when each of them was found current and settled) vouches for them all, with
one stat per file and no per-file bookkeeping. The witness includes the
ctime, which no write can leave unchanged nor set back, so a summary never
matches again once a file was touched in any way.
"""

from __future__ import annotations

import operator
import os
import stat
import time
from array import array

from . import blobs, stamps
from ..values.digest import blake2b, sha256_hex
from .manifest import LISTING, UNSET, Absent, Dependency, System, system_digest

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Callable, Mapping, Sequence

    from .watch import Watch

Witness = tuple[int, int, int, int]  # (inode, size, mtime_ns, ctime_ns)

#: absolute path -> (witness, sha256) of files hashed in this process
_known: dict[str, tuple[Witness, str]] = {}


def resolve(dep: Dependency, bases: Mapping[str, str]) -> str | None:
    """The file a dependency names here, or None if its base is not given."""
    if dep.base == "abs":
        return dep.path
    root = bases.get(dep.base)
    return None if root is None else os.path.join(root, dep.path)


#: a file's witness, its four fields taken in C: a hit takes hundreds
witness: Callable[[os.stat_result], Witness] = operator.attrgetter("st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")


def _settled(w: Witness, seen_ns: int | None = None) -> bool:
    seen = time.time_ns() if seen_ns is None else seen_ns
    return stamps.settled(w[2], seen) and stamps.settled(w[3], seen)


def digest(path: str, w: Witness, remembered: Mapping[str, Sequence[int]], recorded: str,
           seen_ns: int | None = None) -> str:
    """The file's sha256 (a folder's: its listing's), from a witness where one vouches for it."""
    known = _known.get(path)
    if known is not None and known[0] == w:
        return known[1]
    if remembered.get(path) == [*w]:  # the stamp (JSON lists): at this witness it held `recorded`
        return recorded
    sha = listing_digest(path) if recorded.startswith(LISTING) else blobs.hash_file(path)[0]  # type: ignore[arg-type]
    if _settled(w, seen_ns):
        _known[path] = (w, sha)
    return sha


def listing_digest(folder: str) -> str:
    """What a tool that lists the folder sees: its names (as bytes), sorted. Any name created,
    removed or renamed there moves the folder's witness too, so a lookup lists it only then."""
    names = sorted(os.listdir(os.fsencode(folder)))
    return LISTING + sha256_hex(b"\0".join(names))


def env_digest(name: str) -> str:
    value = os.environ.get(name)
    return UNSET if value is None else sha256_hex(os.fsencode(value))


def env_changed(env: Sequence[tuple[str, str]]) -> Dependency | None:
    for name, digest in env:
        if env_digest(name) != digest:
            return Dependency("env", name, digest)
    return None


def absent_changed(absent: Sequence[Absent], bases: Mapping[str, str],
                   current: dict[str, Witness], seen: int,
                   remembered: Mapping[str, Sequence[int]] = {}) -> Dependency | None:
    """The first missing path that could be there now (as a Dependency with sha256
    "absent"), or None; the folders' settled witnesses go into current. A folder at the
    witness at which its names were last found missing (remembered) is not looked into:
    nothing was created, removed or renamed in it since."""
    for group in absent:
        folder = resolve(Dependency(group.base, group.folder, ""), bases)
        if folder is None:
            return Dependency(group.base, group.folder, "absent")
        try:
            st = os.stat(folder)
        except OSError:
            return Dependency(group.base, group.folder, "absent")  # moved away: look again by building
        w = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if remembered.get(folder) != [*w]:
            appeared = _appeared(folder, group.paths())
            if appeared is not None:
                return Dependency(group.base, f"{group.folder}/{appeared}", "absent")
        if _settled(w, seen) and os.stat(folder).st_ctime_ns == st.st_ctime_ns:
            current[folder] = w
    return None


def _appeared(folder: str, names: Sequence[str]) -> str | None:
    """The first name that is, or may now be, below folder. A name is grouped under the
    nearest folder that existed (record.py), so a name "ATen/core/x.h" under it means no
    folder "ATen" was there: one stat of each first part answers for all the names below it
    (thousands of torch headers looked for in a project's include folder first). Where one
    became a folder, the names are recorded again by building (never a stale hit)."""
    parts: dict[str, bool] = {}
    for name in names:
        head, below, _ = name.partition("/")
        if not below:
            if _exists(os.path.join(folder, name)):
                return name
            continue
        found = parts.get(head)
        if found is None:
            found = parts[head] = os.path.isdir(os.path.join(folder, head))
        if found:
            return name
    return None


def _exists(path: str) -> bool:
    """As the compiler's open() would find it: through links (a dangling one is missing)."""
    try:
        os.stat(path)
    except OSError:
        return False
    return True


def system_changed(system: Sequence[System], remembered: Mapping[str, Sequence[int]],
                   current: dict[str, Witness], seen: int) -> Dependency | None:
    """The first system group whose files changed (as Dependency("abs", folder,
    "system")), or None. A group whose files all stand at the witnesses they were
    found current at is current (a package manager renames files into place; a
    rewrite in place, `cp` or `cat >` as root, moves only the file's own change
    time: the folder's alone was trusted once, and served the old build); else
    every file is hashed (after a package upgrade: once) and the group's digest
    compared."""
    for group in system:
        try:
            folder = witness(os.stat(group.folder))
            found = [(path, witness(os.stat(path))) for path in group.paths()]
        except OSError:
            return Dependency("abs", group.folder, "system")
        # remembered: the witnesses at which this group was found current (the stamp); else the
        # digest, of shas this process knows at these witnesses (a build just hashed them) or hashes
        known = all(remembered.get(path) == [*w] for path, w in found)
        if not known:
            names = group.names.split("\n")
            shas = [_known_sha(path, w) for path, w in found]
            if system_digest(names, shas) != group.sha256:
                return Dependency("abs", group.folder, "system")
        for path, w in [(group.folder, folder), *found]:
            if _settled(w, seen):
                current[path] = w
    return None


def _known_sha(path: str, w: Witness) -> str:
    known = _known.get(path)
    if known is not None and known[0] == w:
        return known[1]
    sha, _ = blobs.hash_file(path)  # type: ignore[arg-type]
    if _settled(w):
        _known[path] = (w, sha)
    return sha


def first_changed(deps: Sequence[Dependency], bases: Mapping[str, str],
                  remembered: Mapping[str, Sequence[int]] = {}, absent: Sequence[Absent] = (),
                  env: Sequence[tuple[str, str]] = (),
                  system: Sequence[System] = ()) -> tuple[Dependency | None, dict[str, Witness]]:
    """(the first dependency whose file changed or is gone, a missing path
    that appeared or a variable whose value changed, or None; the settled
    witnesses of the files and folders found current, to remember)."""
    current: dict[str, Witness] = {}
    seen = time.time_ns()  # before any stat: witnesses are judged against it
    changed = env_changed(env) or absent_changed(absent, bases, current, seen, remembered) \
        or system_changed(system, remembered, current, seen)
    if changed is not None:
        return changed, current
    roots = {name: root.rstrip("/") + "/" for name, root in bases.items()}  # resolve(), without a join per file
    for dep in deps:
        root = roots.get(dep.base)
        path = root + dep.path if root is not None else resolve(dep, bases)
        if path is None:
            return dep, current
        try:
            st = os.stat(path)
        except OSError:
            return dep, current
        if not (stat.S_ISDIR(st.st_mode) if dep.sha256.startswith(LISTING) else stat.S_ISREG(st.st_mode)):
            return dep, current  # never read a device or a pipe in its place
        w = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if digest(path, w, remembered, dep.sha256, seen) != dep.sha256:
            return dep, current
        if _settled(w, seen):
            current[path] = w
    return None, current


#: where package managers write: files read there are recorded as one System group a
#: folder (record.py), one digest for the group, each file witnessed by its own stat.
#: /usr/local is the user's; so is /opt (conda prefixes, vendor SDKs and toolkits that
#: people edit and copy over): files there are dependencies one by one.
SYSTEM = ("/usr/", "/lib/", "/lib64/", "/lib32/", "/bin/", "/sbin/")
_USER = ("/usr/local/",)


def is_system(path: str) -> bool:
    return path.startswith(SYSTEM) and not path.startswith(_USER)


def _system_files(system: Sequence[System]) -> dict[str, list[str]]:
    """Each system folder's files, each once (the steps of a build, compile and link,
    record a folder each: the compiler's own files would be stat'ed twice)."""
    files: dict[str, list[str]] = {}
    for group in system:
        names = group.names.split("\n")
        if group.folder in files:
            names = list(dict.fromkeys(files[group.folder] + names))
        files[group.folder] = names
    return files


def summary(deps: Sequence[Dependency], bases: Mapping[str, str],
            current: Mapping[str, Witness] | None = None, absent: Sequence[Absent] = (),
            env: Sequence[tuple[str, str]] = (), system: Sequence[System] = ()) -> str | None:
    """A digest of the bases, of every dependency's witness, every system
    file's and missing path's folder's, and of the variables read, from
    fresh stats or from `current` (first_changed's settled witnesses); None
    where a file is missing or, from `current`, was not settled. A system
    group is its files (a rewrite in place moves only the file; a file renamed
    into place is another inode); a missing path's folder stands for the
    paths under it."""
    witnessed = [*deps, *dict.fromkeys(Dependency(a.base, a.folder, "") for a in absent)]  # one stat a folder
    files = _system_files(system)
    if current is None:
        flat = _stat_all(witnessed, bases)
        more = _stat_system(files) if flat is not None else None
    else:
        flat = _from_current(witnessed, bases, current)
        more = _system_from_current(files, current) if flat is not None else None
    if flat is None or more is None:
        return None
    digest = blake2b(repr(sorted(bases.items())).encode(), digest_size=16)
    if env:
        digest.update("\0".join(env_digest(name) for name, _ in env).encode())
    try:
        digest.update(array("q", flat + more).tobytes())
    except OverflowError:  # an inode number above 2**63
        digest.update(repr(flat + more).encode())
    return digest.hexdigest()


def _from_current(deps: Sequence[Dependency], bases: Mapping[str, str],
                  current: Mapping[str, Witness]) -> list[int] | None:
    flat: list[int] = []
    for dep in deps:
        path = resolve(dep, bases)
        w = None if path is None else current.get(path)
        if w is None:
            return None
        flat += w
    return flat


def _system_from_current(files: Mapping[str, Sequence[str]], current: Mapping[str, Witness]) -> list[int] | None:
    flat: list[int] = []
    for folder, names in files.items():
        for name in names:
            w = current.get(f"{folder}/{name}")
            if w is None:
                return None
            flat += w
    return flat


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_AT = os.stat in os.supports_dir_fd


def _stat_all(deps: Sequence[Dependency], bases: Mapping[str, str]) -> list[int] | None:
    """Every dependency's witness, flattened; None if one is missing. Where the
    platform allows, each file is stat'ed relative to its base folder, opened
    once: the kernel walks two path parts, not ten (a fifth of a hit's time)."""
    if not _AT:
        paths = [resolve(dep, bases) for dep in deps]
        try:
            return _from_current(deps, bases, {p: witness(os.stat(p)) for p in paths if p is not None})
        except OSError:
            return None
    folders: dict[str, int] = {}
    flat: list[int] = []
    stat_, witness_ = os.stat, witness
    try:
        for base, path, _ in deps:
            if base == "abs":
                flat += witness_(stat_(path))
                continue
            fd = folders.get(base)
            if fd is None:
                root = bases.get(base)
                if root is None:
                    return None
                fd = folders[base] = os.open(root, _DIR_FLAGS)
            flat += witness_(stat_(path, dir_fd=fd))
    except OSError:
        return None
    finally:
        for fd in folders.values():
            os.close(fd)
    return flat


def _stat_system(files: Mapping[str, Sequence[str]]) -> list[int] | None:
    """The system files' witnesses, flattened, in _system_from_current's order; a
    folder with a few files or more is opened once and its files stat'ed in it."""
    flat: list[int] = []
    for folder, names in files.items():
        fd = os.open(folder, _DIR_FLAGS) if _AT and len(names) >= _OPEN_FOLDER_FROM else None
        try:
            if fd is not None:
                for name in names:
                    flat += witness(os.stat(name, dir_fd=fd))
            else:
                for name in names:
                    flat += witness(os.stat(f"{folder}/{name}"))
        except OSError:
            return None
        finally:
            if fd is not None:
                os.close(fd)
    return flat


#: a system folder is opened (and its files stat'ed relative to it) from this many files on
_OPEN_FOLDER_FROM = 4


class Current:
    """Whether an entry's dependencies still hold their bytes, asked again and
    again in one process (the in-process memos): the first call checks them
    and arms a Watch; later calls ask the Watch, and check again only when it
    saw something (a touch is not a change: still current)."""

    __slots__ = ("deps", "bases", "watch", "absent", "env", "system", "names", "values", "recall", "asked")

    def __init__(self, deps: Sequence[Dependency], bases: Mapping[str, str], absent: Sequence[Absent] = (),
                 env: Sequence[tuple[str, str]] = (), system: Sequence[System] = (),
                 recall: Callable[[], Mapping[str, Sequence[int]]] | None = None) -> None:
        """recall: the witnesses at which the entry's files were found current (its stamp),
        which vouch for them as they do for a lookup: arming the watch hashes nothing a
        lookup would not (it hashed the entry's system files: 58 ms on a second call)."""
        self.deps, self.bases, self.absent, self.env, self.system = deps, bases, absent, env, system
        self.recall = recall
        self.watch: Watch | None = None
        # the variables' raw values when last found current: compared as they are, not hashed again
        self.names = tuple(map(os.environ.encodekey, (name for name, _ in env)))  # type: ignore[attr-defined]
        self.values: tuple[object, ...] | None = None
        self.asked = False  # by a call, or by hits/record.py recorded in its place

    def _values(self) -> tuple[object, ...]:
        return tuple(map(os.environ._data.get, self.names))  # type: ignore[attr-defined]

    def __call__(self) -> bool:
        self.asked = True
        if self.watch is not None and self.watch.unchanged() and (not self.names or self._values() == self.values):
            return True
        values = self._values()
        remembered = self.recall() if self.recall is not None else {}
        changed, _, self.watch = watched(self.deps, self.bases, remembered, self.absent, self.env, self.system)
        self.values = values if changed is None else None
        return changed is None


def watched(deps: Sequence[Dependency], bases: Mapping[str, str],
            remembered: Mapping[str, Sequence[int]] = {}, absent: Sequence[Absent] = (),
            env: Sequence[tuple[str, str]] = (),
            system: Sequence[System] = ()) -> tuple[Dependency | None, dict[str, Witness], Watch | None]:
    """first_changed, and when all are current a Watch that says cheaply
    whether they still are (armed before the check: nothing slips between).
    The folders of missing paths are watched too: a file created there moves them."""
    roots = {name: root.rstrip("/") + "/" for name, root in bases.items()}  # first_changed's spelling, a join less a file
    paths = [d.path if d.base == "abs" else roots[d.base] + d.path for d in deps if d.base == "abs" or d.base in roots]
    folders = [p for p in (resolve(Dependency(a.base, a.folder, ""), bases) for a in absent) if p is not None]
    folders += [g.folder for g in system]  # a package upgrade renames files into it
    paths += [f"{folder}/{name}" for folder, names in _system_files(system).items() for name in names]  # as System.paths
    folders += [p for d in deps if d.sha256.startswith(LISTING) and (p := resolve(d, bases)) is not None]
    from .watch import Watch  # a process's second call: its first hit has no use for it

    watch = Watch(paths, folders)
    changed, current = first_changed(deps, bases, remembered, absent, env, system)
    if changed is not None:
        return changed, current, None
    if all(p in current for p in (*paths, *folders)):  # every witness settled: the stat fallback is sound too
        watch.settle(list(current.items()))
    return None, current, watch


def learn(path: str, w: Witness, sha: str) -> None:
    """A file just hashed at w (for a build's record): the check right after the
    build need not hash it again."""
    if _settled(w):
        _known[path] = (w, sha)


def forget() -> None:
    """Drop what this process remembers (tests)."""
    _known.clear()
