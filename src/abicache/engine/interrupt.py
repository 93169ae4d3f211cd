"""Ctrl-C and SIGTERM stop a build at once: every compiler gone within a second.

Each compiler runs in a process group of its own (so a terminal's Ctrl-C,
sent to the foreground group, reaches abicache and not the compilers: a
compiler killed by it would be reported as a failed build). While it runs it
is registered here. When the build's own thread is interrupted
(KeyboardInterrupt) or the process gets SIGTERM, stop() marks this process
as stopping and sends SIGTERM to every registered group, then SIGKILL to the
groups still there half a second later. A compile asked for after that, or
one whose compiler was stopped, raises Stopped rather than BuildError: it
is not the build's failure, and is never shared with the fleet as one.

Without this, Ctrl-C in a 4-unit build went on compiling for 15-18 s (the
build waited for every queued unit) and ended in a 108-line traceback naming
`BuildError (exit -2)`.

A build killed by SIGKILL runs none of this: the observer (observe.c) has the command
abicache started die with the thread that started it (the parent-death signal), and
one that abicache's death orphaned before the observer ran die as it starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..errors import AbicacheError

#: how long a stopped compiler's group has for SIGTERM before SIGKILL
GRACE = 0.5

#: the longest a build's thread sleeps in one wait. The kernel hands a process's signal to any
#: thread that does not block it, and Python runs the handler (KeyboardInterrupt, SIGTERM's
#: below) in the main thread only when that thread runs again: a wait without a bound, for a
#: compiler or for the units, put Ctrl-C off until the compilers were done (20 s in the tests).
SLICE = 0.1

_running: set[subprocess.Popen[Any]] = set()
_lock = threading.Lock()
_stopping = threading.Event()


class Stopped(AbicacheError):
    """A compile that did not run, or was killed, because the build was interrupted."""


def stopping() -> bool:
    return _stopping.is_set()


def wait_in_slices(done: Callable[[float], bool]) -> None:
    """done(SLICE) until it returns True: a signal another thread received is handled
    within SLICE in the main thread (each wait ends, the handler runs, raises there)."""
    while not done(SLICE):
        pass


def joined(thread: threading.Thread) -> Callable[[float], bool]:
    """For wait_in_slices: thread has ended."""
    def done(seconds: float) -> bool:
        thread.join(seconds)
        return not thread.is_alive()
    return done


@contextmanager
def running(proc: subprocess.Popen[Any]) -> Iterator[None]:
    """proc registered while it runs; killed with its group if the caller is interrupted.
    One started while stop() ran (after the caller's check, before it was registered
    here) is killed at once: stop() did not see it."""
    with _lock:
        _running.add(proc)
        late = _stopping.is_set()
    if late:
        _signal_group(proc, signal.SIGKILL)
    try:
        yield
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        with _lock:
            _running.discard(proc)


def stop() -> None:
    """Stop every compiler this process runs, and every compile it would start."""
    _stopping.set()
    with _lock:
        procs = list(_running)
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)


def resume() -> None:
    """Builds may start again, once the interrupted one has unwound (no compiler of it
    still runs): a REPL or a notebook goes on after Ctrl-C."""
    with _lock:
        if not _running:
            _stopping.clear()


@contextmanager
def sigterm_stops_compilers() -> Iterator[None]:
    """While a build runs in the main thread, SIGTERM (left at its default, which kills
    this process at once, its compilers left running and its scratch left behind)
    stops the compilers and ends the process by SystemExit(143): the build unwinds,
    its stage and scratch folders are removed, and the exit status is the shell's
    for SIGTERM."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _terminated(signum: int, frame: Any) -> None:
    stop()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once, as before
    sys.stderr.write("abicache: terminated (SIGTERM); the build's compilers were stopped\n")
    raise SystemExit(128 + signal.SIGTERM)


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    _signal_group(proc, signal.SIGKILL)
    try:
        proc.wait(GRACE)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the compiler and what it started (cc1plus, as, ld)
    except (ProcessLookupError, PermissionError):
        pass
