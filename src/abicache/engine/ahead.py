"""Start the link when the last compiler exits, not when the last object is
published.

After its compiler exits, a unit's object is published as a cache entry of
its own: hashed, fsynced, its manifest written and renamed into place (about
10 ms on the critical path, measured with bench/build.py; ninja starts the
linker at once). The linker needs only the object's bytes, so the jobs of
the last round hand their object files over as soon as they exist, the link
starts once every unit's is there, and their publishing goes on beside the
link. (Earlier rounds hand over their published objects: an early hand-over
costs a copy of the object when it is published.) The jobs' result (and
their first error) is still waited for before the build ends.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

from . import interrupt

R = TypeVar("R")


class Ahead(Generic[R]):
    """jobs() in a thread; files() waits for the count files they hand over."""

    def __init__(self, count: int) -> None:
        self._files: list[str | None] = [None] * count
        self._changed = threading.Condition()
        self._over = False
        self._outcome: list[R] = []
        self._error: list[BaseException] = []
        self._thread: threading.Thread | None = None

    def start(self, jobs: Callable[[], R]) -> None:
        def body() -> None:
            try:
                self._outcome.append(jobs())
            except BaseException as exc:  # raised by result(), in the caller's thread
                self._error.append(exc)
            finally:
                with self._changed:
                    self._over = True
                    self._changed.notify_all()

        self._thread = threading.Thread(target=body, name="abicache-units", daemon=True)
        self._thread.start()

    def put(self, index: int, path: str) -> None:
        """Unit index's object is at path (the first one handed over is kept)."""
        with self._changed:
            if self._files[index] is None:
                self._files[index] = path
                self._changed.notify_all()

    def missing(self) -> int:
        """How many units have not handed an object over yet."""
        with self._changed:
            return sum(1 for f in self._files if f is None)

    def files(self) -> list[str] | None:
        """Every unit's object file, or None when the jobs ended without them (a failure)."""
        with self._changed:
            interrupt.wait_in_slices(lambda seconds: self._changed.wait_for(
                lambda: self._over or all(f is not None for f in self._files), seconds))
            return None if any(f is None for f in self._files) else [str(f) for f in self._files]

    def abandon(self, seconds: float) -> None:
        """Give the jobs seconds to end (their compilers were stopped), and leave their outcome."""
        if self._thread is not None:
            self._thread.join(seconds)

    def result(self) -> R:
        """The jobs' result once they end; their error, if they failed."""
        assert self._thread is not None
        interrupt.wait_in_slices(interrupt.joined(self._thread))
        if self._error:
            raise self._error[0]
        return self._outcome[0]
