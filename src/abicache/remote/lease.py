"""The fleet's single flight: one machine builds a key while the others wait for its upload.

The local flock (store/lock.py) stops two processes of one machine from
building one key; this stops N machines sharing a remote from building it N
times when a job starts everywhere at once. It is advisory: correctness never
depends on it (a manifest is first-writer-wins, and a machine that loses that
race adopts the winner's files), so every failure here ends in building locally.

- Taken with a create-only write of v1/leases/<kind>/<key> (S3: If-None-Match: *;
  Redis: SET NX PX), after a local miss and a remote miss, under the local lock.
- The holder rewrites it every ttl/3 from a thread (a new beat, a conditional
  write on the version it last wrote), publishes, then deletes it.
- A waiter polls for the entry. A lease whose bytes have not changed for ttl
  seconds *of the waiter's own clock* is dead (its holder was killed): clocks
  of different machines are never compared, except to skip that wait for a
  lease last renewed long ago (past 2 x ttl plus a minute of skew). The waiter
  takes a dead lease over with a write conditional on its version, so one
  waiter wins; Redis also expires it itself.
- A lease held by this very process is never waited on: a builder that asks
  for the same key through another Cache would wait for itself.
- The wait is bounded by the lock timeout; past it, or when the remote goes
  down, the waiter builds.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Callable, NamedTuple, TypeVar

from .backend import LEASE_BYTES, Tag
from .tier import Tier

T = TypeVar("T")
#: how far two machines' clocks may disagree, for the one check that compares them
CLOCK_SKEW = 60.0
#: the first and the longest pause between two looks at a lease and the entry
FIRST_POLL, LONGEST_POLL = 0.05, 1.0

_process: tuple[int, str] = (0, "")


def process_id() -> str:
    """A token for this process, new after a fork (the child holds none of the parent's leases)."""
    global _process
    if _process[0] != os.getpid():
        _process = (os.getpid(), uuid.uuid4().hex)
    return _process[1]


class Record(NamedTuple):
    """What a lease says (for messages and for the re-entrancy check)."""

    owner: str
    host: str
    pid: int
    what: str
    renewed: float
    ttl: float

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def encode(what: str, ttl: float, beat: int) -> bytes:
    record = {"owner": process_id(), "host": socket.gethostname()[:100], "pid": os.getpid(), "what": what[:200],
              "renewed": time.time(), "ttl": ttl, "beat": beat}
    return json.dumps(record, sort_keys=True).encode()[:LEASE_BYTES]


def decode(raw: bytes) -> Record | None:
    """The record, or None for bytes that are not one (another tool's, or damaged: such a
    lease is judged by whether it changes, like any other)."""
    try:
        data = json.loads(raw)
        return Record(str(data["owner"]), str(data["host"]), int(data["pid"]), str(data["what"]),
                      float(data["renewed"]), float(data["ttl"]))
    except (ValueError, KeyError, TypeError):
        return None


class Held:
    """A lease this process holds: renewed from a thread until released."""

    def __init__(self, tier: Tier, kind: str, key: str, what: str, tag: Tag) -> None:
        self._tier, self._kind, self._key, self._what = tier, kind, key, what
        self._tag: Tag | None = tag
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._renew, daemon=True, name="abicache-lease")
        self._thread.start()

    def _renew(self) -> None:
        ttl, beat = self._tier.settings.lease, 0
        while not self._stop.wait(ttl / 3):
            beat += 1
            with self._lock:
                if self._tag is None or self._stop.is_set():
                    return
                tag = self._tag
                data = encode(self._what, ttl, beat)
                self._tag = self._tier.call(lambda b: b.put_lease(self._kind, self._key, data, ttl, tag))
            if self._tag is None:  # taken over (we were thought dead) or the remote failed: build on
                return

    def release(self) -> None:
        self._stop.set()
        with self._lock:
            tag, self._tag = self._tag, None
        if tag is not None:
            self._tier.call(lambda b: b.drop_lease(self._kind, self._key, tag))
        self._thread.join(1.0)


class _Watch:
    """Whether a lease still lives: its bytes changed within ttl of this machine's clock."""

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._seen: bytes | None = None
        self._since = 0.0

    def dead(self, raw: bytes, record: Record | None) -> bool:
        now = time.monotonic()
        if raw != self._seen:
            self._seen, self._since = raw, now
        if record is not None and time.time() > record.renewed + 2 * max(record.ttl, self._ttl) + CLOCK_SKEW:
            return True  # renewed long ago by any clock: its holder is gone
        return now - self._since > self._ttl


def build_once(tier: Tier, kind: str, key: str, what: str, fetch: Callable[[], T | None],
               build: Callable[[], T], timeout: float, note: Callable[[str], None]) -> T:
    """fetch()'s result once another machine has published it, else build()'s
    (under the lease where this machine may write). fetch has already missed once."""
    ttl = tier.settings.lease
    if ttl <= 0 or tier.down:
        return build()
    watch, deadline, pause, said = _Watch(ttl), time.monotonic() + timeout, FIRST_POLL, False
    replacing: Tag | None = None
    while True:
        if tier.writable:
            held = _take(tier, kind, key, what, ttl, replacing)
            if held is not None:
                try:
                    got = fetch()  # published and released between our miss and our take?
                    return got if got is not None else build()
                finally:
                    held.release()
        found = tier.call(lambda b: b.read_lease(kind, key))
        if tier.down:
            return build()
        if found is None:  # released: published (fetch sees it), failed, or unusable here
            got = fetch()
            if got is not None or not tier.writable:
                return got if got is not None else build()
            replacing = None
            continue
        raw, tag = found
        record = decode(raw)
        if record is not None and record.owner == process_id():
            return build()  # our own: waiting would wait for ourselves
        if not watch.dead(raw, record):
            replacing = None
        elif not tier.writable:
            return build()
        elif replacing != tag:
            replacing = tag  # take it over, if nobody else does first
            continue
        # else: taking this very version over failed (a server without ETags, say): wait as for a live one
        if not said:
            said = True
            note(f"waiting for {record.describe() if record else 'another machine'} to build {what} "
                 f"for the fleet ({tier.name})")
        got = fetch()
        if got is not None:
            return got
        if time.monotonic() > deadline or tier.down:
            note(f"gave up waiting for another machine to build {what}; building it here")
            return build()
        time.sleep(pause)
        pause = min(pause * 1.5, LONGEST_POLL)


def _take(tier: Tier, kind: str, key: str, what: str, ttl: float, replacing: Tag | None) -> Held | None:
    data = encode(what, ttl, 0)
    tag = tier.call(lambda b: b.put_lease(kind, key, data, ttl, replacing))
    return Held(tier, kind, key, what, tag) if tag is not None else None
