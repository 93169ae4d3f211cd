"""Asking the store's keeper (keeper.py) whether a large hit record still holds.

A torch extension's record holds ~600 witnesses of its build (the headers it read): a fresh
process checked them (1.6 ms on two threads) and armed its own watch of them (1-1.4 ms),
where the whole floor, importing the `.so` by path, is ~1 ms. The keeper, a process of this
user that watches them with inotify across processes, greets each process that connects
with its inotify instance and its state (SCM_RIGHTS); the process reads its record's slot
there, and asks the kernel and that state again, never the keeper, at each later call.

The address is an abstract Unix socket named from everything the keeper's verdicts depend
on: the user, the mount and user namespaces and the root folder (which files a path names),
the store's real root, the protocol and abicache's version. Each end checks the other's user
(SO_PEERCRED): an abstract name can be bound by anyone, answered only by this user's keeper.

Why a slot may be trusted (Vouched.find, Vouched.unchanged): inotify queues an event in the
system call that changes a file, before that call returns. The keeper bumps its state's
sequence number to odd before it reads events and to even after it has cleared the slots of
the records they touched, one pass at a time. A process that finds, in this order, nothing
queued on the instance (FIONREAD), the sequence even, and its record's generation in its slot
knows that every change made before it looked was read (the queue is empty), that the pass
which read it had finished (an even sequence after the read), so its clearing shows, and
that its record's was not among them. Anything else (an event in flight: it asks the keeper to catch up, once; a
keeper gone, whose queue then only grows) and the process checks for itself (record.py).

A call likely to ask (a torch extension's) connects first (reach), so that the keeper wakes
while the call is named and its record read. Nothing here imports more than os, sys, fcntl
and _socket (socket.py imports enum: ~1 ms where torch has not imported it).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any

    import socket  # _socket's, which the calls here use: socket.py imports enum, ~1 ms where torch is not imported

#: the protocol: bumped when a message or the state's layout changes meaning
FORMAT = b"abicache-keeper 1"
PREFIX = b"\0abicache-keeper-"
#: how long an asker waits for the keeper: its word saves ~3 ms; a keeper that takes longer
#: (descheduled on a loaded machine) is not waited for, the process checks itself
ASK_SECONDS = 0.02
#: the state: a 64-bit sequence number, then SLOTS records, each its generation (64 bits, 0:
#: none) and its tag (the first 24 bytes of the sha256 of its name and identity)
SEQUENCE = 8
SLOT = 32
SLOTS = 4096
#: the slots a record may be in, from the one its name starts at
PROBE = 8
#: FIONREAD where Linux's generic ioctl numbers hold (store/inotify.py _FIONREAD)
_FIONREAD = 0x541B


def wanted() -> bool:
    """Whether a keeper may be asked: not where ABICACHE_KEEPER is 0 (none is started then,
    and a hit pays no connection for it)."""
    value = os.environ.get("ABICACHE_KEEPER")
    if not value:
        return True
    try:
        return float(value) != 0
    except ValueError:
        return True  # the full lookup's settings check names the bad value


def address(real_root: str) -> bytes | None:
    """The keeper's abstract socket name for this store and this process's view of files;
    None where that view cannot be read."""
    from . import naming

    try:
        spaces = b",".join(os.fsencode(os.readlink(f"/proc/self/ns/{n}")) for n in ("mnt", "user"))
        top = os.stat("/")
    except OSError:
        return None
    from .._version import __version__

    parts = [FORMAT, b"%d" % os.geteuid(), spaces, b"%d:%d" % (top.st_dev, top.st_ino), os.fsencode(real_root),
             __version__.encode()]
    return PREFIX + naming._sha256_hex(b"\0\0".join(parts))[:40].encode()


def tag(record: str, identity: tuple[int, int, int, int]) -> bytes:
    """What a record's slot holds beside its generation: its name and the file's identity
    (naming.py's sha256: OpenSSL's where loaded, else CPython's own, without its start-up)."""
    from . import naming

    return bytes.fromhex(naming._sha256_hex(b"%s %d %d %d %d" % (record.encode(), *identity)))[:SLOT - 8]


def first_slot(record: str) -> int:
    return int(record[:8], 16) % SLOTS


class Greeting:
    """The keeper's inotify instance and its state, as this process holds them: one pair a
    store, kept for the process (a keeper that left keeps its instance alive through them,
    and any change then waits in its queue: nothing is trusted that it did not read)."""

    __slots__ = ("events", "state")

    def __init__(self, events: int, state: int) -> None:
        self.events, self.state = events, state

    def close(self) -> None:
        for fd in (self.events, self.state):
            if fd >= 0:
                os.close(fd)
        self.events = self.state = -1

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


class Vouched:
    """The keeper's word that a record's witnesses held, and the means to know, later in this
    process, that they still do (module docstring)."""

    __slots__ = ("_greeting", "_at", "_generation", "_pending")
    #: what record.py Served.warm asks of a watch: not None, asked once after the load
    marks = ()

    def __init__(self, greeting: Greeting) -> None:
        self._greeting = greeting
        self._at, self._generation = 0, 0
        self._pending = bytearray(4)

    def find(self, record: str, identity: tuple[int, int, int, int]) -> str:
        """Take the record's slot: "yes", "busy" (the keeper is reading events, or some wait
        for it: ask it to catch up, then look again) or "no" (it does not hold the record)."""
        state = self._greeting.state
        want, first = tag(record, identity), first_slot(record)
        start = SEQUENCE + SLOT * first
        if self._waiting() or os.pread(state, SEQUENCE, 0)[0] & 1:  # in this order: see unchanged
            return "busy"
        slots = os.pread(state, SLOT * min(PROBE, SLOTS - first), start)
        for at in range(0, len(slots), SLOT):
            if slots[at + 8:at + SLOT] == want:
                generation = int.from_bytes(slots[at:at + 8], "little")
                if generation:
                    self._at, self._generation = start + at, generation
                    return "yes"
        return "no"

    def unchanged(self) -> bool:
        """Whether nothing the keeper watches for the record changed since it vouched: one
        ioctl and two reads of its state, no round trip. The order is what makes it sound:
        nothing queued means the keeper has read every event made before this call, each in
        a pass that made the sequence odd before its read and even only after the slots it
        touched were cleared; so a sequence even after that shows every such clearing, and
        the slot read next is at least as new (module docstring)."""
        state = self._greeting.state
        try:
            if self._waiting() or os.pread(state, SEQUENCE, 0)[0] & 1:
                return False  # events wait for the keeper, or it is reading some
            return int.from_bytes(os.pread(state, 8, self._at), "little") == self._generation
        except OSError:
            return False

    def _waiting(self) -> bool:
        """Whether events wait in the keeper's queue (FIONREAD: bytes pending)."""
        global _ioctl
        if _ioctl is None:
            from fcntl import ioctl

            _ioctl = ioctl
        return bool(_ioctl(self._greeting.events, _FIONREAD, self._pending, True) or any(self._pending))


_ioctl: Any = None  # fcntl.ioctl, once asked (a call after the first: ~6 us in all)


#: real root -> the keeper's greeting this process holds (one a store)
_greeted: dict[str, Greeting] = {}
#: real root -> a connection made early (reach), not asked yet
_reached: dict[str, socket.socket] = {}


def reach(root: str) -> None:
    """Connect to the store's keeper now, where a call is likely to ask it (a torch
    extension's): it wakes and greets while this process names the call and reads its record
    (~0.3 ms of a ~1 ms floor). A connection no ask takes is closed by leave()."""
    if not wanted():
        return
    real = os.path.realpath(root)
    if real not in _reached:
        conn = _connect(real)
        if conn is not None:
            _reached[real] = conn


def leave() -> None:
    """Close the connections reach() made that no ask took."""
    while _reached:
        _reached.popitem()[1].close()


def _connect(real_root: str) -> socket.socket | None:
    name = address(real_root)
    if name is None:
        return None
    import _socket

    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        conn.settimeout(ASK_SECONDS)
        conn.connect(name)
    except OSError:
        conn.close()
        return None
    return conn


def ask(real_root: str, record: str, identity: tuple[int, int, int, int]) -> Vouched | None:
    """The keeper's word for the record (its name under hits/, and the inode, size, mtime and
    ctime of the file this process read), or None: no keeper, not this user's, one that does
    not hold the record at that identity (it is told to learn it: the next process is
    answered), or a change it saw. A process that was greeted before reads its state alone."""
    known = _greeted.get(real_root)
    if known is not None:
        vouched = Vouched(known)
        if vouched.find(record, identity) == "yes":
            return vouched
    conn = _reached.pop(real_root, None) or _connect(real_root)
    if conn is None:
        return None
    try:
        if peer(conn) != os.geteuid():
            return None
        greeting = greeted(conn)
        if greeting is None:
            return None
        _greeted[real_root] = greeting
        vouched = Vouched(greeting)
        found = vouched.find(record, identity)
        if found == "busy":
            conn.sendall(b"sync\n")  # it reads what is queued, then answers
            if line(conn) == b"ok":
                found = vouched.find(record, identity)
        if found == "yes":
            return vouched
        if found == "no":
            conn.sendall(b"learn %s\n" % record.encode())
        return None
    except (OSError, ValueError):
        return None  # none listening, one too slow, or an answer of another version
    finally:
        conn.close()


def greeted(conn: socket.socket) -> Greeting | None:
    """The keeper's greeting: its format, its inotify instance and its state; None where it is
    not this version's."""
    import _socket

    data, ancillary, _, _ = conn.recvmsg(len(FORMAT) + 1, _socket.CMSG_SPACE(2 * 4))
    fds: list[int] = []
    for level, kind, blob in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(blob[i:i + 4], sys.byteorder) for i in range(0, len(blob) - len(blob) % 4, 4)]
    if data != FORMAT + b"\n" or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return None
    return Greeting(fds[0], fds[1])


def line(conn: socket.socket) -> bytes:
    """One line of the keeper's, without its newline."""
    data = b""
    while not data.endswith(b"\n") and len(data) < 4096:
        more = conn.recv(4096)
        if not more:
            break
        data += more
    return data.rstrip(b"\n")


def peer(conn: socket.socket) -> int | None:
    """The user of the process at the other end (SO_PEERCRED: pid, uid, gid)."""
    import _socket

    try:
        cred = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    except OSError:
        return None
    return int.from_bytes(cred[4:8], sys.byteorder)
