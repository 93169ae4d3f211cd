"""`abicache ls`'s memo: the rows it showed last time, so that the next `ls` reads no
manifest it read before (10,000 manifests read and decoded take most of its time).

A row is kept under its entry folder's name (<key>.<variant>) and inode, both read
from the prefix folder's listing at no cost. A published entry folder never changes
its manifest: a new build of the same key and variant is a new folder, so a new inode,
and an entry moved aside and back is read again. The memo is for display only: a hit
and `abicache verify` never read it, and `ls` still stats every entry for its last use.

One file a kind, <store>/v3/listing/<kind>.rows, of the lines publishers log
(store/listing_log: a JSON row a line), so that the first `ls` of a store just filled
keeps the log it took as its memo by one rename, and a later one appends the new log's
lines to the memo's, encoding nothing. Written otherwise (entries gone, read again) as a
temporary file renamed over it. It is read only where it is a regular file owned by this
user; a row that is not what this module writes is not used, and its entry is read from
its manifest. Format 1 was one JSON document, <kind>.json: the first `ls` that writes
<kind>.rows removes it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable

from ..store import listing_log

SUFFIX, OLD_SUFFIX = listing_log.MEMO_SUFFIX, listing_log.MEMO_SUFFIX_1  # format 2, format 1
_LIMIT = 256 << 20  # a memo larger than this is not one ls wrote (10,000 rows: 2 MiB)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # as listing's

#: a row, a line of the file: [<key>.<variant>, inode, kind, name, size, files, requirements, created]
MemoRow = list[Any]


def path_of(folder: str, kind: str) -> str:
    """In the store's listing folder (store.layout.listing)."""
    return f"{folder}/{kind}{SUFFIX}"


def load(path: str) -> listing_log.Rows:
    """The memo's rows, not yet checked (good())."""
    return listing_log.read(path, _LIMIT)


def good(row: Any, plain: bool) -> bool:
    """A row as save() writes it (checked as it is used: one bad row drops only itself);
    its texts are checked for control characters (a line break makes a second row)
    unless the memo's text is plain."""
    if type(row) is not list or len(row) != 8:
        return False
    _, inode, kind, name, size, files, requirements, created = row
    if not (type(inode) is int and type(kind) is str and type(name) is str and type(size) is int
            and type(files) is list and type(requirements) is list and type(created) in (float, int)):
        return False
    try:
        lists = "".join(files) + "".join(requirements)  # a TypeError where one is not text
    except TypeError:
        return False
    return plain or not _CONTROL.search(kind + name + lists)


def save(path: str, rows: dict[str, MemoRow], make_dir: Callable[[Path], None]) -> None:
    """Replace the memo with these rows; where the store is not writable (a read-only store,
    another user's folder), nothing is written and the next `ls` reads the manifests again."""
    lines = [json.dumps(row, separators=(",", ":")) for row in rows.values()]
    _replace(path, "".join(f"{line}\n" for line in lines).encode(), make_dir)


def extend(path: str, memo: listing_log.Rows, log: listing_log.Rows, taken: str,
           make_dir: Callable[[Path], None]) -> None:
    """The memo and the log taken (store/listing_log.take), whole and of names apart, as the
    new memo: the log renamed into place where there was no memo, else the two texts end to
    end. Nothing is encoded again (10,000 rows: 0.1 s)."""
    if not memo.data:
        try:
            os.rename(taken, path)
            _drop_format_1(path)
            return
        except OSError:
            pass
    head = memo.data if memo.data.endswith(b"\n") or not memo.data else memo.data + b"\n"
    _replace(path, head + log.data, make_dir)


def _replace(path: str, data: bytes, make_dir: Callable[[Path], None]) -> None:
    temp = f"{path}.{os.getpid()}.tmp"
    try:
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            make_dir(Path(folder))
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except OSError:
        try:
            os.unlink(temp)
        except OSError:
            pass
        return
    _drop_format_1(path)


def _drop_format_1(path: str) -> None:
    """A memo of format 1 beside (an older abicache's): not read any more."""
    try:
        os.unlink(path[:-len(SUFFIX)] + OLD_SUFFIX)
    except OSError:
        pass
