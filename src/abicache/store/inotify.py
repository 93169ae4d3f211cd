"""The inotify calls the in-process watch makes (store/watch.py): inotify_init1,
inotify_add_watch, and a non-blocking read after asking how many bytes are pending
(FIONREAD), through the running program's libc.

inotify_simple made the same calls, but importing it imported enum, termios and
ctypes.util (hence subprocess and locale): 8 to 16 ms of the second call of a process,
which arms the watch, against 0.3 ms for this module (bench: docs/benchmarks.md, the
second call). tests/test_depcheck.py checks its events against inotify_simple's where
that is installed.
"""

from __future__ import annotations

import ctypes
import os
import struct

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_DONT_FOLLOW = 0x02000000
IN_MASK_ADD = 0x20000000

#: struct inotify_event: wd, mask, cookie, len, then len bytes of name
_EVENT = struct.Struct("iIII")
_BUFFER = 64 * 1024
#: FIONREAD where Linux's generic ioctl numbers hold (elsewhere the read alone answers)
_FIONREAD = 0x541B if os.uname().machine.startswith(("x86", "i686", "i386", "aarch64", "arm", "riscv", "s390",
                                                      "loongarch")) else None


class Inotify:
    """One inotify instance (close-on-exec, non-blocking)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)  # the libc this process runs with: no search
        self._add = libc.inotify_add_watch
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._add.restype = ctypes.c_int
        fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        self.fd = fd
        # A call after the first asks whether events are pending: an ioctl answers without
        # the read's EAGAIN, whose exception cost ~3 us warm and 30-60 us just after the
        # process was idle (most calls find no event; bench/hit_floor.py's second call).
        self._ioctl = libc.ioctl
        self._pending = ctypes.c_int()
        self._pending_ref = ctypes.byref(self._pending)

    def add_watch(self, path: str, mask: int) -> int:
        """The watch descriptor of path (the same one again for a path already watched)."""
        wd = self._add(self.fd, os.fsencode(path), mask)
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
        return wd

    def pending(self) -> int | None:
        """Bytes of events queued now; None where FIONREAD cannot tell."""
        if _FIONREAD is None or self._ioctl(self.fd, _FIONREAD, self._pending_ref):
            return None
        return self._pending.value

    def read(self) -> list[tuple[int, int]]:
        """(watch descriptor, mask) of every event pending now; [] when there is none."""
        events: list[tuple[int, int]] = []
        if _FIONREAD is not None and not self._ioctl(self.fd, _FIONREAD, self._pending_ref) \
                and not self._pending.value:
            return events
        while True:
            try:
                data = os.read(self.fd, _BUFFER)
            except BlockingIOError:
                return events
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                events.append((wd, mask))
                offset += _EVENT.size + length

    def close(self) -> None:
        fd = self.detach()
        if fd >= 0:
            os.close(fd)

    def detach(self) -> int:
        """The descriptor, which this object no longer uses nor closes (-1: closed already)."""
        fd, self.fd = self.fd, -1
        return fd
