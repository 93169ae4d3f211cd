"""Where everything lives under a store root (versioned: <root>/v3/...).

v2 (from v1): an entry's folder is entries/<kind>/<key[:2]>/<key>.<variant>, no
folder per key (beside them, a symlink <key> naming the key's variants: a hint
for lookups); each folder is a 4 KiB block of its own on ext4, as every small
file is, so an entry was its folder and its manifest (stamps are names: stamps.py).
v3 (from v2): a small manifest is kept in its folder's names (manifest_names.py),
so an entry is its folder. An older abicache would find no manifest.json there
and quarantine the entry: a store shared by two versions keeps each one's
entries apart instead, as uv's cache does.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..values.digest import sha256_hex
from ..values.records import named_tuple


LAYOUT_VERSION = "v3"
#: layouts of older versions, removed whole by gc (what they hold is never read)
OLD_VERSIONS = ("v1", "v2")
#: the folders under <root>/v1, made (and checked) by Store.ensure
FOLDERS = ("entries", "blobs", "tmp", "locks", "quarantine", "trash", "index", "log", "tools")
# [a-z0-9][a-z0-9_.-]{0,63} and [0-9a-f]{16,64}, checked without compiling a pattern at
# import (a fresh process's hit checks a few names; the patterns cost more than that)
_KIND_FIRST = "abcdefghijklmnopqrstuvwxyz0123456789"
_KIND_CHARS = _KIND_FIRST + "_.-"


def is_kind(kind: str) -> bool:
    return 0 < len(kind) <= 64 and kind[0] in _KIND_FIRST and not kind.lstrip(_KIND_CHARS)


def is_hex(value: str, shortest: int = 16, longest: int = 64) -> bool:
    """Lower-case hex of a length in [shortest, longest]."""
    return shortest <= len(value) <= longest and not value.strip("0123456789abcdef")


def check_kind(kind: str) -> str:
    if not is_kind(kind):
        raise ValueError(f"artifact kind {kind!r} must be lower-case letters, digits, '.', '_', '-'")
    return kind


def check_hex(value: str, what: str) -> str:
    if not is_hex(value):
        raise ValueError(f"{what} {value!r} is not a lower-case hex digest")
    return value


@named_tuple
class Layout:
    root: Path  # the user-facing root; everything lives under root/v1

    @property
    def base(self) -> Path:
        return self.root / LAYOUT_VERSION

    @property
    def entries(self) -> Path:
        return self.base / "entries"

    @property
    def blobs(self) -> Path:
        return self.base / "blobs"

    @property
    def tmp(self) -> Path:
        return self.base / "tmp"

    @property
    def locks(self) -> Path:
        return self.base / "locks"

    @property
    def quarantine(self) -> Path:
        return self.base / "quarantine"

    @property
    def trash(self) -> Path:
        return self.base / "trash"

    @property
    def index(self) -> Path:
        return self.base / "index"

    @property
    def log(self) -> Path:
        return self.base / "log"

    @property
    def listing(self) -> Path:
        """`abicache ls`'s memos (cli/listing_memo): made by the first `ls`."""
        return self.base / "listing"

    @property
    def hits(self) -> Path:
        """Hit records (src/abicache/hits/__init__.py names this folder too)."""
        return self.base / "hits"

    @property
    def tools(self) -> Path:
        return self.base / "tools"

    def prefix_dir(self, kind: str, key: str) -> Path:
        """The folder of every variant of keys starting as key does (256 per kind)."""
        return Path(f"{os.fspath(self.root)}/{LAYOUT_VERSION}/entries/{check_kind(kind)}/{key[:2]}")

    def variants_link(self, kind: str, key: str) -> Path:
        """A symlink named <key> whose target text lists the key's variants ("v1,v2"): a
        lookup reads it (one call, found by the folder's hash index) instead of listing
        a folder that holds every key of the prefix. Under 60 bytes it lives in its
        inode (no block)."""
        return Path(f"{os.fspath(self.root)}/{LAYOUT_VERSION}/entries/{check_kind(kind)}/{key[:2]}/"
                    f"{check_hex(key, 'key')}")

    def variant_dir(self, kind: str, key: str, variant: str) -> Path:
        # one Path made from one string: joins cost more than the lookup's stats
        return Path(f"{os.fspath(self.root)}/{LAYOUT_VERSION}/entries/{check_kind(kind)}/{key[:2]}/"
                    f"{check_hex(key, 'key')}.{check_hex(variant, 'variant')}")

    def blob(self, sha256: str, executable: bool) -> Path:
        name = check_hex(sha256, "sha256") + ("x" if executable else "")
        return self.blobs / sha256[:2] / name

    def name_marker(self, kind: str, name: str, key: str) -> Path:
        """The index's record that key was built under (kind, name): an empty file named
        <name digest>.<key> in a folder of 256 (no block of its own, unlike a folder per name)."""
        digest = name_digest(name)
        return self.index / check_kind(kind) / digest[:2] / f"{digest}.{check_hex(key, 'key')}"

    def lock_file(self, key: str) -> Path:
        return self.locks / key[:2] / f"{check_hex(key, 'key')}.lock"


def entry_name(name: str) -> tuple[str, str] | None:
    """(key, variant) of an entry folder's name "<key>.<variant>"; None for any other name."""
    key, dot, variant = name.partition(".")
    if not dot or not is_hex(key) or not is_hex(variant):
        return None
    return key, variant


def name_digest(name: str) -> str:
    return sha256_hex(name.encode("utf-8"))[:32]
