"""The warm launcher: an interpreter that has imported what a compile's miss needs, whose
forks serve the native front's misses, so that a miss no longer pays Python's start and its
~160 imports (~120 ms of a 0.5 s compile on a 2-core machine; ccache's whole miss costs
~15% of such a compile).

A front that finds no record (front.c) connects to `address()`, an abstract Unix socket
named from everything a fork would otherwise get wrong: the user, groups, namespaces and
control group, the root folder, abicache's version, the interpreter and the folder abicache
is imported from, and the variables that decide what that interpreter imports and how it
decodes names (`PYTHON*`, `HOME`, `LANG`, `LC_*`). A fork runs the compile in the server's
session and under its resource limits (`ulimit`), not the build's.
Each end checks the other's user (SO_PEERCRED). The front sends its working directory,
standard streams, umask, command and whole environment; a fork of the server takes them
all as its own and runs the launcher (launcher/run.py) as `abicache COMPILER ARGS...`
would. It answers the front `pid N` (where the front forwards the signals it gets), then
`status N`, or `exec` for a command the cache cannot serve (the front runs it itself, as
written). Once a miss's outputs are in place and kept in the entry's stage (what the
compile printed is printed), the front is answered and the rest of the miss (the record,
the entry's publication) goes on in the fork, detached from the build's output.

No answer at all (no server, another user's, a fork that died) runs the launcher in Python
as before, which starts a server for the next compile (`after()`). A server exits after
IDLE_SECONDS without a compile, or when a file of abicache's it imported changed. A build
the observer watches (ABICACHE_TRACE_FD: abicache building a project that calls the
launcher) never uses one: its compiles must run where the observer sees them. Nor does a
build with ABICACHE_WARM=0.
"""

from __future__ import annotations

import os
import sys

from .. import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Mapping

FORMAT = b"abicache-warm 1"
PREFIX = b"\0abicache-warm-"
#: seconds a server waits for a compile before it exits
IDLE_SECONDS = 30.0
#: how long a fork waits for the front's request (a front sends it at once)
REQUEST_SECONDS = 10.0
#: the request's size at most (the command and the environment)
MAX_REQUEST = 16 << 20
#: what a miss imports, imported by the server before it forks (a module missing here is
#: imported by the fork: slower, never wrong)
PRELOAD = ("abicache.cli", "abicache.launcher.run", "abicache.launcher.compiling", "abicache.launcher.records",
           "abicache.core.cache", "abicache.core.getting", "abicache.core.key", "abicache.core.making",
           "abicache.core.explain", "abicache.engine.steer", "abicache.env.probes", "abicache.env.toolid",
           "abicache.hits.writer", "abicache.store.counters", "abicache.store.lock", "abicache.engine.record",
           "abicache.engine.observe", "abicache.engine.depfile", "abicache.engine.units", "abicache.core.finding",
           "abicache.core.single_flight", "abicache.store.listing_log", "abicache.store.logs", "subprocess",
           "tempfile", "shutil")


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether compiles here may be served by a warm launcher (front.c asks the same)."""
    return environ.get("ABICACHE_WARM", "") != "0" and "ABICACHE_TRACE_FD" not in environ


def address(environb: Mapping[bytes, bytes] | None = None) -> bytes | None:
    """The server's abstract socket name for this process's identity, as front.c computes it;
    None where a part of it cannot be read."""
    import hashlib

    from .front import PACKAGE_PARENT

    environb = os.environb if environb is None else environb
    try:
        spaces = b",".join(os.fsencode(os.readlink(f"/proc/self/ns/{n}")) for n in ("mnt", "pid", "user"))
        root = os.stat("/")
        with open("/proc/self/cgroup", "rb") as file:
            cgroup = file.read(4095)  # front.c: its buffer less its NUL
    except OSError:
        return None
    groups = b",".join(b"%d" % g for g in sorted(os.getgroups()))
    chosen = sorted(k + b"=" + v for k, v in environb.items() if _chosen(k))
    parts = [FORMAT, b"%d" % os.getuid(), b"%d" % os.getgid(), groups, spaces, b"%d:%d" % (root.st_dev, root.st_ino),
             cgroup.partition(b"\0")[0], __version__.encode(), os.fsencode(sys.executable),
             os.fsencode(repr(PACKAGE_PARENT)), *chosen]
    return PREFIX + hashlib.sha256(b"\0\0".join(parts)).hexdigest()[:40].encode()  # front.c add_part()


def _chosen(name: bytes) -> bool:
    """The variables that decide what an interpreter imports and how it decodes names: a
    fork serves only fronts where they are the server's."""
    return name.startswith((b"PYTHON", b"LC_")) or name in (b"HOME", b"LANG")


def after(status: int) -> int:
    """The front's way out of Python where no server answered (`abicache COMPILER ARGS...`
    ran): a server started for the next compile; the launcher's status."""
    try:
        start()
    except Exception:  # noqa: BLE001  a server only saves time
        pass
    return status


def start() -> None:
    """A server for this identity, unless one answers already (two started at once: one
    binds the name, the other exits)."""
    import socket
    import subprocess

    name = address()
    if name is None or not wanted():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(name)
        return  # one serves already
    except OSError:
        pass
    finally:
        probe.close()
    from .front import PACKAGE_PARENT

    script = (f"import sys; sys.path[:] = [{PACKAGE_PARENT!r}, *(p for p in sys.path if p)]; "
              "from abicache.launcher.warm import serve; serve()")
    subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, cwd="/", start_new_session=True)


def serve() -> None:
    """Bind the name (or leave: another serves), import what a miss needs, and fork for each
    compile until IDLE_SECONDS pass without one or abicache's code changed."""
    import importlib
    import signal
    import socket
    import time

    name = address()
    if name is None:
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(name)
    except OSError:
        return
    listener.listen(128)
    for module in PRELOAD:
        importlib.import_module(module)
    from ..hits.keeper import code_files, moved

    code = code_files()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forks reaped by the kernel
    listener.settimeout(1.0)
    last = time.monotonic()
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if time.monotonic() - last > IDLE_SECONDS or moved(code):
                return
            continue
        last = time.monotonic()
        with conn:
            if peer_uid(conn) != os.getuid():
                continue
            if moved(code):
                return  # the front runs Python, whose launcher starts a server of the new code
            if os.fork() == 0:
                listener.close()
                _fork(conn)


def peer_uid(conn: socket.socket) -> int | None:
    import socket
    import struct

    try:
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return None
    return uid


def _fork(conn: socket.socket) -> None:
    """One compile, as the front's process would run it; never returns."""
    import signal

    status, answered = None, []
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for stop in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):  # as Ctrl-C: the compiler is stopped too
            signal.signal(stop, _interrupted)
        argv, environ, mask = _take(conn)
        conn.sendall(b"pid %d\n" % os.getpid())
        from . import run

        run.HANDOFF = lambda: _answer(conn, b"exec\n")
        run.EARLY = lambda: (answered.append(True), _answer(conn, b"status 0\n"))
        status = run.main(argv)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001  no answer: the front runs the launcher in Python
        status = None
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            if status is not None and not answered:
                conn.sendall(b"status %d\n" % status)
        except BaseException:  # noqa: BLE001
            pass
        _exit()


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _exit() -> None:
    """What the process's exit does (the counters, the entries' stamps: atexit), then exit."""
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        os._exit(0)


def _answer(conn: socket.socket, line: bytes) -> None:
    """Answer the front now: it exits (or runs the command itself) while this fork goes on,
    detached from the build's output (a build system waits for the end of what it reads)."""
    sys.stdout.flush()
    sys.stderr.flush()
    conn.sendall(line)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    if line == b"exec\n":
        _exit()


def _take(conn: socket.socket) -> tuple[list[str], dict[bytes, bytes], int]:
    """Read the front's request and take its place: its streams, working directory, umask
    and environment. (argv, environment, umask)"""
    import socket

    conn.settimeout(REQUEST_SECONDS)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 4)
    try:
        if len(fds) != 4:
            raise OSError("the request holds no streams")
        while b"\n" not in data and len(data) < 4096:
            more = conn.recv(1 << 16)
            if not more:
                raise OSError("the request ended early")
            data += more
        head, _, data = data.partition(b"\n")
        magic, mask, argc, length = head.rsplit(b" ", 3)
        if magic != FORMAT or not 0 < int(length) <= MAX_REQUEST:
            raise OSError("not a request of this version")
        while len(data) < int(length):
            more = conn.recv(min(1 << 20, int(length) - len(data)))
            if not more:
                raise OSError("the request ended early")
            data += more
        words = data.split(b"\0")[:-1]
        argv = [os.fsdecode(w) for w in words[:int(argc)]]
        environ = dict(entry.partition(b"=")[::2] for entry in words[int(argc):])
        for target, fd in enumerate(fds[1:]):
            os.dup2(fd, target)
        os.fchdir(fds[0])
    finally:
        for fd in fds:
            os.close(fd)
    conn.settimeout(None)
    os.umask(int(mask, 8))
    os.environ.clear()
    os.environb.update(environ)
    return argv, environ, int(mask, 8)
