"""`abicache ls`'s rows, read fast: a store of 10,000 entries lists in well under a second.

A hit reads one manifest and checks all of it (store/manifest.py). A listing
reads every manifest and only shows them, so it takes the fields it shows
from the JSON and checks only what a terminal would misread: text with
control characters (a line break makes a second row) and keys or variants
that are not hex. A manifest that fails is left out, as `ls` always did;
`abicache verify` names it. Folders are walked with os.scandir and plain
strings (pathlib costs more than the reads).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator, NamedTuple

from ..store.manifest import FILENAME

_HEX = re.compile(r"[0-9a-f]{16,64}\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_READ_LIMIT = 1 << 20  # a listing has no use for a manifest larger than this
_FIRST_READ = 1 << 16  # most manifests are a few KiB


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


def variant_dirs(entries: str, kinds: list[str] | None = None) -> Iterator[tuple[str, str]]:
    """(kind, variant folder) of every entry, or of these kinds only."""
    for kind in sorted(kinds if kinds is not None else _folders(entries)):
        kind_dir = f"{entries}/{kind}"
        for prefix in _folders(kind_dir):
            for name in _folders(f"{kind_dir}/{prefix}"):
                if "." in name:  # <key>.<variant>: read() checks both
                    yield kind, f"{kind_dir}/{prefix}/{name}"


def rows(entries: str, kinds: list[str] | None = None) -> list[Row]:
    """A row per readable entry."""
    out = []
    for _, vdir in variant_dirs(entries, kinds):
        row = read(vdir)
        if row is not None:
            out.append(row)
    return out


def read(vdir: str) -> Row | None:
    """The row of one variant folder, or None if its manifest is missing or not one to show."""
    try:
        fd = os.open(f"{vdir}/{FILENAME}", os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            data = os.read(fd, _FIRST_READ)  # a buffer of the limit's size costs more than the read
            while len(data) % _FIRST_READ == 0 and 0 < len(data) <= _READ_LIMIT:
                more = os.read(fd, _FIRST_READ)
                if not more:
                    break
                data += more
        finally:
            os.close(fd)
        used = os.stat(vdir).st_mtime
        doc = json.loads(data) if len(data) <= _READ_LIMIT else None
        return _row(vdir, doc, used) if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def _row(vdir: str, doc: dict[str, Any], used: float) -> Row | None:
    try:
        files = doc["files"]
        texts = [doc["kind"], doc["name"], *files, *doc["requirements"]]
        if not all(isinstance(t, str) and not _CONTROL.search(t) for t in texts):
            return None
        if not (_HEX.match(doc["key"]) and _HEX.match(doc["variant"])):
            return None
        size = sum(int(f["size"]) for f in files.values())
        return Row(vdir, doc["kind"], doc["name"], doc["key"], doc["variant"], size, tuple(sorted(files)),
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
