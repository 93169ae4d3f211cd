"""How a lease holder proves that its build is getting somewhere: CPU time.

A lease renewed by a thread proves only that the process lives; a compiler
hung on a dead NFS mount, a builder waiting on a lock or a breakpoint would
hold the fleet as long as it likes. What a build does while it progresses is
burn CPU, in this process (a Python builder, Triton's compile) or in the
processes it started (gcc, nvcc, ld). So the lease carries the CPU seconds
spent by this process (less the renewing thread's own) and by every process
below it, alive or already reaped; waiters see that number stand still.

Read from /proc on Linux (one pass over /proc/<pid>/stat, about 2 ms for a
few hundred processes, every ttl/3 seconds); elsewhere from os.times() only,
which counts children once they have exited.
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
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0.0
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # exited while we looked
        fields = stat[stat.rfind(b")") + 2:].split()  # after the command name, which may hold spaces
        if len(fields) < 13:
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
