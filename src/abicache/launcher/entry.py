"""One compile's entry as the launcher keeps it: the names of its files, what a compile
printed, and a failed compile (the builder, compiling.py, is imported only by a miss)."""

from __future__ import annotations

import os

from ..errors import BuildError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Sequence

#: the names of an entry's files besides its outputs
STDOUT, STDERR = "stdout", "stderr"


def write_out(stdout: bytes, stderr: bytes) -> None:
    """What the compiler printed, printed whole to this process's stdout and stderr."""
    for fd, data in ((1, stdout), (2, stderr)):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


def output_name(index: int) -> str:
    return f"output-{index}"


class Failed(BuildError):
    """The compiler failed: nothing is cached; its status and output are the launcher's."""

    def __init__(self, argv: Sequence[str], status: int, stdout: bytes, stderr: bytes) -> None:
        super().__init__(f"the compiler exited with status {status}", command=tuple(argv))
        self.status, self.stdout, self.stderr = status, stdout, stderr


class Ran:
    """What the compile printed, once it has run (the launcher replays it even where the
    entry could not be published)."""

    def __init__(self, early: Callable[[], None] | None = None) -> None:
        self.stdout: bytes | None = None
        self.stderr = b""
        #: the warm launcher's answer to the front (launcher/warm.py), once the outputs are kept
        self.early, self.answered = early, False

    def answer(self) -> None:
        """Where a warm launcher serves: print what the compile printed and answer the front
        now (the outputs are in place and kept in the entry's stage); the rest of the miss
        goes on without the build waiting."""
        if self.early is None or self.answered or self.stdout is None:
            return
        write_out(self.stdout, self.stderr)
        self.answered = True
        self.early()
