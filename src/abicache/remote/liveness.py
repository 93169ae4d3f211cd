"""How a lease holder proves that its build is getting somewhere: CPU time.

A lease renewed by a thread proves only that the process lives; a compiler
hung on a dead NFS mount, a builder waiting on a lock or a breakpoint would
hold the fleet as long as it likes. What a build does while it progresses is
burn CPU, in this process (a Python builder, Triton's compile) or in the
processes it started (gcc, nvcc, ld). So the lease carries the CPU seconds
spent by this process (less the renewing thread's own) and by every process
below it, alive or already reaped; waiters see that number stand still.

Read from /proc on Linux (each thread's list of children, down the tree, every
ttl/3 seconds; a pass over every /proc/<pid>/stat where the kernel keeps no such
lists); elsewhere from os.times() only, which counts children once they have exited.
"""

from __future__ import annotations

import os
import time

#: a change smaller than this is not progress (the clock's tick, and the renewal's own calls)
NOISE = 0.05
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds() -> float:
    """CPU seconds of this process's other threads and all its descendants. Call it
    from the renewing thread: its own time is left out."""
    own = time.process_time() - time.thread_time()
    reaped = os.times()
    return own + reaped.children_user + reaped.children_system + _live_descendants()


def _live_descendants() -> float:
    """utime + stime of every process below this one that has not been reaped yet."""
    if _CHILDREN_LISTED:
        return _walk_children()
    return _scan_all()


def _walk_children() -> float:
    """From this process down, through each thread's list of children (/proc/<pid>/task/<tid>/
    children): a few reads for a build of a few processes. Every system call here waits for the
    interpreter lock to come back, and a builder burning CPU in Python holds it for 5 ms at a
    time (sys.getswitchinterval()): a pass over all of /proc took 1-2 s so (the renewal came
    too late and the lease looked dead), this takes milliseconds."""
    me, total, seen = os.getpid(), 0, set()
    pending = _children(me)
    while pending and len(seen) < 4096:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        fields = _stat_fields(pid)
        if fields is None:
            continue  # exited while we looked (its time is in os.times() once reaped)
        total += int(fields[11]) + int(fields[12])
        pending += _children(pid)
    return total / _TICK


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        data = _read(f"/proc/{pid}/task/{tid}/children")
        if data:
            found += [int(child) for child in data.split()]
    return found


def _stat_fields(pid: int) -> list[bytes] | None:
    data = _read(f"/proc/{pid}/stat")
    if data is None:
        return None
    fields = data[data.rfind(b")") + 2:].split()  # after the command name, which may hold spaces
    return fields if len(fields) >= 13 else None


def _read(path: str) -> bytes | None:
    """A small /proc file in three system calls (open() takes more)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 65536)
    except OSError:
        return None
    finally:
        os.close(fd)


def _scan_all() -> float:
    """Where the kernel lists no children (CONFIG_PROC_CHILDREN off): every process's parent, one pass."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0.0
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in names:
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is None:
            continue
        pid = int(name)
        parent[pid] = int(fields[1])
        ticks[pid] = int(fields[11]) + int(fields[12])
    me, total = os.getpid(), 0
    for pid in ticks:
        up, seen = parent.get(pid, 0), 0
        while up > 1 and up != me and seen < 64:
            up, seen = parent.get(up, 0), seen + 1
        if up == me and pid != me:
            total += ticks[pid]
    return total / _TICK


#: whether this kernel lists each thread's children (Linux 3.5+ with CONFIG_PROC_CHILDREN)
_CHILDREN_LISTED = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
