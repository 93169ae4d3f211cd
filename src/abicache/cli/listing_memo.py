"""`abicache ls`'s memo: the rows it showed last time, so that the next `ls` reads no
manifest it read before (10,000 manifests read and decoded take most of its time).

A row is kept under its entry folder's name (<key>.<variant>) and inode, both read
from the prefix folder's listing at no cost. A published entry folder never changes
its manifest: a new build of the same key and variant is a new folder, so a new inode,
and an entry moved aside and back is read again. The memo is for display only: a hit
and `abicache verify` never read it, and `ls` still stats every entry for its last use.

One JSON file a kind, <store>/v3/listing/<kind>.json, written by `ls` (a temporary
file renamed over it) where the entries it saw differ from the memo's. It is read only
where it is a regular file owned by this user, and a file that is not what this module
writes is not used at all: the rows are then read from the manifests, as without it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable

VERSION = 1
_LIMIT = 256 << 20  # a memo larger than this is not one ls wrote (10,000 rows: 2 MiB)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted there: opened without waiting, then refused
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # as listing's

#: a row: [inode, kind, name, size, files, requirements, created]
MemoRow = list[Any]


def path_of(folder: str, kind: str) -> str:
    """In the store's listing folder (store.layout.listing)."""
    return f"{folder}/{kind}.json"


def load(path: str) -> tuple[dict[str, MemoRow], bool]:
    """The memo's rows by entry folder name (empty where there is none to trust), and
    whether its text has no escape at all: then no string in it has a control character
    (JSON refuses them raw), and the rows' texts need no check one by one."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except OSError:
        return {}, True
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_size > _LIMIT or not stat.S_ISREG(st.st_mode):
            return {}, True
        data = b""
        while chunk := os.read(fd, 1 << 20):
            data += chunk
        doc = json.loads(data)
    except (OSError, ValueError):
        return {}, True
    finally:
        os.close(fd)
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("rows"), dict):
        return {}, True
    return doc["rows"], b"\\" not in data


def good(row: Any, plain: bool) -> bool:
    """A row as save() writes it (checked as it is used: one bad row drops only itself);
    its texts are checked for control characters (a line break makes a second row)
    unless the memo's text is plain."""
    if not (type(row) is list and len(row) == 7 and type(row[0]) is int and type(row[1]) is str
            and type(row[2]) is str and type(row[3]) is int and type(row[4]) is list and type(row[5]) is list
            and type(row[6]) in (float, int)):
        return False
    if plain:
        return True
    texts = [row[1], row[2], *row[4], *row[5]]
    return all(type(t) is str for t in texts) and not _CONTROL.search("".join(texts))


def save(path: str, rows: dict[str, MemoRow], make_dir: Callable[[Path], None]) -> None:
    """Replace the memo; where the store is not writable (a read-only store, another
    user's folder), nothing is written and the next `ls` reads the manifests again."""
    temp = f"{path}.{os.getpid()}.tmp"
    try:
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            make_dir(Path(folder))
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps({"version": VERSION, "rows": rows}, separators=(",", ":")).encode())
        os.replace(temp, path)
    except OSError:
        try:
            os.unlink(temp)
        except OSError:
            pass
