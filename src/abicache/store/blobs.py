"""Content-addressed files: one read-only copy of each distinct file.

Entry files are hard links to blobs, so identical outputs of different keys
or variants take the disk space once, and a blob whose link count is 1 is
referenced by no entry (garbage).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .manifest import FileRecord

_CHUNK = 1 << 20


def hash_file(path: Path) -> tuple[str, int]:
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


def adopt(path: Path, blob: Path, record: FileRecord, aside: Path) -> None:
    """Make `path` a hard link to `blob`: either it becomes the blob, or it is
    replaced by a link to the blob already there. Races with other publishers
    and with gc removing the blob are retried."""
    os.chmod(path, record.mode)
    for _ in range(5):
        try:
            existing = os.stat(blob)
        except FileNotFoundError:
            fsync_file(path)
            blob.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, blob)
                return
            except FileExistsError:
                continue  # another publisher made it first: link to theirs
        if existing.st_size != record.size:
            # A damaged blob: move it aside rather than spread it to a new entry.
            _set_aside(blob, aside)
            continue
        temp = path.with_name(path.name + ".abicache-link")
        try:
            os.link(blob, temp)
        except FileNotFoundError:
            continue  # gc removed it between stat and link
        os.replace(temp, path)
        return
    raise OSError(f"could not link {path} into the blob store at {blob}")


def _set_aside(blob: Path, aside: Path) -> None:
    aside.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(blob, aside / f"{blob.name}.{os.getpid()}")
    except FileNotFoundError:
        pass
