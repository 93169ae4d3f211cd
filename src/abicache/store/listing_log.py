"""Rows for `abicache ls`, appended as entries are published: the first `ls` of a store
just filled reads none of its manifests (10,000 of them, listed, decoded and parsed, took
0.45 s of that `ls`'s 0.7).

A line a published entry, JSON: [<key>.<variant>, inode, kind, name, size, files,
requirements, created], as `ls`'s memo holds it (cli/listing_memo). One file
a kind and user, <store>/v3/listing/<kind>.<uid>.log, appended to by one write a line
(O_APPEND: lines of concurrent publishers do not interleave). `ls` takes it: renames it
aside, reads it, folds its rows into the memo, removes it (or, where its rows are all the
memo lacks, makes it the memo or appends it to the memo's text). A line whose write was cut or
lost only means that `ls` reads that entry's manifest, as without the log.

Display only, as the memo: a row is used for the folder of that name and inode alone, and
checked as the memo's rows are; a log another user owns is not read. Where no `ls` takes it,
it stops growing at LIMIT bytes (about 13,000 rows): later entries are read from their
manifests. gc removes the logs of kinds with no entry left, as it does the memos.
"""

from __future__ import annotations

import json
import os
import stat

from .manifest import Manifest

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Callable

LIMIT = 4 << 20
SUFFIX = ".log"
#: `ls`'s memo of a kind (cli/listing_memo), in the same folder: <kind>.rows, format 1 <kind>.json
MEMO_SUFFIX, MEMO_SUFFIX_1 = ".rows", ".json"
#: no link followed; a FIFO planted there is opened without waiting (then refused: not a regular file)
_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def path_of(folder: str, kind: str) -> str:
    """In the store's listing folder (store.layout.listing), this user's."""
    return f"{folder}/{kind}.{os.geteuid()}{SUFFIX}"


def kind_of(filename: str) -> str | None:
    """The kind a log's file name is for (None: not a log's name)."""
    stem, dot, uid = filename[:-len(SUFFIX)].rpartition(".") if filename.endswith(SUFFIX) else ("", "", "")
    return stem if dot and uid.isdigit() else None


def memo_kind(filename: str) -> str | None:
    """The kind `ls`'s memo of this file name is for, of either format (None: not a memo's)."""
    for suffix in (MEMO_SUFFIX, MEMO_SUFFIX_1):
        if filename.endswith(suffix) and len(filename) > len(suffix):
            return filename[:-len(suffix)]
    return None


def line(manifest: Manifest, inode: int) -> bytes:
    row = [f"{manifest.key}.{manifest.variant}", inode, manifest.kind, manifest.name,
           sum(f.size for f in manifest.files), sorted(f.path for f in manifest.files),
           manifest.requirements.to_list(), manifest.created]
    return json.dumps(row, separators=(",", ":")).encode() + b"\n"


def append(folder: Path, manifest: Manifest, inode: int, make_dir: Callable[[Path], None]) -> None:
    """Add the row of an entry just published. Never fails a publish: a store where this
    cannot be written lists from its manifests."""
    path = path_of(os.fspath(folder), manifest.kind)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _FLAGS
    try:
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            make_dir(folder)
            fd = os.open(path, flags, 0o600)
    except OSError:
        return
    try:
        data = line(manifest, inode)
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and stat.S_ISREG(st.st_mode) and st.st_size + len(data) <= LIMIT:
            os.write(fd, data)
    except (OSError, ValueError):
        pass
    finally:
        os.close(fd)


def take(folder: str, kind: str) -> tuple[Rows, str | None]:
    """The rows logged for this kind, and the file taken aside, for done() once the rows are
    kept in the memo (None: none taken)."""
    path = path_of(folder, kind)
    taken = f"{path}.{os.getpid()}.taken"
    try:
        os.rename(path, taken)
    except OSError:
        return Rows.NONE, None
    return read(taken, 2 * LIMIT), taken


class Rows:
    """Rows read from a log or a memo (the same lines): by entry folder name, each row a line
    ([<key>.<variant>, inode, kind, name, size, files, requirements, created]) not yet
    checked (cli/listing_memo.good); the file's text; whether it has no escape (then no text
    in it has a control character: JSON refuses them raw); and whether every line was a row
    of a name of its own (then the text says exactly these rows, and another file's whole
    rows may be appended to it)."""

    __slots__ = ("by_name", "data", "plain", "whole")
    NONE: Rows

    def __init__(self, by_name: dict[str, list[Any]], data: bytes, whole: bool) -> None:
        self.by_name, self.data, self.whole = by_name, data, whole
        self.plain = b"\\" not in data


Rows.NONE = Rows({}, b"", True)


def read(path: str, limit: int) -> Rows:
    """The rows of a file this user owns, a regular file of at most limit bytes (a link is not
    followed, a FIFO not waited for); none where it is anything else or cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except OSError:
        return Rows.NONE
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return Rows.NONE
        data = b""
        while chunk := os.read(fd, 1 << 20):
            data += chunk
    except OSError:
        return Rows.NONE
    finally:
        os.close(fd)
    return parse(data)


def parse(data: bytes) -> Rows:
    try:  # one parse for all, the usual case (a line holds no raw line break: JSON escapes them)
        parsed = json.loads(b"[" + data.rstrip(b"\n").replace(b"\n", b",") + b"]") if data else []
        whole = True
    except ValueError:  # a line cut by a crash, or text that is no row: each whole line on its own
        parsed, whole = [], False
        for text in data.splitlines():
            try:
                parsed.append(json.loads(text))
            except ValueError:
                continue
    by_name = {row[0]: row for row in parsed if type(row) is list and len(row) == 8 and type(row[0]) is str}
    return Rows(by_name, data, whole and len(by_name) == len(parsed))


def done(taken: str | None) -> None:
    if taken is not None:
        try:
            os.unlink(taken)
        except OSError:
            pass
