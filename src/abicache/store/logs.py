"""A store's logs (log/<name>.jsonl: stats, misses, check verdicts, remote refusals):
bounded in size, and opened so that nothing left in their folder can hang or
redirect a writer.

Each line is appended with one write (O_APPEND: lines of concurrent processes
never interleave). A log past MAX_BYTES is moved aside before the next line
(one rename: a writer that opened it before finishes its line there) and
becomes <name>.1.jsonl, the one older generation kept: a log takes at most
about 2 x MAX_BYTES. A log whose lines add up (stats) is compacted into one
line instead of dropped, so its totals survive rotation.

A log is opened without following a link (O_NOFOLLOW), without waiting on a
FIFO (O_NONBLOCK), and used only if fstat says it is a regular file; anything
else at a log's name is removed (the folder is the store's own) and the line
goes to a fresh file. A log only informs: every failure here is ignored.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Callable, Sequence

#: a log's size before it is moved aside
MAX_BYTES = 1 << 20
_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

#: lines -> the lines to keep for them (stats: their sums in one line)
if TYPE_CHECKING:
    Compact = Callable[[Sequence[str]], Sequence[str]]


def path(folder: Path, name: str) -> Path:
    return folder / f"{name}.jsonl"


def append(folder: Path, name: str, lines: Sequence[str], mode: int, compact: Compact | None = None) -> None:
    """Append lines to log/<name>.jsonl in one write, rotating it first where it is full."""
    target = path(folder, name)
    data = "".join(line.rstrip("\n") + "\n" for line in lines).encode()
    try:
        _rotate(folder, name, compact)
        for _ in range(2):
            try:
                fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _FLAGS, mode)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO nobody reads
                    raise
            else:
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        os.write(fd, data)
                        return
                finally:
                    os.close(fd)
            os.unlink(target)  # not a log: removed, never written through or waited on
    except OSError:
        pass  # a log only informs (`abicache stats`, `explain`): never a reason to fail


def read(folder: Path, name: str) -> list[str]:
    """The lines of the older generation, then of the current one (regular files only)."""
    return [*_lines(path(folder, f"{name}.1")), *_lines(path(folder, name))]


def _lines(file: Path) -> list[str]:
    try:
        fd = os.open(file, os.O_RDONLY | _FLAGS)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        data = b""
        while len(data) <= 4 * MAX_BYTES and (chunk := os.read(fd, 1 << 20)):
            data += chunk
        return data.decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    finally:
        os.close(fd)


def _rotate(folder: Path, name: str, compact: Compact | None) -> None:
    target = path(folder, name)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_size <= MAX_BYTES:
        return
    moving = folder / f".{name}.rotating.{os.getpid()}"
    try:
        os.rename(target, moving)  # one process wins; a late writer's line lands in `moving`
    except FileNotFoundError:
        return  # another process rotated it first
    older = path(folder, f"{name}.1")
    if compact is None:
        os.replace(moving, older)
        return
    kept = compact([*_lines(older), *_lines(moving)])
    temp = folder / f".{name}.1.{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _FLAGS, 0o600)
    try:
        os.write(fd, "".join(line + "\n" for line in kept).encode())
    finally:
        os.close(fd)
    os.chmod(temp, stat.S_IMODE(st.st_mode))
    os.replace(temp, older)
    os.unlink(moving)


def remove(folder: Path, name: str) -> None:
    """Both generations (`abicache stats --zero`)."""
    for generation in (f"{name}.1", name):
        try:
            os.unlink(path(folder, generation))
        except FileNotFoundError:
            pass
