"""Run translation units as parallel jobs, with progress lines.

At most MAX_JOBS compilers run at once (as torch's cpp_extension reads it),
else one per core; the build engine runs twice as many workers (see
compilers()). Jobs are threads that wait on compiler processes. The first
failure stops new jobs from starting and is raised once the running ones end.
Progress goes to stderr when wanted (see progress.py): a line as each unit
finishes, with the count and the slowest one still running, at most one a
second unless it is the last (in a log, only after progress.LONG_SECONDS, and
at most that often).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Sequence, TypeVar

from ..console import progress
from ..errors import ConfigError
from . import interrupt

T = TypeVar("T")
R = TypeVar("R")


def max_jobs() -> int:
    from ..settings import config

    raw = config.text("MAX_JOBS")  # the environment (as torch reads it), or a config file's max_jobs
    if not raw:
        return max(1, os.cpu_count() or 1)
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"MAX_JOBS={raw!r} is not a positive number of parallel compile jobs")
    return int(raw)


def compilers(run: Callable[..., None]) -> Callable[..., None]:
    """run, with at most max_jobs() compiler processes at once. Run on a pool of
    twice as many workers, while max_jobs compilers run the others have done
    a unit's lookup and locking and wait here, so a compiler starts the moment
    one exits, and each finished unit's bookkeeping (depfile, hashes, publish)
    overlaps the next compile instead of delaying it (about 30 ms a unit on
    the critical path, measured on 2 cores)."""
    slots = threading.BoundedSemaphore(max_jobs())

    def limited(*args: object, **kwargs: object) -> None:
        with slots:
            run(*args, **kwargs)

    return limited


def run(fn: Callable[[T], R], items: Sequence[T], label: Callable[[T], str], what: str,
        workers: int | None = None) -> list[R]:
    """fn over items on workers threads (default max_jobs(); the build engine uses
    twice that around compilers()); results in the order of items."""
    if len(items) == 1:
        return [fn(items[0])]
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    watch = _Watch(what, len(items), progress.mode())

    def job(item: T) -> R:
        if watch.failed or interrupt.stopping():
            raise _Skipped()
        watch.start(label(item))
        try:
            return fn(item)
        finally:
            watch.finish(label(item))

    with ThreadPoolExecutor(min(workers or max_jobs(), len(items)), thread_name_prefix="abicache-build") as pool:
        futures = [pool.submit(job, item) for item in items]

        def settled(seconds: float) -> bool:  # all done, or one failed
            done, pending = wait(futures, seconds, return_when=FIRST_EXCEPTION)
            return not pending or any(f.exception() for f in done)

        interrupt.wait_in_slices(settled)  # in slices: a signal is handled at once (interrupt.py)
        if any(f.exception() for f in futures if f.done()):
            watch.failed = True
        interrupt.wait_in_slices(lambda seconds: not wait(futures, seconds)[1])
    errors = [f.exception() for f in futures if f.exception() and not isinstance(f.exception(), _Skipped)]
    if errors:
        raise errors[0]  # type: ignore[misc]
    return [f.result() for f in futures]


class _Skipped(Exception):
    pass


class _Watch:
    def __init__(self, what: str, total: int, mode: str) -> None:
        self.what, self.total = what, total
        self.show, self.log = mode != "off", mode == "long"
        # a terminal: a line a second; a log: only once LONG_SECONDS have passed, and that often
        self.every = 1.0 if mode == "on" else progress.LONG_SECONDS
        self.done = 0
        self.failed = False
        self.running: dict[str, float] = {}
        self.lock = threading.Lock()
        self.said = 0.0
        self.began = time.perf_counter()

    def start(self, name: str) -> None:
        with self.lock:
            self.running[name] = time.perf_counter()

    def finish(self, name: str) -> None:
        with self.lock:
            self.running.pop(name, None)
            self.done += 1
            now = time.perf_counter()
            if not self.show or (now - self.said < self.every and self.done < self.total):
                return
            if self.log and now - self.began < self.every:
                return  # a log, and not long work
            self.said = now
            line = f"compiling {self.what}: {self.done}/{self.total} units, {now - self.began:.1f} s"
            if self.running:
                slowest, since = min(self.running.items(), key=lambda kv: kv[1])
                line += f" (slowest running: {slowest}, {now - since:.1f} s)"
            progress.say(line)
