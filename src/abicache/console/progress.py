"""One-line progress on stderr for long work (builds), when someone is watching.

Shown when stderr is a terminal, or when ABICACHE_PROGRESS=1; never when
ABICACHE_PROGRESS=0. Without a terminal (a CI log) and unforced, only work
that runs longer than LONG_SECONDS is reported, and at most a line that often:
a 60 s build says so in the log, a 50 ms one stays silent. The CLI uses rich
for bars; this stays dependency-free because library calls print it.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from ..settings import config


#: without a terminal, work is reported once it has run this long, and then at most this often
LONG_SECONDS = 10.0


def mode() -> str:
    """'on' (a terminal, or forced), 'off' (forced), or 'long' (a log: long work only)."""
    forced = config.tristate("ABICACHE_PROGRESS")
    if forced is not None:
        return "on" if forced else "off"
    return "on" if getattr(sys.stderr, "isatty", lambda: False)() else "long"


def enabled() -> bool:
    return mode() == "on"


def note(message: str) -> None:
    if enabled():
        say(message)


def say(message: str) -> None:
    """One line on stderr, whatever the mode (the caller has decided)."""
    print(f"abicache: {message}", file=sys.stderr, flush=True)


@contextmanager
def step(message: str, *, force: bool = False) -> Iterator[None]:
    """'abicache: building x ...' then 'done in 1.2 s' (or 'failed'); in a log,
    only once it has run LONG_SECONDS."""
    show = force or enabled()
    if show:
        print(f"abicache: {message} ...", file=sys.stderr, flush=True)
    late = _Late(message) if not show and mode() == "long" else None
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        if show or (late is not None and late.stop()):
            print(f"abicache: {message}: failed after {time.perf_counter() - start:.1f} s",
                  file=sys.stderr, flush=True)
        raise
    if show or (late is not None and late.stop()):
        print(f"abicache: {message}: done in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)


class _Late:
    """In a log: prints a step's first line once it has run LONG_SECONDS."""

    def __init__(self, message: str) -> None:
        import threading

        self.fired = False
        self.timer = threading.Timer(LONG_SECONDS, self._fire, args=(message,))
        self.timer.daemon = True
        self.timer.start()

    def _fire(self, message: str) -> None:
        self.fired = True
        print(f"abicache: {message} ... ({LONG_SECONDS:.0f} s so far)", file=sys.stderr, flush=True)

    def stop(self) -> bool:
        """Whether the first line was printed (then the last one is owed)."""
        self.timer.cancel()
        return self.fired


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
