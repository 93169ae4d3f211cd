"""One-line progress on stderr for long work (builds), when someone is watching.

Shown when stderr is a terminal, or when ABICACHE_PROGRESS=1; never when
ABICACHE_PROGRESS=0. The CLI uses rich for bars; this stays dependency-free
because library calls print it.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

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


Advance = Callable[[int], None]


@contextmanager
def bar(label: str, total: int, *, show: bool = True) -> Iterator[Advance]:
    """A byte-count bar for a transfer: redrawn in place on a terminal, a line
    per quarter otherwise (logs). Yields advance(n)."""
    if not (show and enabled()):
        yield _ignore
        return
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    start = time.perf_counter()
    state = {"done": 0, "drawn": 0.0, "quarter": 0}

    def draw(final: bool = False) -> None:
        done, now = state["done"], time.perf_counter()
        rate = done / max(now - start, 1e-6) / (1 << 20)
        text = f"abicache: {label} {100 * done / max(total, 1):3.0f}% {done / (1 << 20):.1f}/" \
               f"{total / (1 << 20):.1f} MiB {rate:.0f} MiB/s"
        if tty:
            print("\r" + text, end="\n" if final else "", file=sys.stderr, flush=True)
        else:
            print(text, file=sys.stderr, flush=True)
        state["drawn"] = now

    def advance(n: int) -> None:
        state["done"] += n
        if tty and time.perf_counter() - state["drawn"] >= 0.1:
            draw()
        quarter = 4 * state["done"] // max(total, 1)
        if not tty and quarter > state["quarter"] and state["done"] < total:
            state["quarter"] = quarter
            draw()

    yield advance
    draw(final=True)


def _ignore(n: int) -> None:
    pass
