"""Content-addressed files: one read-only copy of each distinct file.

Entry files are hard links to blobs, so identical outputs of different keys
or variants take the disk space once, and a blob whose link count is 1 is
referenced by no entry (garbage).

On a filesystem without hard links (vfat, some FUSE and object-store mounts)
an entry keeps its own files and no blob is made: publishing stays atomic (it
renames the whole entry folder), only the sharing of identical files is lost.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from .manifest import FileRecord

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Callable

_CHUNK = 1 << 20
#: what link() says where a filesystem has no hard links (vfat: EPERM)
NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV})


def hash_file(path: Path) -> tuple[str, int]:
    import hashlib  # OpenSSL's: a file may be megabytes; a hit hashes none
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return
    try:
        fsync_file(path)
    except OSError:
        pass  # some filesystems cannot fsync a directory; rename is still atomic


def adopt(path: Path, blob: Path, record: FileRecord, place: Callable[[Path], None]) -> None:
    """Make `path` a hard link to `blob`: either it becomes the blob, or it is
    replaced by a link to the blob already there. `place(blob)` makes the
    blob's folder and moves aside anything there the store may not trust.
    Races with other publishers and with gc removing the blob are retried; a
    blob at the filesystem's hard-link limit is replaced by this file."""
    os.chmod(path, record.mode)  # our own inode: ingest copied anything linked from outside
    mine = os.lstat(path)
    for _ in range(5):
        place(blob)
        try:
            existing = os.lstat(blob)
        except FileNotFoundError:
            fsync_file(path)
            try:
                os.link(path, blob)
                return
            except FileExistsError:
                continue  # another publisher made it first: link to theirs
            except OSError as exc:
                if exc.errno in NO_LINKS:
                    return  # the entry keeps its own file
                raise
        if (existing.st_ino, existing.st_dev) == (mine.st_ino, mine.st_dev):
            return  # already the blob (a remote fetch linked it)
        if existing.st_size != record.size:
            _move_aside(blob)  # a damaged blob: never spread it to a new entry
            continue
        temp = path.with_name(f".abicache-link-{os.getpid()}-{time.monotonic_ns()}")
        try:
            os.link(blob, temp)
        except FileNotFoundError:
            continue  # gc removed it between stat and link
        except OSError as exc:
            if exc.errno in NO_LINKS:
                return  # the entry keeps its own file
            if exc.errno != errno.EMLINK:
                raise
            _replace(blob, path)  # the old blob keeps serving the entries that link it
            return
        os.replace(temp, path)
        return
    raise OSError(f"could not link {path} into the blob store at {blob}")


def _replace(blob: Path, path: Path) -> None:
    temp = blob.with_name(f".{blob.name}.{os.getpid()}-{time.monotonic_ns()}")
    fsync_file(path)
    try:
        os.link(path, temp)
    except OSError as exc:
        if exc.errno in NO_LINKS:
            return
        raise
    os.replace(temp, blob)


def _move_aside(blob: Path) -> None:
    try:
        os.replace(blob, blob.with_name(f".damaged-{blob.name}.{os.getpid()}"))
    except FileNotFoundError:
        pass
