"""`abicache ls`'s rows, read fast: a store of 10,000 entries lists in well under a second.

A hit reads one manifest and checks all of it (store/manifest.py). A listing
reads every manifest and only shows them, so it takes the fields it shows
from the JSON and checks only what a terminal would misread: text with
control characters (a line break makes a second row) and keys or variants
that are not hex. A manifest that fails is left out, as `ls` always did;
`abicache verify` names it. Folders are walked with os.scandir and plain
strings (pathlib costs more than the reads); a row read before comes from
listing_memo instead of its manifest (the next `ls` of 10,000 entries reads none).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from json.encoder import encode_basestring_ascii as _QUOTE
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from ..errors import ManifestError
from ..store import listing_log
from ..store.manifest_names import read_any
from . import listing_memo

_ENTRY = re.compile(r"[0-9a-f]{16,64}\.[0-9a-f]{16,64}\Z")  # <key>.<variant>
_SCAN = json.JSONDecoder().scan_once
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_READ_LIMIT = 1 << 20  # a listing has no use for a manifest larger than this


class Row(NamedTuple):
    path: str  # the variant folder
    kind: str
    name: str
    key: str
    variant: str
    size: int
    files: tuple[str, ...]
    requirements: tuple[str, ...]
    created: float
    last_used: float

    def summary(self) -> dict[str, Any]:
        """The --json record (the same fields `ls --json` always had)."""
        return {"kind": self.kind, "name": self.name, "key": self.key, "variant": self.variant, "path": self.path,
                "size": self.size, "files": list(self.files), "requirements": list(self.requirements),
                "created": self.created, "last_used": self.last_used}

    def json_line(self, lists: dict[tuple[str, ...], str] | None = None) -> str:
        """summary() as json.dumps(sort_keys=True) writes it, made with one format and json's C
        quoting: a third of the time of the encoder for the 10,000 lines of a big store. lists:
        the JSON of lists written before (the entries of a kind share a few file lists and
        requirements)."""
        q = _QUOTE
        path, kind, name, key, variant, size, files, requirements, created, used = self
        files = _json_list(files, lists)
        requirements = _json_list(requirements, lists)
        # a finite number is its repr (x - x is 0.0 for those alone): _number's call spared
        return (f'{{"created": {repr(created) if created - created == 0 else _number(created)}, '
                f'"files": {files}, "key": {q(key)}, "kind": {q(kind)}, '
                f'"last_used": {repr(used) if used - used == 0 else _number(used)}, '
                f'"name": {q(name)}, "path": {q(path)}, "requirements": {requirements}, "size": {int(size)}, '
                f'"variant": {q(variant)}}}')


def _json_list(texts: tuple[str, ...], lists: dict[tuple[str, ...], str] | None) -> str:
    made = lists.get(texts) if lists is not None else None
    if made is None:
        made = f'[{", ".join(map(_QUOTE, texts))}]'
        if lists is not None:
            lists[texts] = made
    return made


_new_row = functools.partial(tuple.__new__, Row)  # a memo's row: its fields checked already (listing_memo.good)


def _number(value: float) -> str:
    return repr(value) if math.isfinite(value) else json.dumps(value)


def variant_dirs(entries: str, kinds: list[str] | None = None) -> Iterator[tuple[str, str]]:
    """(kind, variant folder) of every entry, or of these kinds only."""
    for kind in sorted(kinds if kinds is not None else _folders(entries)):
        kind_dir = f"{entries}/{kind}"
        for prefix in _folders(kind_dir):
            for name in _folders(f"{kind_dir}/{prefix}"):
                if "." in name:  # <key>.<variant>: read() checks both
                    yield kind, f"{kind_dir}/{prefix}/{name}"


def rows(entries: str, kinds: list[str] | None = None, memo_folder: str | None = None,
         make_dir: Callable[[Path], None] | None = None) -> list[Row]:
    """A row per readable entry. Each prefix folder is opened once and its entries read
    relative to it (no path walked twice). With memo_folder (the store's listing folder), rows
    read before come from listing_memo, and the memo is written again where it changed;
    rows logged as entries were published (store/listing_log) are taken into it."""
    out: list[Row] = []
    for kind in sorted(kinds if kinds is not None else _folders(entries)):
        if memo_folder and make_dir:
            _kind_rows_kept(f"{entries}/{kind}", listing_memo.path_of(memo_folder, kind), memo_folder, kind,
                            make_dir, out)
        else:
            _kind_rows(f"{entries}/{kind}", {}, True, {}, out)
    return out


def _kind_rows_kept(kind_dir: str, path: str, memo_folder: str, kind: str, make_dir: Callable[[Path], None],
                    out: list[Row]) -> None:
    """A kind's rows, through its memo and its log."""
    memo = listing_memo.load(path)
    log, taken = listing_log.take(memo_folder, kind)
    old = {**memo.by_name, **log.by_name} if log.by_name else memo.by_name
    new: dict[str, listing_memo.MemoRow] = {}
    read_again = _kind_rows(kind_dir, old, memo.plain and log.plain, new, out)
    kept = not read_again and len(new) == len(old) and memo.whole  # every row shown, and no other
    if kept and taken and log.whole and len(new) == len(memo.by_name) + len(log.by_name):
        listing_memo.extend(path, memo, log, taken, make_dir)  # the two texts say exactly these rows
    elif not kept or taken:
        listing_memo.save(path, new, make_dir)
    listing_log.done(taken)


def _kind_rows(kind_dir: str, old: dict[str, listing_memo.MemoRow], plain: bool,
               new: dict[str, listing_memo.MemoRow], out: list[Row]) -> int:
    """Append a kind's rows; how many were read from their manifests."""
    read_again = 0
    for prefix in _folders(kind_dir):
        read_again += _prefix_rows(f"{kind_dir}/{prefix}", old, plain, new, out)
    return read_again


def _prefix_rows(folder: str, old: dict[str, listing_memo.MemoRow], plain: bool,
                 new: dict[str, listing_memo.MemoRow], out: list[Row]) -> int:
    """Append the rows of one prefix folder's entries; how many were read from their manifests.
    old: the memo's rows by entry folder name, checked here as they are used (listing_memo.good).
    Its loop runs once an entry of the store: names bound to locals, no call it can spare."""
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError:
        return 0
    read_again = 0
    good, get, stat, append, new_row = listing_memo.good, old.get, os.stat, out.append, _new_row
    try:
        with os.scandir(dfd) as it:
            found = sorted([(e.name, e.inode()) for e in it if "." in e.name and e.is_dir(follow_symlinks=False)])
        for name, inode in found:
            memo = get(name)
            if memo is not None and good(memo, plain) and memo[1] == inode:
                try:
                    used = stat(name, dir_fd=dfd, follow_symlinks=False).st_mtime
                except OSError:
                    continue
                key, _, variant = name.partition(".")
                append(new_row((f"{folder}/{name}", memo[2], memo[3], key, variant, memo[4], tuple(memo[5]),
                                tuple(memo[6]), float(memo[7]), used)))
                new[name] = memo
                continue
            read_again += 1
            row = read(f"{folder}/{name}", name, dfd)
            if row is not None:
                append(row)
                new[name] = [name, inode, row.kind, row.name, row.size, list(row.files), list(row.requirements),
                             row.created]
    finally:
        os.close(dfd)
    return read_again


def read(vdir: str, name: str | None = None, dir_fd: int | None = None) -> Row | None:
    """The row of one variant folder (`name` in the folder open as `dir_fd`, if given),
    or None if its manifest is missing or not one to show."""
    where, name = (name, name) if dir_fd is not None and name else (vdir, os.path.basename(vdir))
    try:
        data = read_any(where, _READ_LIMIT, dir_fd)  # the file, or the names it is kept in
        used = os.stat(where, dir_fd=dir_fd, follow_symlinks=False).st_mtime
        doc = _parse(data) if len(data) <= _READ_LIMIT else None
        return _row(vdir, name, doc, used) if isinstance(doc, dict) else None
    except (OSError, ValueError, ManifestError):
        return None


def _parse(data: bytes) -> Any:
    """json.loads without its wrappers (encoding detection, two calls deep): a third of
    the decoding's time for a small manifest. Anything unusual goes the long way."""
    text = data.decode()
    try:
        doc, end = _SCAN(text, 0)
    except StopIteration:
        return json.loads(text)
    return doc if end == len(text) else json.loads(text)


def _row(vdir: str, name: str, doc: dict[str, Any], used: float) -> Row | None:
    try:
        files = doc["files"]
        texts = [doc["kind"], doc["name"], *files, *doc["requirements"]]
        if not all(isinstance(t, str) for t in texts) or _CONTROL.search("".join(texts)):
            return None
        key, variant = doc["key"], doc["variant"]
        # the folder's name is <key>.<variant>: a manifest that says so names hex (checked once)
        if not (isinstance(key, str) and isinstance(variant, str) and name == f"{key}.{variant}"
                and _ENTRY.match(name)):
            return None
        size = sum(int(f["size"]) for f in files.values())
        return Row(vdir, doc["kind"], doc["name"], key, variant, size, tuple(sorted(files)),
                   tuple(doc["requirements"]), float(doc.get("created") or 0.0), used)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def count(entries: str, kinds: list[str]) -> int:
    """How many entries these kinds hold, without reading them."""
    return sum(1 for _ in variant_dirs(entries, kinds))


def _folders(path: str) -> list[str]:
    """Real folders in path; names starting with '.' are folders moved aside (as store.local)."""
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it if e.name[0] != "." and e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []
