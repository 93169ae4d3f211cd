"""One-line progress on stderr for long work (builds), when someone is watching.

Shown when stderr is a terminal, or when ABICACHE_PROGRESS=1; never when
ABICACHE_PROGRESS=0. The CLI uses rich for bars; this stays dependency-free
because library calls print it.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator

from . import config


def enabled() -> bool:
    forced = config.tristate("ABICACHE_PROGRESS")
    if forced is not None:
        return forced
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def note(message: str) -> None:
    if enabled():
        print(f"abicache: {message}", file=sys.stderr, flush=True)


@contextmanager
def step(message: str, *, force: bool = False) -> Iterator[None]:
    """'abicache: building x ...' then 'done in 1.2 s' (or 'failed')."""
    show = force or enabled()
    if show:
        print(f"abicache: {message} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        if show:
            print(f"abicache: {message}: failed after {time.perf_counter() - start:.1f} s",
                  file=sys.stderr, flush=True)
        raise
    if show:
        print(f"abicache: {message}: done in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
