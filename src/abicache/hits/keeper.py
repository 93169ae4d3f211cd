"""The store's keeper: a process of this user that watches what large hit records depend
on, so that a fresh process's hit asks it once (hits/__init__.py) instead of checking ~700 files and
arming its own watch of them (issue 49: a torch extension's load at 3x its floor).

Started by a full lookup that wrote a record large enough for the native check (writer.py;
a hit starts none), or by `abicache keeper start`. One keeper a store and view of files
(hits.address): a second one started finds the name bound and exits. It exits after
ABICACHE_KEEPER seconds without a visitor, when the store's root is gone, when a file of
abicache's it imported changed, or when asked (`abicache keeper stop`); its state is then
left odd for good, and processes holding it check for themselves.

What it vouches for: every witness of a record (record.py) but those only the asking process
can check, which it checks itself every time: the folders above and of the store by owner
and mode (t), and the C++ runtime it loads (c). The rest (the entry's files and names, the
config files, the compiler, the files the build read and the paths it looked for) are
watched by the record's own plan and one made for the store's part (store/watch.py), armed
before they are checked, as a hit's own watch is; a record whose watch could not be armed
(out of watches) is not held. An event a record's watch saw is not taken for a change: the
record is checked again, as it was learned (Keeper._again), and keeps its slot and generation
where it holds (a script that writes beside itself made every next process check ~700
files for itself, 5-7 ms of a torch extension's ~2 ms call).

The protocol: the keeper greets a visitor of its user with `<FORMAT>\n` and two descriptors,
its inotify instance and its state, read-only (hits/__init__.py says how a visitor reads them). Then
lines, each answered: `sync` (read what is queued: `ok`), `learn <record name>` (hold that
record, read as a hit reads it: `ok`), `status` (one line of JSON), `stop` (`bye`, and it
exits). A generation is never reused: a slot cleared and filled again holds a new one.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

from .. import hits
from . import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Iterator

#: how long a visitor may stay silent before it is taken for gone
QUESTION_SECONDS = 5.0
#: how often an idle keeper looks at its store and its code
TICK_SECONDS = 1.0
#: the default of ABICACHE_KEEPER (settings/config.py): 3 hours, as Gradle's and Bazel's servers wait. A hit
#: starts no keeper, so one gone makes every torch extension's hit check its ~700 witnesses itself (5-7 ms
#: against ~2 on its word) until a full lookup starts one, which may be days (the verify age); an idle one
#: holds ~15 MB and looks at its store once a second
IDLE_SECONDS = 10800.0


#: how often a record may be checked again after an event, at most: a folder that changes all the time
#: (a job writing there) makes the keeper forget it, as it did any record an event touched, rather than
#: check ~700 witnesses on every event
AGAIN_SECONDS = 1.0
#: passes over the records a read of events may take before the keeper forgets every record an event
#: touched without checking it again (events that keep coming while it checks)
PASSES = 4
#: the seconds of checking records again a keeper spends in any one second, at most (5% of a core): fifty
#: records watching a folder that a job writes to every second would otherwise take ~10% of one
AGAIN_BUDGET = 0.05


class Kept:
    __slots__ = ("watch", "slot", "generation", "again")

    def __init__(self, watch: object, slot: int, generation: int) -> None:
        self.watch, self.slot, self.generation = watch, slot, generation
        self.again = float("-inf")  # when it was last checked again after an event (Keeper._again)


class Keeper:
    """The records it holds and its state (module docstring)."""

    def __init__(self, real_root: str) -> None:
        from ..store import watch

        self.root = real_root
        events = watch._shared()
        if events is None:
            raise OSError("no inotify instance")
        self.events = events
        self.state = os.memfd_create("abicache-keeper", getattr(os, "MFD_CLOEXEC", 1))
        os.ftruncate(self.state, hits.SEQUENCE + hits.SLOT * hits.SLOTS)
        # what askers get: the state, read-only (they read it, only the keeper writes it)
        self.shown = os.open(f"/proc/self/fd/{self.state}", os.O_RDONLY | os.O_CLOEXEC)
        self.sequence, self.seen, self.generations = 0, 0, 0
        self.kept: dict[tuple[str, bytes], Kept] = {}  # (name, tag) -> its slot
        self.used: set[int] = set()
        self.started = time.time()
        self.idle = IDLE_SECONDS
        self.spent = (0.0, 0.0)  # (the second it counts from, the seconds spent checking records again since)

    def close(self) -> None:
        """Its state's descriptors (the inotify instance is the process's: store/watch.py)."""
        for fd in (self.state, self.shown):
            os.close(fd)

    def fds(self) -> list[int]:
        return [self.events._inotify.fd, self.shown]

    def _write(self, at: int, data: bytes) -> None:
        os.pwrite(self.state, data, at)

    @contextmanager
    def _busy(self) -> Iterator[None]:
        """Odd while it reads events and marks what they touched: askers do not trust a slot then."""
        self.sequence += 1
        self._write(0, self.sequence.to_bytes(hits.SEQUENCE, "little"))
        try:
            yield
        finally:
            self.sequence += 1
            self._write(0, self.sequence.to_bytes(hits.SEQUENCE, "little"))

    def refresh(self) -> None:
        """Read every event queued, and forget each record whose watch saw one."""
        if self.events._inotify.pending() == 0 and self.events.seen == self.seen:
            return  # nothing queued, nothing read since (None: FIONREAD cannot tell, so read)
        with self._busy():
            self._recheck()

    def _recheck(self) -> None:
        """Every record an event touched, checked again or forgotten, in passes until one reads no
        event: a record's watch reads the queue when asked (store/watch.py), so an event read while
        one record is asked (or checked again) may be another's, asked before it in that pass.
        The queue is emptied even where no record held asks it: the watches of records forgotten
        stay armed, and an event left there would make every asker busy and the poll loop spin."""
        for attempt in range(PASSES):
            with self.events.lock:
                self.events.drain()
            seen = self.events.seen
            for key, kept in list(self.kept.items()):
                if kept.watch.unchanged():  # type: ignore[attr-defined]
                    continue
                if attempt == PASSES - 1 or not self._again(key, kept):  # the last pass checks nothing again
                    self._forget(key)
            if self.events.seen == seen:
                break
        else:  # events kept coming: a record asked before the last of them is not known to hold
            for key in list(self.kept):
                self._forget(key)
        self.seen = self.events.seen

    def _again(self, key: tuple[str, bytes], kept: Kept) -> bool:
        """Whether a record an event touched still holds, checked as learn() checks it (its watch
        armed anew, then its witnesses): an event in a folder it watches for names (the folders the
        compiler searched, a script's folder) is most often a name it never looked for, such as a
        script's output written beside it. It keeps its slot and generation: an asker's word stands,
        as the record's witnesses hold now. Not twice within AGAIN_SECONDS, nor past AGAIN_BUDGET."""
        now = time.monotonic()
        since, spent = self.spent if now - self.spent[0] < 1.0 else (now, 0.0)
        if now - kept.again < AGAIN_SECONDS or spent >= AGAIN_BUDGET:
            return False
        try:
            got = hits.read_identified(os.path.join(hits.folder(self.root), key[0]))
            if got is None or hits.tag(key[0], got[1]) != key[1]:
                return False  # written again since: learn() takes the new one when it is asked for
            watch = _watched(got[0], self.root)
            if watch is None:
                return False
            kept.watch, kept.again = watch, now
            return True
        finally:
            self.spent = (since, spent + time.monotonic() - now)

    def _forget(self, key: tuple[str, bytes]) -> None:
        kept = self.kept.pop(key)
        self._write(hits.SEQUENCE + hits.SLOT * kept.slot, bytes(8))
        self.used.discard(kept.slot)

    def learn(self, name: str) -> None:
        """Hold the record of that name, where it is one this keeper may vouch for: read as a
        hit reads it, its watch armed, then every witness but the asker's own checked."""
        if len(name) != 64 or not all(c in "0123456789abcdef" for c in name):
            return
        got = hits.read_identified(os.path.join(hits.folder(self.root), name))
        if got is None:
            return
        data, identity = got
        tag = hits.tag(name, identity)
        if (name, tag) in self.kept:
            return
        with self._busy():  # arming drains events others' watches wait for: they are looked at below
            for key in [key for key in self.kept if key[0] == name]:
                self._forget(key)  # an older record of that name
            slot = self._free(name)
            watch = None if slot is None else _watched(data, self.root)
            if watch is not None:
                self.generations += 1
                self.kept[(name, tag)] = Kept(watch, slot, self.generations)
                self.used.add(slot)
                self._write(hits.SEQUENCE + hits.SLOT * slot, self.generations.to_bytes(8, "little") + tag)
            self._recheck()

    def _free(self, name: str) -> int | None:
        first = hits.first_slot(name)
        for slot in range(first, min(first + hits.PROBE, hits.SLOTS)):
            if slot not in self.used:
                return slot
        return None


def _watched(data: bytes, real: str) -> object | None:
    """The record's witnesses watched, then checked (all but those only the asker can: the
    folders above and of its entry, by owner and mode, and the C++ runtime it loads); None
    where they do not hold, or cannot all be watched."""
    from ..store import watch

    try:
        parsed = record.parsed(data, real)
    except (ValueError, IndexError, OverflowError):
        return None
    if parsed is None:
        return None
    from ..store import inotify

    mine = [w for w in parsed.stored() if w[0] not in "tc"]
    links = {p for k, p, _ in mine if k == "l" and os.path.islink(p)}  # the key's link: its own inode, not a target
    files = [p for k, p, _ in mine if k in "lsfnk" and p not in links]
    folders = {*(p for k, p, _ in mine if k == "d"), *(_existing(os.path.dirname(p)) for k, p, _ in mine if k in "am"),
               *(os.path.dirname(p) for p in links), os.fsdecode(parsed.fields[3])}
    plan = dict(parsed.plan)
    for path, mask in [*watch.plan(files, sorted(folders)),
                       *((link, watch.masks()[0] | inotify.IN_DONT_FOLLOW) for link in links)]:
        plan[path] = plan.get(path, 0) | mask
    native = record._native(os.fsdecode(parsed.fields[8]), len(parsed.built.kinds))
    armed = watch.Watch((), (), None, native, plan)
    if armed.marks is None:
        return None  # out of watches: a keeper that cannot see a change vouches for nothing
    built, paths = parsed.built, record.held_paths(parsed)
    held = native.hold(built.kinds.encode(), paths[record._after(paths, parsed.start):], built.numbers) \
        if native is not None else record._hold(built.items())
    names = record._listing(os.listdir(os.fsdecode(parsed.fields[3])))
    if not held or not record._hold(mine) or names != parsed.fields[4]:
        return None
    return armed


def _existing(folder: str) -> str:
    """The folder, or the nearest one above it that exists: a name made under it is made there first."""
    while folder not in ("/", "") and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    return folder or "/"


def keep(real_root: str, name: str) -> None:
    """The store's keeper learns the record of that name; one is started where none answers
    (and ABICACHE_KEEPER is not 0)."""
    idle = idle_setting()
    if idle and _talk(real_root, b"learn " + name.encode(), answered=False) is None:
        start(real_root, name, idle)


def start(real_root: str, first: str = "", idle: float | None = None) -> None:
    """A keeper for this store, unless one answers already (two started at once: one binds
    the name, the other exits); first: a record it learns as it starts. An isolated
    interpreter (-I: no PYTHON* variable, no user site) in a session of its own, working in
    `/`, its path abicache's folder first and no working folder on it (docs/security.md)."""
    import subprocess

    if idle is None:
        idle = idle_setting()
    name = hits.address(real_root)
    if name is None or not idle:
        return
    if status(real_root) is not None:
        return
    parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = (f"import sys; sys.path[:] = [{parent!r}, *(p for p in sys.path if p)]; "
              "from abicache.hits.keeper import serve; serve(*sys.argv[1:])")
    subprocess.Popen([sys.executable, "-I", "-c", script, real_root, repr(float(idle)), first],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                     start_new_session=True)


def idle_setting() -> float:
    """ABICACHE_KEEPER: the seconds a keeper waits for a question; 0: none is started."""
    from ..settings import config

    return config.seconds("ABICACHE_KEEPER")


def wait_for(real_root: str, seconds: float = 10.0) -> bool:
    """Whether the store's keeper answers within seconds (one just started imports its modules)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if status(real_root) is not None:
            return True
        time.sleep(0.02)
    return False


def _talk(real_root: str, question: bytes, answered: bool = True) -> bytes | None:
    """One question to this store's keeper, its answer's line (answered=False: b"" once it is
    sent, the answer not waited for: a record's writer does not wait while the keeper learns
    it); None where none greets."""
    import socket

    name = hits.address(real_root)
    if name is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        conn.settimeout(2.0)
        conn.connect(name)
        if hits.peer(conn) != os.geteuid():
            return None
        greeting = hits.greeted(conn)
        if greeting is None:
            return None
        greeting.close()
        conn.sendall(question + b"\n")
        return hits.line(conn) if answered else b""
    except OSError:
        return None
    finally:
        conn.close()


def status(real_root: str) -> dict[str, object] | None:
    """What the store's keeper says of itself (pid, records held, since when, idle limit),
    or None where none answers."""
    import json

    line = _talk(real_root, b"status")
    try:
        return json.loads(line) if line else None
    except ValueError:
        return None


def stop(real_root: str) -> bool:
    """Ask the store's keeper to exit; whether one did."""
    return _talk(real_root, b"stop") == b"bye"


def serve(real_root: str, idle: str = repr(IDLE_SECONDS), first: str = "") -> None:
    """Bind the store's name (or leave: another keeps it) and answer until idle, the store
    gone, abicache's code changed, or asked to stop (module docstring). Visitors are greeted
    as they connect and their lines answered as they come, never one waited for: a process
    that connected early (hits.reach) asks a millisecond later, and eight ranks of a job
    starting at once must not queue behind it."""
    import select
    import socket

    name = hits.address(real_root)
    if name is None:
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        listener.bind(name)
        keeper = Keeper(real_root)
    except (OSError, AttributeError):  # bound already; no inotify, memfd_create or /proc here
        return
    listener.listen(128)
    limit, code = float(idle), code_files()
    keeper.idle = limit
    if first:
        keeper.learn(first)
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    poller.register(keeper.events._inotify.fd, select.POLLIN)
    visitors: dict[int, Visitor] = {}
    last = looked = time.monotonic()
    try:
        while True:
            for fd, _ in poller.poll(TICK_SECONDS * 1000):
                if fd == listener.fileno():
                    last = time.monotonic()
                    conn, _ = listener.accept()
                    if _greet(keeper, conn):
                        visitors[conn.fileno()] = Visitor(conn)
                        poller.register(conn.fileno(), select.POLLIN)
                elif fd in visitors:
                    said = visitors[fd].answer(keeper)
                    if said in ("stop", "gone"):
                        poller.unregister(fd)
                        visitors.pop(fd).close()
                    if said == "stop":
                        return
                else:
                    keeper.refresh()
            now = time.monotonic()
            if now - looked >= TICK_SECONDS:  # however busy the watched folders are
                looked = now
                for fd in [fd for fd, visitor in visitors.items() if now - visitor.since > QUESTION_SECONDS]:
                    poller.unregister(fd)  # a visitor that said nothing for that long: gone
                    visitors.pop(fd).close()
                if now - last > limit or not os.path.isdir(real_root) or moved(code):
                    return
    finally:
        keeper.sequence |= 1
        keeper._write(0, keeper.sequence.to_bytes(hits.SEQUENCE, "little"))  # odd for good: askers check themselves
        for visitor in visitors.values():
            visitor.close()


def _greet(keeper: Keeper, conn: socket.socket) -> bool:
    """Greet a visitor of this user with the inotify instance and the state; whether it was one."""
    import socket

    try:
        if hits.peer(conn) != os.geteuid():
            conn.close()  # its descriptors are this user's alone: another could read its events away
            return False
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in keeper.fds())
        conn.sendmsg([hits.KEEPER_FORMAT + b"\n"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        conn.setblocking(False)
        return True
    except OSError:
        conn.close()
        return False


class Visitor:
    """A connection greeted, and what it has said so far."""

    __slots__ = ("conn", "data", "since")

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.data, self.since = conn, b"", time.monotonic()

    def close(self) -> None:
        self.conn.close()

    def answer(self, keeper: Keeper) -> str:
        """Read what it sent and answer each whole line (module docstring): "stop" where asked
        to, "gone" where it left or said something this keeper does not answer, else ""."""
        try:
            more = self.conn.recv(4096)
        except BlockingIOError:
            return ""
        except OSError:
            return "gone"
        if not more or len(self.data) + len(more) > 4096:
            return "gone"
        self.data += more
        self.since = time.monotonic()
        while b"\n" in self.data:
            line, _, self.data = self.data.partition(b"\n")
            reply = _reply(keeper, line.split())
            if reply is None:
                return "gone"
            try:
                self.conn.settimeout(QUESTION_SECONDS)  # a line's answer is short: the socket's buffer takes
                self.conn.sendall(reply)  # it, and a visitor that reads nothing holds the keeper no longer
                self.conn.setblocking(False)
            except OSError:
                return "gone"
            if reply == b"bye\n":
                return "stop"
        return ""


def _reply(keeper: Keeper, words: list[bytes]) -> bytes | None:
    """The answer to one line (module docstring); None: not a question this keeper answers."""
    import json

    if words == [b"sync"]:
        keeper.refresh()
        return b"ok\n"
    if len(words) == 2 and words[0] == b"learn":
        try:
            keeper.learn(words[1].decode("ascii"))
        except UnicodeDecodeError:
            return None
        return b"ok\n"
    if words == [b"status"]:
        told = {"pid": os.getpid(), "records": len(keeper.kept), "since": keeper.started, "root": keeper.root,
                "idle": keeper.idle}
        return json.dumps(told).encode() + b"\n"
    if words == [b"stop"]:
        return b"bye\n"
    return None


def code_files() -> list[tuple[str, int, int, int]]:
    """Each of abicache's imported files by its stat: a keeper (or a warm launcher,
    launcher/warm.py) of code that changed since exits."""
    out = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and module.__name__.split(".")[0] == "abicache":
            out.append((path, *_stat(path)))
    return sorted(out)


def moved(code: list[tuple[str, int, int, int]]) -> bool:
    """Whether a file code_files() took moved since (modules imported later are not compared)."""
    return any(_stat(path) != tuple(seen) for path, *seen in code)


def _stat(path: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)
