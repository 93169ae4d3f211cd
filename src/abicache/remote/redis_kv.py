"""Redis (or Valkey, KeyDB) through redis-py.

One hash per key holds its variants' manifests (HSETNX: first writer wins,
and one HGETALL fetches them all); one string per blob. Large blobs move in
pieces (APPEND to a temporary key, then an atomic RENAMENX), so neither side
holds a whole 100 MB value in memory. Redis caps a value at 512 MB.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterator

from ..errors import RemoteError
from .backend import CHUNK, Advance, Sink, first_line
from .url import RemoteURL

MAX_VALUE = 512 << 20
_TEMP_TTL = 3600  # an upload interrupted by a crash disappears after an hour


class RedisBackend:
    def __init__(self, url: RemoteURL, timeout: float) -> None:
        import redis  # only when a redis:// remote is used
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._url = url
        self._errors: tuple[type[Exception], ...] = (redis.RedisError,)
        self._prefix = url.option("prefix", "abicache")
        self._r = redis.Redis.from_url(
            url.text.split("?")[0],
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 1),  # at most one retry
            health_check_interval=0,
        )

    def _name(self, *parts: str) -> str:
        return ":".join((self._prefix, "v1") + parts)

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._errors as exc:
            raise RemoteError(f"{what} failed ({first_line(exc)})") from None

    def manifests(self, kind: str, key: str, limit: int) -> dict[str, bytes | None]:
        found = self._call("reading manifests", self._r.hgetall, self._name("m", kind, key))
        return {v.decode(): (d if len(d) <= limit else None) for v, d in found.items()}

    def put_manifest(self, kind: str, key: str, variant: str, data: bytes) -> bool:
        return bool(self._call("writing a manifest", self._r.hsetnx, self._name("m", kind, key), variant, data))

    def has_blob(self, sha256: str) -> bool:
        return bool(self._call("checking a blob", self._r.exists, self._name("b", sha256)))

    def read_blob(self, sha256: str, size: int, sink: Sink) -> bool:
        name = self._name("b", sha256)
        if size <= CHUNK:
            data = self._call("downloading a blob", self._r.get, name)
            if data is None:
                return False
            sink(data)
            return True
        # Blobs never change once written, so reading in ranges is consistent;
        # a range past the end comes back empty and ends the loop early.
        if not self._call("checking a blob", self._r.exists, name):
            return False
        offset = 0
        while offset < size + 1:
            piece = self._call("downloading a blob", self._r.getrange, name, offset, offset + CHUNK - 1)
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
            self._call("uploading a blob", lambda: self._r.set(name, data, nx=True))
            advance(len(data))
            return
        temp = self._name("tmp", uuid.uuid4().hex)
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                self._call("uploading a blob", self._r.append, temp, chunk)
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
            parts = name.decode().split(":")
            if len(parts) >= 5:
                yield parts[-2], parts[-1]

    def close(self) -> None:
        try:
            self._r.close()
        except self._errors:
            pass
