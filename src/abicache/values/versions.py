"""Version ordering for requirement checks, fast on the hit path.

`packaging.version` costs ~2.5 ms to import (it compiles a large regex), more
than the whole budget of a first cache hit. Versions seen on the hit path are
nearly always plain releases with an optional local tag (`2.36`, `3.4.30`,
`2.13.0+cpu`), so those take a small parser here; anything else (`2.10.0a0`,
`1!2.0`, `.post1`) falls back to packaging. Tests cross-check the two orderings.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any


_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


def _simple(text: str) -> tuple[str, str | None] | None:
    """(release, local or None) of `v?N(.N)*(+LOCAL)?` with LOCAL's segments of [a-z0-9]
    separated by one of '._-', as a pattern would read it (without compiling one: this
    runs on a fresh process's first hit); None for anything else."""
    release, plus, local = text.removeprefix("v").partition("+")
    if not all(part.isdecimal() for part in release.split(".")):  # as \d: Unicode digits, not ''
        return None
    if plus and not all(part and not part.strip(_ALNUM) for part in _local_parts(local)):
        return None
    return release, local if plus else None


def _local_parts(local: str) -> list[str]:
    return local.replace("_", ".").replace("-", ".").split(".")


def _local_key(local: str) -> tuple[tuple[int, int, str], ...]:
    # packaging orders numeric local segments above alphanumeric ones.
    return tuple((1, int(p), "") if p.isdigit() else (0, 0, p) for p in _local_parts(local))


def sort_key(text: str) -> tuple[Any, ...]:
    """A key that orders versions as PEP 440 does.

    Raises ValueError for a string that is not a version.
    """
    simple = _simple(text.strip().lower())
    if simple is None:
        return (1, _packaging_version(text))
    release = [int(p) for p in simple[0].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    local = simple[1]
    return (0, tuple(release), (1, _local_key(local)) if local else (0, ()))


def _packaging_version(text: str) -> Any:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        raise ValueError(f"{text!r} is not a version") from None


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as version a is lower than, equal to or higher than b."""
    ka, kb = sort_key(a), sort_key(b)
    if ka[0] != kb[0]:
        # One side needs packaging: compare both with it so the orders agree.
        va, vb = _packaging_version(a), _packaging_version(b)
        return (va > vb) - (va < vb)
    return (ka > kb) - (ka < kb)


def is_version(text: str) -> bool:
    try:
        sort_key(text)
    except ValueError:
        return False
    return True
