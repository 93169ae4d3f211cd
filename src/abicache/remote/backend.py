"""What a remote store must do, and the names of things in it.

A backend moves bytes and nothing else: it never parses a manifest or trusts
a blob. Every transport, timeout or credential failure is raised as
RemoteError; "not there" is an answer (None / False), not an error.

Layout (every engine), under LAYOUT:
    blobs       v2/blobs/<sha[:2]>/<sha256>.zst        content addressed, immutable, a zstd frame (packed.py)
    manifests   v2/entries/<kind>/<key>/<variant>      first writer wins
    gc marks    v2/gc/<sha256>                         blobs found unreferenced, and when (remote/prune.py)
    leases      v2/leases/<kind>/<key>                 who builds a key for the fleet now (remote/lease.py)
    failures    v2/failures/<kind>/<key>               a build that just failed, and its output (remote/lease.py)
    names       v2/names/<kind>/<name digest>/<key>    keys built under a name (lookups by what was asked for)
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Protocol

#: the remote layout's version, the first part of every name. v1 kept blobs raw; v2 packs them
#: (packed.py). A new version is a new tree beside the old: an older abicache (its reads, its
#: publishes, its `remote prune`) sees and touches only its own, never an entry whose blobs it
#: cannot read (it would prune them as missing).
LAYOUT = "v2"
#: receives each chunk of a download, in order (bytes or a memoryview, valid during the call)
Sink = Callable[["bytes | memoryview"], None]
#: told how many bytes just moved (progress bars)
Advance = Callable[[int], None]
#: a lease's version, opaque to its users: S3's ETag, Redis's value itself
Tag = str | bytes
#: a lease is a small JSON record; more than this is not read
LEASE_BYTES = 4096
#: a shared failure (its compiler's output, cut) is at most this long
FAILURE_BYTES = 64 << 10
#: transfers are read and written in pieces of this size
CHUNK = 8 << 20
#: the slowest transfer rate that still counts as alive: a transfer of n bytes
#: may take timeout + n / MIN_RATE seconds before it is a failure
MIN_RATE = 1 << 20


class Backend(Protocol):
    def variant_list(self, kind: str, key: str, limit: int) -> list[Listed]:
        """At most limit of the key's variants (name: the variant), with their sizes and, where
        the engine keeps it, when each was written; no manifest is read."""

    def read_manifest(self, kind: str, key: str, variant: str, limit: int) -> bytes | None:
        """One manifest, if it is there and no larger than limit bytes (never more is read)."""

    def put_manifest(self, kind: str, key: str, variant: str, data: bytes) -> bool:
        """Create it; False if that variant is already there (someone else won)."""

    def has_blob(self, sha256: str) -> bool: ...

    def read_blob(self, sha256: str, size: int, sink: Sink) -> bool:
        """Stream the blob into sink; False if there is no such blob."""

    def write_blob(self, sha256: str, path: Path, size: int, advance: Advance) -> None: ...

    def entries(self) -> Iterator[tuple[str, str]]:
        """Every (kind, key) with at least one manifest."""

    # ---- maintenance (remote stats, remote prune) ----------------------------

    def variants(self) -> Iterator[Listed]:
        """Every manifest: name (kind/key/variant), size, and when written where the engine knows."""

    def blobs(self) -> Iterator[Listed]:
        """Every blob: name (its sha256), size, and when written where the engine knows."""

    def delete_manifest(self, kind: str, key: str, variant: str) -> None: ...

    def delete_blob(self, sha256: str) -> None: ...

    def marks(self) -> dict[str, float]:
        """sha256 -> when it was found unreferenced (the time of the prune that marked it)."""

    def set_marks(self, marks: dict[str, float]) -> None: ...

    def clear_marks(self, shas: list[str]) -> None: ...

    # ---- build leases (remote/lease.py) ---------------------------------------

    def read_lease(self, kind: str, key: str) -> tuple[bytes, Tag, float | None] | None:
        """The lease's bytes (at most LEASE_BYTES), its version tag and when it was last
        written by the server's clock (None where the engine keeps no time); None if there is none."""

    def put_lease(self, kind: str, key: str, data: bytes, ttl: float, replacing: Tag | None) -> Tag | None:
        """Write the lease if there is none (replacing None) or if it is still at version
        `replacing`, atomically; its new tag, or None where another writer got there first.
        ttl: seconds after which an engine that can expire keys may drop it."""

    def drop_lease(self, kind: str, key: str, tag: Tag) -> None:
        """Delete the lease if it is still at version tag."""

    def leases(self) -> Iterator[Listed]:
        """Every lease (builds in flight, or left by a killed builder): name kind/key."""

    def server_time(self) -> float | None:
        """Now, by the server's clock (seconds since the epoch); None where it cannot say.
        Never raises: it only makes waits shorter."""

    # ---- shared failures (remote/lease.py) ------------------------------------

    def read_failure(self, kind: str, key: str) -> tuple[bytes, float | None] | None:
        """The failure record (at most FAILURE_BYTES) and when it was written by the server's
        clock (None where the engine expires it itself); None if there is none."""

    def put_failure(self, kind: str, key: str, data: bytes, ttl: float) -> None:
        """Write (or replace) the record; an engine that can expire keys drops it after ttl."""

    def drop_failure(self, kind: str, key: str) -> None:
        """Delete the record (the key has since been built)."""

    def put_name(self, kind: str, digest: str, key: str) -> None:
        """Record that key was built under the name whose digest this is (names_prefix)."""

    def keys_named(self, kind: str, digest: str, limit: int) -> list[str]:
        """Up to limit keys recorded under that name (lookups by what was asked for)."""
        ...

    def close(self) -> None: ...


class Static:
    """What a backend that keeps no build leases nor shared failures answers (a folder, a
    static web server: places to publish and read, not a fleet's meeting point)."""

    def read_lease(self, kind: str, key: str) -> tuple[bytes, Tag, float | None] | None:
        return None

    def drop_lease(self, kind: str, key: str, tag: Tag) -> None:
        return None

    def leases(self) -> Iterator[Listed]:
        return iter(())

    def server_time(self) -> float | None:
        return None

    def read_failure(self, kind: str, key: str) -> tuple[bytes, float | None] | None:
        return None

    def put_failure(self, kind: str, key: str, data: bytes, ttl: float) -> None:
        return None

    def drop_failure(self, kind: str, key: str) -> None:
        return None

    def close(self) -> None:
        return None


class Listed(NamedTuple):
    name: str  # "kind/key/variant" for a manifest, the sha256 for a blob
    size: int
    written: float | None  # seconds since the epoch; None where the engine keeps no time


def blob_name(name: str) -> str:
    """Where a blob is: name is packed.packed_name's (its sha256 and the frame's suffix)."""
    return f"{LAYOUT}/blobs/{name[:2]}/{name}"


def entry_prefix(kind: str, key: str) -> str:
    return f"{LAYOUT}/entries/{kind}/{key}/"


def names_prefix(kind: str, digest: str) -> str:
    """Where the keys built under one name are recorded: an empty object per key."""
    return f"{LAYOUT}/names/{kind}/{digest}/"


def lease_name(kind: str, key: str) -> str:
    return f"{LAYOUT}/leases/{kind}/{key}"


def failure_name(kind: str, key: str) -> str:
    return f"{LAYOUT}/failures/{kind}/{key}"


def transfer_seconds(timeout: float, size: int) -> float:
    return timeout + size / MIN_RATE


def first_line(exc: BaseException) -> str:
    """Client errors can be pages long (obstore appends its debug dump)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def file_chunks(path: Path, advance: Advance) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            advance(len(chunk))
            yield chunk


class Watchdog:
    """Calls `cut` from a watchdog thread once `seconds` have passed, and every 0.2 s after
    that until it is stopped: what bounds a call in total time where a socket's timeout
    restarts with every byte (redis_kv.py cuts its connections, http.py its sockets)."""

    def __init__(self, seconds: float, cut: Callable[[], None]) -> None:
        self.seconds = seconds
        self.expired = False
        self._cut = cut
        self._done = threading.Event()

    def start(self) -> Watchdog:
        threading.Thread(target=self._watch, daemon=True, name="abicache-deadline").start()
        return self

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        if self._done.wait(self.seconds):
            return
        self.expired = True
        while not self._done.is_set():
            self._cut()
            self._done.wait(0.2)

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
