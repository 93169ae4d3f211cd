"""Stamps: proof that a variant's files still hold the bytes last hashed,
checked on every hit without reading them.

When a hit hashes a file and finds it matches its manifest, we record the
file's inode, size and ctime in the variant's stamp. Every later hit
compares them with a fresh lstat; any difference means a full re-hash of
that file. ctime is the right witness: every write, truncate, chmod, chown,
link or rename of an inode sets it to the current time, and no user (root
included, short of changing the clock or the raw disk) can set it back. So
an in-place edit of a blob, even one that restores the size, mode and mtime,
always changes the ctime and is caught at the next lookup.

Two details make this sound:
- Racy stamps (as git's racy-index rule): a ctime too close to the moment
  it was seen is not recorded, since a later write within the same clock
  tick could leave it unchanged; such a file is re-hashed on the next hit
  instead. "Too close" is FINE_SECONDS where timestamps have nanoseconds (the
  kernel's timestamp clock ticks at least every 10 ms) and RACY_SECONDS where
  they are whole seconds (FAT's are 2 s).
- Shared blobs: linking a blob into a new entry (or gc unlinking one) also
  changes its ctime; the next hit of every entry sharing it re-hashes once
  and re-stamps. That costs a hash, never a wrong answer.

A stamp is the name of an empty file in the variant's folder (NAME_PREFIX,
then the fields: the witnesses in the manifest's file order), so it takes no
block of its own and a hit reads it with the listing of the folder; one that
does not fit in a name (many files, many checkouts) is a JSON file
(FILENAME) instead. Two processes stamping at once leave two names: a reader
takes both (each was true when written, and a witness never comes back), the
next writer removes what it read.

An entry compiled from project headers (deps.py) also keeps, beside its
stamp, the witness of each header at which it last held its recorded bytes
(DEPS_FILENAME, read only when something changed), and in the stamp the
summaries (deps.summary) of the last few sets of witnesses found wholly
current: a hit stats its headers and compares one digest.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

from ..errors import ManifestError
from .manifest_names import read_any as _read_manifest

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

FILENAME = ".abicache-stamp"
NAME_PREFIX = ".abicache-s."
_NAME_MAX = 255  # bytes in a file's name: ext4, xfs, btrfs, tmpfs, NFS
DEPS_FILENAME = ".abicache-deps"
#: summaries kept per entry: one per checkout (base folders) that uses it, the newest first
MAX_SUMMARIES = 8
#: a ctime younger than this is not trusted yet (timestamp granularity is a
#: clock tick on Linux, up to 2 s on some filesystems)
RACY_SECONDS = 2.0
FINE_SECONDS = 0.02
_MAX_BYTES = 1 << 20

Witness = tuple[int, int, int]  # (inode, size, ctime in ns)


def window_ns(ts_ns: int) -> int:
    """How far before the moment it was seen a timestamp must lie to be trusted."""
    coarse = ts_ns % 1_000_000_000 == 0
    return int((RACY_SECONDS if coarse else min(FINE_SECONDS, RACY_SECONDS)) * 1e9)


def settled(ts_ns: int, seen_ns: int) -> bool:
    """Whether a write after `seen_ns` must give a timestamp other than ts_ns."""
    return ts_ns < seen_ns - window_ns(ts_ns)


def witness(st: os.stat_result) -> Witness:
    return (st.st_ino, st.st_size, st.st_ctime_ns)


class Stamp:
    """What the last full check of a variant found, read from its stamp file."""

    __slots__ = ("verified", "files", "deps_ok", "names")

    def __init__(self, verified: float = 0.0, files: Mapping[str, Witness] | None = None,
                 deps_ok: Sequence[str] = (), names: Sequence[str] = ()) -> None:
        self.verified = verified
        self.files = dict(files or {})
        self.deps_ok = tuple(deps_ok)  # summaries of dependency witnesses found current
        self.names = tuple(names)  # where it was read from: what the next write replaces

    def vouches_for(self, path: str, st: os.stat_result) -> bool:
        return self.files.get(path) == witness(st)

    def merge(self, other: Stamp) -> None:
        self.verified = max(self.verified, other.verified)
        self.files.update(other.files)
        self.deps_ok = (*self.deps_ok, *(d for d in other.deps_ok if d not in self.deps_ok))[:MAX_SUMMARIES]
        self.names += other.names


def read(vdir: Path, trusted: Callable[[os.stat_result], bool], order: Sequence[str] | None = None,
         names: list[str] | None = None) -> Stamp:
    """The variant's stamp; an empty one if absent, unreadable or not trusted. order:
    the manifest's file paths, sorted (read from the manifest there if not given).
    A name is as trusted as the folder it is in: none is read from a folder that
    `trusted` refuses (the same calls as os.listdir: open, fstat, getdents). names:
    the folder's listing where the caller just made it, from a folder it trusted."""
    stamp = Stamp()
    if names is None:
        names = _listing(vdir, trusted)
    for name in names:
        if name.startswith(NAME_PREFIX):
            stamp.merge(_decode(name, order if order is not None else _order(vdir)))
        elif name == FILENAME:
            stamp.merge(_from_json(_read_json(vdir / FILENAME, trusted)))
    return stamp


def _listing(vdir: Path, trusted: Callable[[os.stat_result], bool]) -> list[str]:
    try:
        fd = os.open(vdir, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return []
    try:
        return os.listdir(fd) if trusted(os.fstat(fd)) else []
    except OSError:
        return []
    finally:
        os.close(fd)


def _from_json(doc: Any) -> Stamp:
    try:
        files = {str(p): (int(w[0]), int(w[1]), int(w[2])) for p, w in doc["files"].items()}
        deps_ok = doc.get("deps_ok", [])  # a wrong one only fails to vouch
        return Stamp(float(doc["verified"]), files, [d for d in deps_ok if type(d) is str][:MAX_SUMMARIES],
                     [FILENAME])
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return Stamp(names=[FILENAME])


def _encode(order: Sequence[str], files: Mapping[str, Sequence[int]], verified: float,
            deps_ok: Sequence[str]) -> str | None:
    """NAME_PREFIX<verified ms>.<index-inode-size-ctime>_...<.summary_...>, numbers in
    base 36; None where that is too long for a file's name."""
    index = {path: i for i, path in enumerate(order)}
    witnessed = sorted((index[p], *w) for p, w in files.items() if p in index)
    fields = "_".join("-".join(map(_b36, w)) for w in witnessed)
    name = f"{NAME_PREFIX}{_b36(max(0, int(verified * 1000)))}.{fields}.{'_'.join(deps_ok)}"
    return name if len(name.encode()) <= _NAME_MAX else None


def _decode(name: str, order: Sequence[str]) -> Stamp:
    try:
        verified, fields, summaries = name[len(NAME_PREFIX):].split(".")
        files = {}
        for field in filter(None, fields.split("_")):
            i, ino, size, ctime = (int(v, 36) for v in field.split("-"))
            files[order[i]] = (ino, size, ctime)
        deps_ok = [d for d in summaries.split("_") if d][:MAX_SUMMARIES]
        return Stamp(int(verified, 36) / 1000, files, deps_ok, [name])
    except (ValueError, IndexError):
        return Stamp(names=[name])  # a wrong one only fails to vouch; the next write removes it


def _b36(n: int) -> str:
    if n < 0:
        raise ValueError(n)
    digits = ""
    while True:
        n, r = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
        if not n:
            return digits


def _order(vdir: Path) -> list[str]:
    """The manifest's file paths, sorted: what a stamp's indexes count (no trust needed:
    a wrong order only fails to vouch, as a witness of another file never matches)."""
    try:
        files = json.loads(_read_manifest(os.fspath(vdir), _MAX_BYTES))["files"]
        return sorted(str(p) for p in files)
    except (OSError, ValueError, KeyError, TypeError, ManifestError):
        return []


def read_deps(vdir: Path, trusted: Callable[[os.stat_result], bool]) -> dict[str, list[int]]:
    """Dependency file -> the witness at which it held its recorded bytes."""
    doc = _read_json(vdir / DEPS_FILENAME, trusted)
    return doc if isinstance(doc, dict) else {}  # a wrong witness only fails to vouch


def _read_json(path: Path, trusted: Callable[[os.stat_result], bool]) -> Any:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        return json.loads(os.read(fd, min(st.st_size + 1, _MAX_BYTES))) if trusted(st) else {}
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)


def write(vdir: Path, kept: Mapping[str, Witness], hashed: Mapping[str, Witness], verified: float,
          deps_ok: Sequence[str] = (), force: bool = False, seen_ns: int | None = None,
          order: Sequence[str] | None = None, old: Sequence[str] = ()) -> None:
    """Record the files just hashed (all of them matched) beside those the old
    stamp still vouches for. Racy ones are left out and will be hashed again;
    when that leaves nothing new, nothing is written (a hit right after a
    build writes nothing). seen_ns: when the hashed witnesses were first
    seen (default: now). order: the manifest's sorted file paths; old: the
    names the old stamp was read from (Stamp.names), removed once the new one
    is there. A name is made with O_EXCL (a planted link is not followed); a
    stamp too long for a name is written to a temporary file, then renamed."""
    now_ns = time.time_ns()
    seen = now_ns if seen_ns is None else seen_ns
    fresh = {p: list(w) for p, w in hashed.items() if settled(w[2], seen)}
    if not fresh and not force:
        return
    files = {**{p: list(w) for p, w in kept.items()}, **fresh}
    name = _encode(order if order is not None else _order(vdir), files, verified, deps_ok)
    made = _create(vdir / name) if name is not None else None
    if made is False:
        return  # a read-only store: every hit re-hashes instead
    if name is None or made is None:  # too long for a name here (or on this filesystem: eCryptfs's 143 bytes)
        doc = {"verified": verified, "files": files, "deps_ok": list(deps_ok)}
        _replace(vdir, FILENAME, json.dumps(doc, separators=(",", ":")).encode(), now_ns)
        name = FILENAME
    for gone in old:
        if gone != name:
            _unlink(vdir / gone)


def remember_deps(vdir: Path, stamp: Stamp, remembered: Mapping[str, Sequence[int]],
                  current: Mapping[str, Sequence[int]], summary: str | None,
                  order: Sequence[str] | None = None) -> None:
    """Add the witnesses of dependencies just found current (if any are new)
    and, where every one was settled, their summary."""
    if not all(remembered.get(p) == [*w] for p, w in current.items()):
        merged = {**remembered, **{p: list(w) for p, w in current.items()}}
        if len(merged) > 8 * len(current) + 64:  # many checkouts over time: keep the ones in use
            merged = {p: list(w) for p, w in current.items()}
        _replace(vdir, DEPS_FILENAME, json.dumps(merged, separators=(",", ":")).encode(), time.time_ns())
    if summary is not None and summary not in stamp.deps_ok:
        kept = (summary, *stamp.deps_ok)[:MAX_SUMMARIES]
        write(vdir, stamp.files, {}, stamp.verified, kept, force=True, order=order, old=stamp.names)


def _create(path: Path) -> bool | None:
    """An empty file at path (or there already: the same stamp); False if it cannot be made,
    None where its name is too long for the filesystem (the stamp goes to FILENAME then)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o444))
    except FileExistsError:
        pass
    except OSError as exc:
        return None if exc.errno == errno.ENAMETOOLONG else False
    return True


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # another writer removed it first, or a read-only store


def _replace(vdir: Path, name: str, data: bytes, now_ns: int) -> None:
    temp = vdir / f"{name}.{os.getpid()}-{now_ns}"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o444)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(temp, vdir / name)
    except OSError:
        try:
            os.unlink(temp)
        except OSError:
            pass  # a read-only store: every hit re-hashes instead
