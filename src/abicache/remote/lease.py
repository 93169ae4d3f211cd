"""The fleet's single flight: one machine builds a key while the others wait for its upload.

The local flock (store/lock.py) stops two processes of one machine from
building one key; this stops N machines sharing a remote from building it N
times when a job starts everywhere at once. It is advisory: correctness never
depends on it (a manifest is first-writer-wins, and a machine that loses that
race adopts the winner's files), so every failure here ends in building locally.

- Taken with a create-only write of v2/leases/<kind>/<key> (S3: If-None-Match: *;
  Redis: SET NX PX), after a local miss and a remote miss, under the local lock.
  A write whose answer is lost or late is settled by reading the lease back (take()).
- The holder rewrites it every ttl/3 from a thread with a new beat and the CPU
  seconds its build has spent so far (liveness.py), publishes, then deletes it.
  Where the fleet signs its manifests (ABICACHE_TRUSTED_KEYS), leases are
  signed too, and a lease without a valid signature is taken over at once:
  anyone who can write the remote could otherwise stall every machine.
- A waiter holds no local lock (wait()): a second process of the same machine
  waits beside it, for the same fleet build. It polls for the entry, and stops
  waiting (to build itself) when the lease
    * is dead: its bytes did not change for ttl seconds of the waiter's own
      clock, or the server's clock says it was last written over ttl ago
      (clocks of different machines are never compared: a holder whose clock
      is hours off is judged the same);
    * is stuck: its CPU seconds did not grow for ABICACHE_LEASE_STUCK (60 s),
      a hung compiler whose process still renews;
    * outlives the budget: 3 x the key's last known build time + 60 s, or
      ABICACHE_LEASE_WAIT (600 s) when none is known, and never more than
      the lock timeout.
  A dead or stuck lease is taken over with a write conditional on its version,
  so one waiter wins; past the budget the waiter builds without a lease.
- A build that fails under the lease leaves a failure record (its error and
  output, signed where the fleet signs, 10 minutes long) before the lease is
  released: the other machines report that error at once instead of building
  and failing in turn (ABICACHE_RETRY_FAILED=1 builds anyway). The machine
  that failed retries as it would without a remote: a failed build records no
  headers, so the key cannot tell that one was fixed.
- A lease held by this very process is never waited on: a builder that asks
  for the same key through another Cache would wait for itself.
- Records are fresh: leases and failure records carry the time they were written
  by the server's clock (`at`, estimated from one look at it), inside the
  signature where the fleet signs. A lease whose `at` is older than its ttl, or
  a failure record older than FAILURE_TTL, is not believed, so a record saved
  and written back (by anyone who can write the remote, without any key) stalls
  or fails nothing past its time; where the fleet signs, a record without `at`
  is not believed either. A successful build of a key clears its failure record.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, NamedTuple, TypeVar

from ..errors import AbicacheError, BuildError, RemoteError
from . import liveness
from .backend import FAILURE_BYTES, LEASE_BYTES, Backend, Tag
from .tier import Tier

T = TypeVar("T")
#: the first and the longest pause between two looks at a lease and the entry
FIRST_POLL, LONGEST_POLL = 0.05, 1.0
#: how long a shared failure is reported instead of building again
FAILURE_TTL = 600.0
#: a lease the server's clock says was written this long past its ttl is dead at once
SERVER_SLACK = 5.0

_process: tuple[int, str] = (0, "")


def process_id() -> str:
    """A token for this process, new after a fork (the child holds none of the parent's leases)."""
    global _process
    if _process[0] != os.getpid():
        _process = (os.getpid(), uuid.uuid4().hex)
    return _process[1]


class Record(NamedTuple):
    """What a lease says."""

    owner: str
    host: str
    pid: int
    what: str
    progress: float  # CPU seconds the build has spent
    expect: float  # the holder's idea of how long this build takes (0: none)
    at: float | None = None  # when it was written, by the server's clock as its holder saw it

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def encode(tier: Tier, kind: str, key: str, what: str, beat: int, progress: float, expect: float,
           at: float) -> bytes:
    record = {"kind": kind, "key": key, "owner": process_id(), "host": socket.gethostname()[:100],
              "pid": os.getpid(), "what": what[:200], "beat": beat, "progress": round(progress, 2),
              "expect": round(expect, 2), "ttl": tier.settings.lease, "at": round(at, 3)}
    return json.dumps(tier.sign_record(record), sort_keys=True).encode()[:LEASE_BYTES]


def decode(tier: Tier, kind: str, key: str, raw: bytes) -> Record | None:
    """The record, or None for bytes that are not a believable lease for this key: another
    tool's, damaged, another key's, or unsigned where the fleet signs. Such a lease is taken over."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or (data.get("kind"), data.get("key")) != (kind, key):
            return None
        if tier.record_problem(data) is not None or (tier.settings.trusted and "at" not in data):
            return None  # unsigned where the fleet signs; or signed before records carried their time
        at = float(data["at"]) if "at" in data else None
        return Record(str(data["owner"]), str(data["host"])[:100], int(data["pid"]), str(data["what"])[:200],
                      float(data["progress"]), max(0.0, float(data.get("expect") or 0.0)), at)
    except (ValueError, KeyError, TypeError, OverflowError):
        return None


def budget(tier: Tier, known: float, timeout: float) -> float:
    """The longest wait for another machine's build: 3 x its known length + 60 s, else
    ABICACHE_LEASE_WAIT; never past the lock timeout."""
    limit = min(tier.settings.wait, 3 * known + 60.0) if known > 0 else tier.settings.wait
    return min(limit, timeout)


class Held:
    """A lease this process holds: renewed from a thread, with the build's CPU seconds, until released."""

    def __init__(self, tier: Tier, kind: str, key: str, what: str, tag: Tag, expect: float,
                 clock: _ServerClock | None = None) -> None:
        self._tier, self._kind, self._key, self._what, self._expect = tier, kind, key, what, expect
        self._tag: Tag | None = tag
        self._clock = clock or _ServerClock(tier)
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
                data = encode(self._tier, self._kind, self._key, self._what, beat, liveness.cpu_seconds(),
                              self._expect, self._clock.now() or time.time())
                self._tag = take(self._tier, self._kind, self._key, data, ttl, tag)
            if self._tag is None:  # taken over (thought dead or stuck), the remote failed, or take() lost: build on
                return

    def release(self) -> None:
        self._stop.set()
        with self._lock:
            tag, self._tag = self._tag, None
        if tag is not None:
            self._tier.call(lambda b: b.drop_lease(self._kind, self._key, tag))
        self._thread.join(1.0)


class _Watch:
    """Whether a lease still lives (its bytes change) and its build still progresses
    (its CPU seconds grow), by this machine's monotonic clock."""

    def __init__(self, ttl: float, stuck: float) -> None:
        self._ttl, self._stuck = ttl, stuck
        self._seen: bytes | None = None
        self._changed = self._progressed = time.monotonic()
        self._progress: float | None = None

    def verdict(self, raw: bytes, record: Record, age: float | None, server_now: float | None = None) -> str | None:
        """'dead', 'stuck', or None while it lives and progresses. server_now: the server's time
        (None where it cannot be known): a lease it says was written over ttl ago is dead,
        whenever it was last written to the remote (a replayed one)."""
        now = time.monotonic()
        if raw != self._seen:
            self._seen, self._changed = raw, now
        if self._progress is None or abs(record.progress - self._progress) > liveness.NOISE:
            self._progress, self._progressed = record.progress, now
        if age is not None and age > self._ttl + SERVER_SLACK:
            return "dead"  # by the server's own clock: not rewritten within its ttl
        if server_now is not None and record.at is not None and abs(server_now - record.at) > self._ttl + SERVER_SLACK:
            return "dead"  # its own time says so: a lease saved and written back
        if now - self._changed > self._ttl:
            return "dead"
        if now - self._progressed > self._stuck:
            return "stuck"
        return None


class Outcome(NamedTuple):
    """How a wait ended: the entry another machine published, or what to do instead."""

    found: Any = None
    replacing: Tag | None = None  # a dead, stuck or unbelievable lease to take over
    take: bool = True  # False: build without a lease (our own lease, or the wait ran out)


def wait(tier: Tier, kind: str, key: str, what: str, fetch: Callable[[], T | None], known: float,
         timeout: float, note: Callable[[str], None], machine: str = "") -> Outcome:
    """Wait while another machine builds this key (no local lock is held here).
    fetch() looks in the local store, then the remote. Raises the fleet's
    error when the key has just failed to build on another machine (machine:
    this one's name for failure records, machine_id())."""
    settings = tier.settings
    if settings.lease <= 0 or tier.down:
        return Outcome(take=False)
    watch, start, pause, said = _Watch(settings.lease, settings.stuck), time.monotonic(), FIRST_POLL, False
    clock = _ServerClock(tier)
    limit = budget(tier, known, timeout)
    while True:
        found = tier.call(lambda b: b.read_lease(kind, key))
        if tier.down:
            return Outcome(take=False)
        if found is None:  # none, or released: published (fetch sees it), failed, or unusable here
            got = fetch()
            if got is not None:
                return Outcome(found=got)
            raise_shared_failure(tier, kind, key, what, clock, machine)
            return Outcome()
        raw, tag, written = found
        record = decode(tier, kind, key, raw)
        if record is None:
            note(f"taking over a lease for {what} that is not a believable abicache lease ({tier.name})")
            return Outcome(replacing=tag)
        if record.owner == process_id():
            return Outcome(take=False)  # our own: waiting would wait for ourselves
        limit = budget(tier, max(known, record.expect), timeout)
        verdict = watch.verdict(raw, record, clock.age(written), clock.now(fallback=False))
        if verdict is not None:
            note(f"{record.describe()} building {what} is {verdict} "
                 f"({'no progress for' if verdict == 'stuck' else 'no renewal for'} "
                 f"{settings.stuck if verdict == 'stuck' else settings.lease:.0f} s); building it here")
            return Outcome(replacing=tag)
        if not said:
            said = True
            note(f"waiting for {record.describe()} to build {what} for the fleet ({tier.name}; "
                 f"at most {limit:.0f} s)")
        got = fetch()
        if got is not None:
            return Outcome(found=got)
        if time.monotonic() - start > limit:
            note(f"gave up waiting {limit:.0f} s for {record.describe()} to build {what}; building it here")
            return Outcome(take=False)
        time.sleep(pause)
        pause = min(pause * 1.5, LONGEST_POLL)


def build(tier: Tier, kind: str, key: str, what: str, fetch: Callable[[], T | None], make: Callable[[], T],
          outcome: Outcome, expect: float, machine: str = "") -> T | None:
    """Under the local lock: take the lease (over outcome.replacing) and build, or
    fetch what was published meanwhile. None when another machine took the lease
    first: the caller waits again, without its local lock."""
    if not outcome.take or not tier.writable:
        return make()
    clock = _ServerClock(tier)
    data = encode(tier, kind, key, what, 0, 0.0, expect, clock.now() or time.time())
    tag = take(tier, kind, key, data, tier.settings.lease, outcome.replacing)
    if tag is None:
        return make() if tier.down else None
    held = Held(tier, kind, key, what, tag, expect, clock)
    try:
        got = fetch()  # published and released between our wait and our take?
        if got is not None:
            return got
        failed_before = raise_shared_failure(tier, kind, key, what, clock, machine)
        start = time.monotonic()
        try:
            made = make()
        except Exception as exc:
            if _shared(exc):
                _publish_failure(tier, kind, key, what, exc, time.monotonic() - start, machine,
                                 clock.now() or time.time())
            raise
        if failed_before:  # built: the fleet's record of its failure is cleared for every machine
            tier.call(lambda b: b.drop_failure(kind, key))
        return made
    finally:
        held.release()


def take(tier: Tier, kind: str, key: str, data: bytes, ttl: float, replacing: Tag | None) -> Tag | None:
    """Write this lease (create-only, or over the lease `replacing`): its new tag, or None where
    it is another's. A write that failed, or got no answer in time, is settled by reading the
    lease back: SeaweedFS answers the losers of a create-only write contended to the millisecond
    a second or two late (a lost race, not a failed remote). Only where that read fails too, or
    finds no lease, is the remote put aside. A renewal whose bytes are not there (another's, or
    its own last ones: the answer lost, the write perhaps still on its way) stops renewing."""
    def attempt(backend: Backend) -> Tag | None:
        try:
            return backend.put_lease(kind, key, data, ttl, replacing)
        except RemoteError:
            found = backend.read_lease(kind, key)
            if found is None:
                raise
            return found[1] if found[0] == data else None  # ours after all, or another's (or the one replaced)

    return tier.call(attempt)


# ---- shared failures ------------------------------------------------------------------------


def _shared(exc: Exception) -> bool:
    """A failure of the build itself (the compiler's error, the builder's exception), not
    of this machine (a full disk, a missing tool: OSError) nor of abicache."""
    if isinstance(exc, BuildError):
        return True
    return not isinstance(exc, (OSError, MemoryError, AbicacheError))


def machine_id(root: str) -> str:
    """This machine as failure records name it: its host and its store (a digest: paths stay private)."""
    import hashlib

    return hashlib.sha256(f"{socket.gethostname()}\0{root}".encode()).hexdigest()[:16]


def _publish_failure(tier: Tier, kind: str, key: str, what: str, exc: Exception, seconds: float,
                     machine: str, at: float) -> None:
    text = str(exc)
    if len(text) > FAILURE_BYTES // 2:
        text = text[:FAILURE_BYTES // 4] + "\n[...]\n" + text[-FAILURE_BYTES // 4:]
    record = tier.sign_record({"kind": kind, "key": key, "what": what[:200], "host": socket.gethostname()[:100],
                               "pid": os.getpid(), "machine": machine, "type": type(exc).__name__[:100],
                               "error": text, "seconds": round(seconds, 3), "at": round(at, 3)})
    data = json.dumps(record, sort_keys=True).encode()
    if len(data) <= FAILURE_BYTES:
        tier.call(lambda b: b.put_failure(kind, key, data, FAILURE_TTL))


def raise_shared_failure(tier: Tier, kind: str, key: str, what: str, clock: _ServerClock, machine: str) -> bool:
    """BuildError with another machine's error if this key failed to build in the fleet
    within FAILURE_TTL (and the record is believable here). This machine's own failures
    are not raised again: the key does not cover the headers a failed build read, so a
    developer who fixed one retries at once, as without a remote. True if a record is
    there that was not raised (the build that follows clears it if it succeeds)."""
    if tier.settings.retry_failed:
        return False
    found = tier.call(lambda b: b.read_failure(kind, key))
    if found is None:
        return False
    raw, written = found
    age = clock.age(written, fallback=True)
    if age is not None and age > FAILURE_TTL:
        return True
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or (data.get("kind"), data.get("key")) != (kind, key):
            return True
        if tier.record_problem(data) is not None or (machine and data.get("machine") == machine):
            return True
        if not _fresh_failure(tier, data, clock):
            return True
        host, error, kind_of = str(data["host"])[:100], str(data["error"]), str(data.get("type", ""))[:100]
    except (ValueError, KeyError, TypeError, OverflowError):
        return True
    raise BuildError(f"{what} failed to build on {host} moments ago ({kind_of}, reported by the fleet's remote "
                     f"{tier.name}); set ABICACHE_RETRY_FAILED=1 to build it here instead",
                     output=error)


def _fresh_failure(tier: Tier, data: dict[str, Any], clock: _ServerClock) -> bool:
    """The record's own time (signed with it where the fleet signs) is within FAILURE_TTL of
    the server's now: one saved and written back later is not believed. A record without
    one (an older abicache's) is believed only where the fleet does not sign."""
    at = data.get("at")
    if at is None:
        return not tier.settings.trusted
    age = (clock.now() or time.time()) - float(at)
    return -SERVER_SLACK <= age <= FAILURE_TTL


class _ServerClock:
    """The server's clock: its now, measured once (per wait, per lease held), and ages by it."""

    def __init__(self, tier: Tier) -> None:
        self._tier = tier
        self._offset: float | None = None
        self._asked = False

    def now(self, fallback: bool = True) -> float | None:
        """Now by the server's clock; where it cannot say, this machine's (or None without fallback)."""
        if not self._asked:
            self._asked = True
            now = self._tier.call(lambda b: b.server_time())
            self._offset = None if now is None else now - time.time()
        if self._offset is None:
            return time.time() if fallback else None
        return time.time() + self._offset

    def age(self, written: float | None, fallback: bool = False) -> float | None:
        """None where the server gives no write time, or (unless fallback: then by this
        machine's clock) cannot say what time it is."""
        if written is None:
            return None
        now = self.now(fallback)
        return None if now is None else now - written
