"""Redis (or Valkey, KeyDB) through redis-py.

One hash per key holds its variants' manifests (HSETNX: first writer wins);
one string per blob. Large blobs move in pieces (APPEND to a temporary key,
then an atomic RENAMENX), so neither side holds a whole 100 MB value in
memory. Redis caps a value at 512 MB.

Bounded before trusted: every call has a total deadline (not one per read:
a server that drips a byte a second never trips a per-read timeout), and
nothing is read whose size was not checked first. Manifests come from a
server-side script that returns only values within the limit; blobs are
read with GETRANGE up to one byte past their announced size.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterator

from ..errors import RemoteError
from .backend import CHUNK, FAILURE_BYTES, LAYOUT, LEASE_BYTES, MIN_RATE, Advance, Listed, Sink, Tag, Watchdog, first_line
from .url import RemoteURL

MAX_VALUE = 512 << 20
_TEMP_TTL = 3600  # an upload interrupted by a crash disappears after an hour
#: at most this many variants per key are considered
MAX_VARIANTS = 256
# [variant, size, ...] for variant names of at most 64 bytes: sizes are
# counted on the server, so the client never receives an oversize value.
_SIZES_LUA = """
local out, n = {}, 0
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  n = n + 1
  if n > tonumber(ARGV[1]) then break end
  if #f <= 64 then
    out[#out + 1] = f
    out[#out + 1] = redis.call('HSTRLEN', KEYS[1], f)
  end
end
return out
"""
# The value, if it is (still) no larger than the limit; else false.
_GET_LUA = """
if redis.call('HSTRLEN', KEYS[1], ARGV[1]) <= tonumber(ARGV[2]) then
  return redis.call('HGET', KEYS[1], ARGV[1])
end
return false
"""
# Build leases: the value is its own version; replaced or deleted only while unchanged.
_LEASE_REPLACE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return false
"""
_LEASE_DROP_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisBackend:
    def __init__(self, url: RemoteURL, timeout: float) -> None:
        import redis  # only when a redis:// remote is used
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._url = url
        self._timeout = timeout
        self._errors: tuple[type[Exception], ...] = (redis.RedisError,)
        self._prefix = url.option("prefix", "abicache")
        tls = {"ssl_ca_certs": url.option("ca")} if url.option("ca") else {}
        self._r = redis.Redis.from_url(
            url.text.split("?")[0],
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 1),  # at most one retry
            health_check_interval=0,
            **tls,
        )

    def _name(self, *parts: str) -> str:
        return ":".join((self._prefix, LAYOUT) + parts)

    def _call(self, what: str, fn: Any, *args: Any, size: int = 0) -> Any:
        """One operation, bounded in total by timeout + size / MIN_RATE seconds:
        past that, its connections are cut (repeatedly, so a retry is cut too)."""
        deadline = Watchdog(self._timeout + size / MIN_RATE, self._cut)
        try:
            with deadline:
                return fn(*args)
        except Exception as exc:  # noqa: BLE001  a cut connection fails in many ways
            if deadline.expired:
                raise RemoteError(f"{what} took over {deadline.seconds:.0f} s (a stalled or very slow "
                                  "server); giving up") from None
            if isinstance(exc, self._errors):
                raise RemoteError(f"{what} failed ({first_line(exc)}){_hint(exc, self._prefix)}") from None
            raise

    def _cut(self) -> None:
        try:
            self._r.connection_pool.disconnect(inuse_connections=True)
        except Exception:  # noqa: BLE001  best effort from the watchdog thread
            pass

    def variant_list(self, kind: str, key: str, limit: int) -> list[Listed]:
        sizes = self._call("listing manifests", self._r.eval, _SIZES_LUA, 1, self._name("m", kind, key),
                           min(limit, MAX_VARIANTS))
        return [Listed(variant.decode("utf-8", "replace"), int(size), None)
                for variant, size in zip(sizes[0::2], sizes[1::2])]

    def read_manifest(self, kind: str, key: str, variant: str, limit: int) -> bytes | None:
        data = self._call("reading a manifest", self._r.eval, _GET_LUA, 1, self._name("m", kind, key), variant,
                          limit, size=limit)
        return bytes(data) if data and len(data) <= limit else None

    def put_manifest(self, kind: str, key: str, variant: str, data: bytes) -> bool:
        return bool(self._call("writing a manifest", self._r.hsetnx, self._name("m", kind, key), variant, data))

    def put_name(self, kind: str, digest: str, key: str) -> None:
        self._call("recording a name", self._r.sadd, self._name("n", kind, digest), key)

    def keys_named(self, kind: str, digest: str, limit: int) -> list[str]:
        # SSCAN's COUNT is a hint per call: one call, cut at limit, bounds what a flooded set costs
        _, found = self._call("listing a name's keys", self._r.sscan, self._name("n", kind, digest), 0, None,
                              min(limit, MAX_VARIANTS))
        keys = [k.decode("ascii", "replace") if isinstance(k, bytes) else str(k) for k in found]
        return [k for k in keys if len(k) == 64][:limit]

    def has_blob(self, sha256: str) -> bool:
        return bool(self._call("checking a blob", self._r.exists, self._name("b", sha256)))

    def read_blob(self, sha256: str, size: int, sink: Sink) -> bool:
        # Blobs never change once written, so reading in ranges is consistent;
        # a range past the end comes back empty and ends the loop early. Never
        # more than size + 1 bytes are asked for: one too many proves "too long".
        name = self._name("b", sha256)
        if not self._call("checking a blob", self._r.exists, name):
            return False
        offset = 0
        while offset < size + 1:
            end = min(offset + CHUNK, size + 1) - 1
            piece = self._call("downloading a blob", self._r.getrange, name, offset, end, size=end + 1 - offset)
            if not piece:
                break
            sink(piece)
            offset += len(piece)
        return True

    def write_blob(self, sha256: str, path: Path, size: int, advance: Advance) -> None:
        if size > MAX_VALUE:
            raise RemoteError(f"{self._url}: blob {sha256[:16]} is {size} bytes; Redis values hold at most 512 MB")
        name = self._name("b", sha256)
        if size <= CHUNK:
            data = path.read_bytes()
            self._call("uploading a blob", lambda: self._r.set(name, data, nx=True), size=size)
            advance(len(data))
            return
        temp = self._name("tmp", uuid.uuid4().hex)
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                self._call("uploading a blob", self._r.append, temp, chunk, size=len(chunk))
                self._call("uploading a blob", self._r.expire, temp, _TEMP_TTL)
                advance(len(chunk))
        pipe = self._r.pipeline(transaction=True)
        pipe.renamenx(temp, name)
        pipe.persist(name)
        renamed, _ = self._call("publishing a blob", pipe.execute)
        if not renamed:  # already there: ours expires with its TTL, or goes now
            self._call("cleaning up", self._r.delete, temp)

    def entries(self) -> Iterator[tuple[str, str]]:
        pattern = self._name("m", "*")
        for name in self._call("listing entries", lambda: list(self._r.scan_iter(match=pattern, count=1000))):
            parts = name.decode("utf-8", "replace").split(":")  # another tool's odd names: listed, not parsed
            if len(parts) >= 5:
                yield parts[-2], parts[-1]

    def _scan(self, what: str, pattern: str) -> list[bytes]:
        return self._call(f"listing {what}", lambda: list(self._r.scan_iter(match=pattern, count=1000)))

    def variants(self) -> Iterator[Listed]:
        for name in self._scan("manifests", self._name("m", "*")):
            parts = name.decode("utf-8", "replace").split(":")  # another tool's odd names are listed, not parsed
            if len(parts) < 5:
                continue
            sizes = self._call("listing manifests", self._r.eval, _SIZES_LUA, 1, name, MAX_VARIANTS)
            for variant, size in zip(sizes[0::2], sizes[1::2]):
                yield Listed(f"{parts[-2]}/{parts[-1]}/{variant.decode('utf-8', 'replace')}", int(size), None)

    def blobs(self) -> Iterator[Listed]:
        for name in self._scan("blobs", self._name("b", "*")):
            size = self._call("listing blobs", self._r.strlen, name)
            yield Listed(name.decode("utf-8", "replace").rsplit(":", 1)[-1], int(size), None)

    def delete_manifest(self, kind: str, key: str, variant: str) -> None:
        self._call("deleting a manifest", self._r.hdel, self._name("m", kind, key), variant)

    def delete_blob(self, sha256: str) -> None:
        self._call("deleting a blob", self._r.delete, self._name("b", sha256))

    def marks(self) -> dict[str, float]:
        found = self._call("reading gc marks", self._r.hgetall, self._name("gc"))
        marks = {}
        for name, when in found.items():  # a mark another writer left odd is not a mark
            try:
                marks[name.decode()] = float(when)
            except (UnicodeDecodeError, ValueError):
                continue
        return marks

    def set_marks(self, marks: dict[str, float]) -> None:
        if marks:
            self._call("marking blobs", lambda: self._r.hset(self._name("gc"), mapping=marks))

    def clear_marks(self, shas: list[str]) -> None:
        if shas:
            self._call("clearing gc marks", self._r.hdel, self._name("gc"), *shas)

    # ---- build leases: expired by the server itself (PX), so a dead holder's goes away

    def read_lease(self, kind: str, key: str) -> tuple[bytes, Tag, float | None] | None:
        data = self._call("reading a lease", self._r.getrange, self._name("lease", kind, key), 0, LEASE_BYTES - 1)
        return (bytes(data), bytes(data), None) if data else None

    def put_lease(self, kind: str, key: str, data: bytes, ttl: float, replacing: Tag | None) -> Tag | None:
        name, ms = self._name("lease", kind, key), max(1, int(ttl * 1000))
        if replacing is None:
            done = self._call("taking a lease", lambda: self._r.set(name, data, nx=True, px=ms))
        else:
            done = self._call("renewing a lease", self._r.eval, _LEASE_REPLACE_LUA, 1, name, replacing, data, ms)
        return data if done else None

    def drop_lease(self, kind: str, key: str, tag: Tag) -> None:
        self._call("releasing a lease", self._r.eval, _LEASE_DROP_LUA, 1, self._name("lease", kind, key), tag)

    def leases(self) -> Iterator[Listed]:
        start = len(self._name("lease")) + 1
        for name in self._scan("leases", self._name("lease", "*")):
            kind, _, key = name.decode("utf-8", "replace")[start:].rpartition(":")
            yield Listed(f"{kind}/{key}", 0, None)

    def server_time(self) -> float | None:
        try:
            seconds, micros = self._call("reading the server's clock", self._r.time)
            return float(seconds) + float(micros) / 1e6
        except (RemoteError, TypeError, ValueError):
            return None

    # ---- shared failures: expired by the server itself (PX)

    def read_failure(self, kind: str, key: str) -> tuple[bytes, float | None] | None:
        """None too for a record the server does not expire: this engine writes every one
        with an expiry, so one without was written back by hand (a replay, kept for ever)."""
        name = self._name("failed", kind, key)

        def read() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            pipe.getrange(name, 0, FAILURE_BYTES - 1)
            pipe.pttl(name)
            return pipe.execute()

        data, ttl = self._call("reading a failure", read)
        return (bytes(data), None) if data and isinstance(ttl, int) and ttl > 0 else None

    def drop_failure(self, kind: str, key: str) -> None:
        self._call("clearing a failure", self._r.delete, self._name("failed", kind, key))

    def put_failure(self, kind: str, key: str, data: bytes, ttl: float) -> None:
        self._call("writing a failure", lambda: self._r.set(self._name("failed", kind, key), data[:FAILURE_BYTES],
                                                            px=max(1, int(ttl * 1000))))

    def close(self) -> None:
        try:
            self._r.close()
        except self._errors:
            pass


#: replies (and redis-py's names for them) that mean the server is a Redis Cluster node:
#: hash slots spread over several servers
_CLUSTER = ("MOVED", "ASK", "CLUSTERDOWN", "CROSSSLOT", "TRYAGAIN", "MovedError", "AskError", "ClusterDownError",
            "ClusterCrossSlotError", "TryAgainError")


def _hint(exc: Exception, prefix: str) -> str:
    """What to do about the failures a fleet's own configuration causes."""
    text = str(exc)
    if text.split(" ", 1)[0] in _CLUSTER or type(exc).__name__ in _CLUSTER:
        return ("; this server is a Redis Cluster node, and abicache needs one Redis server (a primary, "
                "with replicas if you like): point ABICACHE_REMOTE at a standalone server, or use an S3 remote")
    if text.startswith("NOPERM") or type(exc).__name__ == "NoPermissionError":
        return (f"; the ACL user may not do this: it needs the keys ~{prefix}:* and the commands "
                "EVAL, HSETNX, EXISTS, GET, GETRANGE, SET, APPEND, EXPIRE, RENAMENX, PERSIST, DEL, SCAN, MULTI, EXEC")
    if "WRONGPASS" in text or "NOAUTH" in text or "invalid username-password" in text:
        return "; check the user and password in the URL (redis://USER:PASSWORD@HOST:PORT/DB)"
    return ""

