"""Entries found by what was asked for, where the tools that would build them are absent.

The key includes the identity of each tool (compiler version and target), so a
compiler upgrade rebuilds: a hit is what a fresh build here would make. Where
a key's tool is absent here (no compiler on PATH, as in a container that only
runs what was built), no fresh build can be made, and nothing could be
compared with one. Then an entry is looked up by what was asked for -- kind,
name, source bytes, flags and settings, everything of the key but the tools'
identities -- and its requirements, read from the binary, decide whether it
may load, as they do for every hit. Its recorded dependencies (headers, the
compiler's environment, files looked for and not found) must still hold.

This looks only at the same (kind, name)'s entries, through the store's
name index: no index of its own, nothing written when a compiler is present.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterator, Mapping

from . import Store

#: variants of one name looked at, at most: a name rebuilt under many keys is not read whole
MAX_VARIANTS = 256


def tools_absent(described: Mapping[str, Any]) -> bool:
    """Whether a tool of the key is absent here (its identity is None)."""
    return any(value is None for value in described.get("tools", {}).values())


def asked(described: Mapping[str, Any]) -> dict[str, Any]:
    """The described inputs without who would produce them."""
    return {name: value for name, value in described.items() if name != "tools"}


def candidates(store: Store, kind: str, name: str) -> Iterator[Path]:
    """The variant folders to compare: every key built under this name (bounded)."""
    return itertools.islice(store.iter_name_variants(kind, name), MAX_VARIANTS)
