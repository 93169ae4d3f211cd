"""A small manifest kept in the names of empty files in its entry's folder.

On ext4 (as on most filesystems) every non-empty file takes a block of its own,
so a small library's manifest (500 bytes) cost as much disk as its entry's folder
(4 KiB), while that folder's first block, which holds its names, was mostly
empty. A manifest that fits is therefore written as names instead: compressed,
in base64url, split over empty files `.abicache-m.<i>.<n>.<text>` (no block),
made in the stage before the rename that publishes the entry, so it is as
atomic as the file was. A reader lists the folder (a hit lists it anyway, for
its stamp) and joins the names in order. A manifest that would not leave its
folder in one block, with the artifact's own names and room for a stamp, is the
file manifest.json as before; readers take either, and the file where both are.

Names are as trusted as their folder: only a folder that passes the trust check
is read this way (whoever can write it could replace a file in it as well).
"""

from __future__ import annotations

import binascii
import errno
import os
import zlib

from ..errors import ManifestError
from .manifest import FILENAME

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Iterable

PREFIX = ".abicache-m."
_CHUNK = 236  # PREFIX + "<i>.<n>." + 236 characters = 252: a name is at most 255 bytes
_MAX_NAMES = 16  # <i> and <n> are one hex digit
#: bytes of a folder's first block (4 KiB, less the two dot entries and a checksum) that the
#: manifest's and the artifact's names may take, leaving room for two stamps' names
ROOM = 3400
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# base64url as binascii's C functions (base64's wrappers cost more than the decoding)
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def _entry_bytes(name: str) -> int:
    """What a name takes in an ext4 folder block: 8 bytes and the name, 4-aligned."""
    return 8 + (len(os.fsencode(name)) + 3) // 4 * 4


def encode(data: bytes, beside: Iterable[str] = (), name_max: int = 255) -> list[str] | None:
    """The names that hold data, or None where they would not fit in the folder's
    first block beside `beside` (the artifact's own top-level names), or where a name
    would be longer than the filesystem takes (name_max: eCryptfs takes 143 bytes)."""
    text = binascii.b2a_base64(zlib.compress(data, 9), newline=False).rstrip(b"=").translate(_TO_URLSAFE).decode()
    chunks = [text[i:i + _CHUNK] for i in range(0, len(text), _CHUNK)] or [""]
    if len(chunks) > _MAX_NAMES:
        return None
    names = [f"{PREFIX}{i:x}.{len(chunks):x}.{chunk}" for i, chunk in enumerate(chunks)]
    if max(map(len, names)) > name_max or sum(map(_entry_bytes, [*names, *beside])) > ROOM:
        return None
    return names


def decode(names: Iterable[str], limit: int) -> bytes | None:
    """The manifest these names hold; None where there is none; ManifestError where
    they are not one whole manifest of at most `limit` bytes."""
    parts = sorted(name for name in names if name.startswith(PREFIX))
    if not parts:
        return None
    count = len(parts)
    if count > _MAX_NAMES:
        raise ManifestError(f"{count} manifest names: more than one manifest, or not abicache's")
    chunks = []
    for i, name in enumerate(parts):  # one hex digit: sorted by name is sorted by index
        head = f"{PREFIX}{i:x}.{count:x}."
        if not name.startswith(head):
            raise ManifestError(f"the manifest's names are incomplete or mixed ({count} of them, {name[:20]!r}...)")
        chunks.append(name[len(head):])
    text = "".join(chunks)
    try:
        packed = binascii.a2b_base64((text + "=" * (-len(text) % 4)).encode().translate(_FROM_URLSAFE))
        inflate = zlib.decompressobj()
        data = inflate.decompress(packed, limit + 1)
    except (binascii.Error, ValueError, zlib.error) as exc:
        raise ManifestError(f"the manifest's names do not decode: {exc}") from None
    if len(data) > limit or inflate.unconsumed_tail or not inflate.eof:
        raise ManifestError(f"the manifest's names hold more than {limit} bytes, or a cut stream")
    return data


def present(names: Iterable[str]) -> bool:
    return any(name.startswith(PREFIX) for name in names)


def name_max(folder: str) -> int:
    """The longest name the folder's filesystem takes (255 where it cannot say)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


def write(stage: str, names: list[str]) -> bool:
    """Make the names, empty and read-only, in the stage folder (its fsync makes them
    durable); False, with none left behind, where the filesystem refuses a name as too
    long (one that says it takes longer names than it does): write the file instead."""
    made = []
    for name in names:
        try:
            fd = os.open(os.path.join(stage, name),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o444)
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            for done in made:
                os.unlink(os.path.join(stage, done))
            return False
        os.close(fd)
        made.append(name)
    return True


def read_any(vdir: str, limit: int, dir_fd: int | None = None) -> bytes:
    """The manifest in either form, without the trust check: for what only shows or
    orders (`ls`, a stamp's file order), never for a hit (Store.read_manifest).
    FileNotFoundError where there is none."""
    fd = os.open(vdir, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
    try:
        names = os.listdir(fd)
        if FILENAME in names:
            mfd = os.open(FILENAME, os.O_RDONLY | _NOFOLLOW, dir_fd=fd)
            try:
                data = b""
                while len(data) <= limit and (chunk := os.read(mfd, 1 << 16)):
                    data += chunk
                return data
            finally:
                os.close(mfd)
    finally:
        os.close(fd)
    data = decode(names, limit)
    if data is None:
        raise FileNotFoundError(2, "no manifest", os.path.join(vdir, FILENAME))
    return data
