"""Where everything lives under a store root (versioned: <root>/v1/...)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import NamedTuple

LAYOUT_VERSION = "v1"
#: the folders under <root>/v1, made (and checked) by Store.ensure
FOLDERS = ("entries", "blobs", "tmp", "locks", "quarantine", "trash", "index", "log", "tools")
_KIND = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_HEX = re.compile(r"^[0-9a-f]{16,64}$")


def check_kind(kind: str) -> str:
    if not _KIND.match(kind):
        raise ValueError(f"artifact kind {kind!r} must be lower-case letters, digits, '.', '_', '-'")
    return kind


def check_hex(value: str, what: str) -> str:
    if not _HEX.match(value):
        raise ValueError(f"{what} {value!r} is not a lower-case hex digest")
    return value


class Layout(NamedTuple):
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
    def tools(self) -> Path:
        return self.base / "tools"

    def key_dir(self, kind: str, key: str) -> Path:
        # one Path made from one string: four joins cost more than the lookup's stats
        return Path(f"{os.fspath(self.root)}/{LAYOUT_VERSION}/entries/{check_kind(kind)}/{key[:2]}/"
                    f"{check_hex(key, 'key')}")

    def variant_dir(self, kind: str, key: str, variant: str) -> Path:
        return self.key_dir(kind, key) / check_hex(variant, "variant")

    def blob(self, sha256: str, executable: bool) -> Path:
        name = check_hex(sha256, "sha256") + ("x" if executable else "")
        return self.blobs / sha256[:2] / name

    def name_marker(self, kind: str, name: str, key: str) -> Path:
        """The index's record that key was built under (kind, name): an empty file named
        <name digest>.<key> in a folder of 256 (no block of its own, unlike a folder per name)."""
        digest = name_digest(name)
        return self.index / check_kind(kind) / digest[:2] / f"{digest}.{check_hex(key, 'key')}"

    def name_dir(self, kind: str, name: str) -> Path:
        """The index's folder per (kind, name) of stores written before name_marker: still read."""
        return self.index / check_kind(kind) / name_digest(name)

    def lock_file(self, key: str) -> Path:
        return self.locks / key[:2] / f"{check_hex(key, 'key')}.lock"


def name_digest(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
