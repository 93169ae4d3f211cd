"""S3-compatible object storage (AWS S3, GCS's S3 API, R2, Ceph, SeaweedFS, moto)
through obstore.

Why obstore rather than boto3 (measured here, see docs/guides/remote.md):
import plus first request takes ~20 ms against ~240 ms for boto3, download
throughput is the same or better, and conditional create (`mode="create"`,
If-None-Match: *) is built in. Its timeout bounds a whole request, so each
transfer gets a client whose limit grows with the size (backend.MIN_RATE).
Credentials come from the usual AWS_* variables.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

from ..errors import RemoteError
from .backend import (CHUNK, LAYOUT, FAILURE_BYTES, LEASE_BYTES, Advance, Listed, Sink, Tag, blob_name, entry_prefix,
                      failure_name, file_chunks, first_line, lease_name, names_prefix, transfer_seconds)
from .url import RemoteURL


def _errors() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """(not found, any failure): obstore raises builtin FileNotFoundError for 404s."""
    from obstore.exceptions import BaseError, NotFoundError

    return (NotFoundError, FileNotFoundError), (BaseError, OSError)


class S3Backend:
    def __init__(self, url: RemoteURL, timeout: float) -> None:
        import obstore  # only when an s3:// remote is used

        self._obs = obstore
        self._url = url
        self._timeout = timeout
        self._clients: dict[int, Any] = {}
        self._meta = self._client(timeout)

    def _client(self, seconds: float) -> Any:
        """One client per whole-second limit: few clients, each bounded."""
        limit = max(1, int(seconds + 0.999))
        client = self._clients.get(limit)
        if client is None:
            from obstore.store import S3Store

            config = {}  # region and credentials otherwise come from AWS_* variables
            if self._url.option("region"):
                config["region"] = self._url.option("region")
            endpoint = self._url.option("endpoint")
            if endpoint:
                config["endpoint"] = endpoint
            client = self._clients[limit] = S3Store(
                self._url.location,
                prefix=self._url.path or None,
                config=config,
                client_options={
                    "connect_timeout": timedelta(seconds=self._timeout),
                    "timeout": timedelta(seconds=limit),
                    "allow_http": endpoint.startswith("http://"),
                },
                retry_config={  # at most one retry, quickly
                    "max_retries": 1,
                    "retry_timeout": timedelta(seconds=2 * limit + 1),
                    "backoff": {"init_backoff": timedelta(milliseconds=50),
                                "max_backoff": timedelta(milliseconds=500), "base": 2.0},
                },
            )
        return client

    def _fail(self, what: str, exc: Exception) -> RemoteError:
        return RemoteError(f"{what} failed ({first_line(exc)})")

    def variant_list(self, kind: str, key: str, limit: int) -> list[Listed]:
        """The first pages of the listing only: a key flooded with variants costs no more."""
        _, failure = _errors()
        prefix = entry_prefix(kind, key)
        out: list[Listed] = []
        try:
            for batch in self._obs.list(self._meta, prefix=prefix, chunk_size=min(1000, max(limit, 1))):
                for meta in batch:
                    variant = meta["path"][len(prefix):] if meta["path"].startswith(prefix) else ""
                    if variant and "/" not in variant:
                        when = meta.get("last_modified")
                        out.append(Listed(variant, int(meta["size"]), when.timestamp() if when else None))
                if len(out) >= limit:
                    break
        except failure as exc:
            raise self._fail(f"listing {prefix}", exc) from None
        return out[:limit]

    def read_manifest(self, kind: str, key: str, variant: str, limit: int) -> bytes | None:
        missing, failure = _errors()
        path = entry_prefix(kind, key) + variant
        try:  # ranged: a server that lied in the listing still sends at most limit + 1 bytes
            data = bytes(self._obs.get(self._meta, path, options={"range": (0, limit + 1)}).bytes())
        except missing:
            return None
        except failure as exc:
            raise self._fail(f"reading {path}", exc) from None
        return data if len(data) <= limit else None

    def put_manifest(self, kind: str, key: str, variant: str, data: bytes) -> bool:
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        _, failure = _errors()
        path = entry_prefix(kind, key) + variant
        try:
            self._obs.put(self._meta, path, data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
        except failure as exc:
            raise self._fail(f"writing {path}", exc) from None
        return True

    def put_name(self, kind: str, digest: str, key: str) -> None:
        _, failure = _errors()
        try:
            self._obs.put(self._meta, names_prefix(kind, digest) + key, b"")
        except failure as exc:
            raise self._fail(f"recording {kind} name {digest[:12]}", exc) from None

    def keys_named(self, kind: str, digest: str, limit: int) -> list[str]:
        _, failure = _errors()
        prefix, out = names_prefix(kind, digest), []
        try:
            for batch in self._obs.list(self._meta, prefix=prefix, chunk_size=min(1000, max(limit, 1))):
                out += [m["path"][len(prefix):] for m in batch if len(m["path"]) - len(prefix) == 64]
                if len(out) >= limit:
                    break
        except failure as exc:
            raise self._fail(f"listing {prefix}", exc) from None
        return out[:limit]

    def has_blob(self, sha256: str) -> bool:
        missing, failure = _errors()
        try:
            self._obs.head(self._meta, blob_name(sha256))
        except missing:
            return False
        except failure as exc:
            raise self._fail(f"checking blob {sha256[:16]}", exc) from None
        return True

    def read_blob(self, sha256: str, size: int, sink: Sink) -> bool:
        if size == 0:  # the empty blob: nothing to read, whatever the remote holds
            return self.has_blob(sha256)
        missing, failure = _errors()
        client = self._client(transfer_seconds(self._timeout, size))
        try:
            # Ranged: a blob longer than its manifest says is never sent past one byte more.
            got = self._obs.get(client, blob_name(sha256), options={"range": (0, size + 1)})
            for chunk in got.stream(min_chunk_size=min(1 << 20, size + 1)):  # 4 MiB measured slower
                sink(memoryview(chunk))  # no copy: hashlib and file writes take buffers
        except missing:
            return False
        except failure as exc:
            raise self._fail(f"downloading blob {sha256[:16]}", exc) from None
        return True

    def write_blob(self, sha256: str, path: Path, size: int, advance: Advance) -> None:
        _, failure = _errors()
        client = self._client(transfer_seconds(self._timeout, size))
        try:
            # Blobs are content addressed: a concurrent identical upload is harmless. Up to one
            # chunk goes in one PUT (a multipart upload would take three requests).
            if size <= CHUNK:
                data = path.read_bytes()
                self._obs.put(client, blob_name(sha256), data)
                advance(len(data))
            else:
                self._obs.put(client, blob_name(sha256), file_chunks(path, advance))
        except failure as exc:
            raise self._fail(f"uploading blob {sha256[:16]}", exc) from None

    def entries(self) -> Iterator[tuple[str, str]]:
        _, failure = _errors()
        seen = set()
        try:
            for batch in self._obs.list(self._meta, prefix=f"{LAYOUT}/entries/"):
                for meta in batch:
                    parts = meta["path"].split("/")
                    if len(parts) == 5 and (parts[2], parts[3]) not in seen:
                        seen.add((parts[2], parts[3]))
                        yield parts[2], parts[3]
        except failure as exc:
            raise self._fail("listing entries", exc) from None

    def _listed(self, prefix: str, what: str) -> Iterator[tuple[str, int, float | None]]:
        _, failure = _errors()
        try:
            for batch in self._obs.list(self._meta, prefix=prefix):
                for meta in batch:
                    when = meta.get("last_modified")
                    yield meta["path"][len(prefix):], int(meta["size"]), when.timestamp() if when else None
        except failure as exc:
            raise self._fail(f"listing {what}", exc) from None

    def variants(self) -> Iterator[Listed]:
        for rest, size, when in self._listed(f"{LAYOUT}/entries/", "manifests"):
            if rest.count("/") == 2:
                yield Listed(rest, size, when)

    def blobs(self) -> Iterator[Listed]:
        for rest, size, when in self._listed(f"{LAYOUT}/blobs/", "blobs"):
            if rest.count("/") == 1:
                yield Listed(rest.split("/")[1], size, when)

    def _delete(self, path: str) -> None:
        missing, failure = _errors()
        try:
            self._obs.delete(self._meta, path)
        except missing:
            pass
        except failure as exc:
            raise self._fail(f"deleting {path}", exc) from None

    def delete_manifest(self, kind: str, key: str, variant: str) -> None:
        self._delete(entry_prefix(kind, key) + variant)

    def delete_blob(self, sha256: str) -> None:
        self._delete(blob_name(sha256))

    def marks(self) -> dict[str, float]:
        # A mark is an empty object: the server's write time is when it was marked.
        return {rest: when or 0.0 for rest, _, when in self._listed(f"{LAYOUT}/gc/", "gc marks") if "/" not in rest}

    def set_marks(self, marks: dict[str, float]) -> None:
        _, failure = _errors()
        for sha in marks:
            try:
                self._obs.put(self._meta, f"{LAYOUT}/gc/{sha}", b"")
            except failure as exc:
                raise self._fail(f"marking blob {sha[:16]}", exc) from None

    def clear_marks(self, shas: list[str]) -> None:
        for sha in shas:
            self._delete(f"{LAYOUT}/gc/{sha}")

    # ---- build leases: conditional writes on the ETag (If-None-Match: * to take
    # one, If-Match to renew or take over a dead one), so two machines never both win

    def read_lease(self, kind: str, key: str) -> tuple[bytes, Tag, float | None] | None:
        return self._small(lease_name(kind, key), LEASE_BYTES)

    def _small(self, path: str, limit: int) -> tuple[bytes, str, float | None] | None:
        """A small object's first limit bytes, its ETag and its server write time."""
        missing, failure = _errors()
        try:
            got = self._obs.get(self._meta, path, options={"range": (0, limit)})
            when = got.meta.get("last_modified")
            return bytes(got.bytes())[:limit], str(got.meta.get("e_tag") or ""), when.timestamp() if when else None
        except missing:
            return None
        except failure as exc:
            raise self._fail(f"reading {path}", exc) from None

    def server_time(self) -> float | None:
        """S3 has no clock call: the write time the server gives an empty object this
        process writes (<LAYOUT>/clock/<uuid>), reads back and deletes."""
        import uuid

        _, failure = _errors()
        path = f"{LAYOUT}/clock/{uuid.uuid4().hex}"
        try:
            self._obs.put(self._meta, path, b"")
            when = self._obs.head(self._meta, path).get("last_modified")
            self._obs.delete(self._meta, path)
        except failure:
            return None
        return when.timestamp() if when else None

    def read_failure(self, kind: str, key: str) -> tuple[bytes, float | None] | None:
        got = self._small(failure_name(kind, key), FAILURE_BYTES)
        return None if got is None else (got[0], got[2])

    def put_failure(self, kind: str, key: str, data: bytes, ttl: float) -> None:
        _, failure = _errors()
        path = failure_name(kind, key)
        try:
            self._obs.put(self._meta, path, data[:FAILURE_BYTES])
        except failure as exc:
            raise self._fail(f"writing {path}", exc) from None

    def drop_failure(self, kind: str, key: str) -> None:
        self._delete(failure_name(kind, key))

    def put_lease(self, kind: str, key: str, data: bytes, ttl: float, replacing: Tag | None) -> Tag | None:
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        missing, failure = _errors()
        path = lease_name(kind, key)
        mode: Any = "create" if replacing is None else {"e_tag": str(replacing)}
        try:
            result = self._obs.put(self._meta, path, data, mode=mode)
        except (AlreadyExistsError, PreconditionError, *missing):
            return None
        except failure as exc:
            raise self._fail(f"writing {path}", exc) from None
        return str(result.get("e_tag") or "")

    def drop_lease(self, kind: str, key: str, tag: Tag) -> None:
        # S3 has no conditional delete everywhere: read, compare, delete. A waiter that
        # took the lease over in between loses it early: at worst one more build.
        found = self.read_lease(kind, key)
        if found is not None and found[1] == tag:
            self._delete(lease_name(kind, key))

    def leases(self) -> Iterator[Listed]:
        for rest, size, when in self._listed(f"{LAYOUT}/leases/", "leases"):
            if rest.count("/") == 1:
                yield Listed(rest, size, when)

    def close(self) -> None:
        self._clients.clear()
