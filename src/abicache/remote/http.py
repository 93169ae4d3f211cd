"""An http(s):// remote, for reading: any static file server, CDN or bucket's public URL
that serves a folder remote (remote/folder.py: `abicache push --remote file:///srv/www/abicache`).

Nothing is listed: a key's variants come from its index file (folder.INDEX_SUFFIX).
Bounded before trusted, as the other engines: every request has a total deadline
(the connection and each read time out after ABICACHE_REMOTE_TIMEOUT, and a
download may take that plus size / MIN_RATE in all: a server that drips a byte a
second is cut off), and nothing is read past the size announced for it (an index
or manifest past its limit is not read at all; a blob is streamed to the verifier,
which stops at its manifest's size). It is read-only: a write is a RemoteError
naming the folder remote to publish with. Standard library only (urllib).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

from ..errors import RemoteError
from .backend import CHUNK, MIN_RATE, Listed, Sink, Static, blob_name, entry_prefix, first_line
from .folder import INDEX_BYTES, index_name, names_index, parse_index
from .url import RemoteURL

_READ = 64 << 10


class HttpBackend(Static):
    def __init__(self, url: RemoteURL, timeout: float) -> None:
        self._base = f"{url.scheme}://{url.location}/{url.path}".rstrip("/") + "/"
        self._shown = url.redacted()
        self._timeout = timeout
        self._context = _tls_context(url.option("ca")) if url.scheme == "https" else None

    def _open(self, name: str, method: str = "GET") -> Any:
        """The response, or None for a 404; RemoteError for anything else."""
        request = urllib.request.Request(self._base + name, method=method,
                                         headers={"User-Agent": "abicache", "Accept-Encoding": "identity"})
        try:
            return urllib.request.urlopen(request, timeout=self._timeout, context=self._context)
        except urllib.error.HTTPError as exc:
            if exc.code in (403, 404, 410):  # a static server or bucket says "not there" with either
                exc.close()
                return None
            raise RemoteError(f"GET {self._shown}/{name}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise RemoteError(f"GET {self._shown}/{name} failed ({first_line(exc)})") from None

    def _get(self, name: str, limit: int) -> bytes | None:
        """At most limit bytes; None if absent or larger (its announced length is checked first)."""
        response = self._open(name)
        if response is None:
            return None
        with response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > limit:
                return None
            chunks, size, deadline = [], 0, time.monotonic() + self._timeout + limit / MIN_RATE
            try:
                while chunk := response.read(min(_READ, limit + 1 - size)):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > limit:
                        return None
                    if time.monotonic() > deadline:
                        raise RemoteError(f"GET {self._shown}/{name}: too slow (over {self._timeout} s "
                                          f"+ {MIN_RATE >> 20} MiB/s)")
            except OSError as exc:
                raise RemoteError(f"GET {self._shown}/{name} failed ({first_line(exc)})") from None
        return b"".join(chunks)

    def variant_list(self, kind: str, key: str, limit: int) -> list[Listed]:
        data = self._get(index_name(kind, key), INDEX_BYTES)
        return [] if data is None else parse_index(data, limit)

    def read_manifest(self, kind: str, key: str, variant: str, limit: int) -> bytes | None:
        return self._get(entry_prefix(kind, key) + variant, limit)

    def keys_named(self, kind: str, digest: str, limit: int) -> list[str]:
        data = self._get(names_index(kind, digest), INDEX_BYTES)
        keys = [] if data is None else data.decode("ascii", "replace").split()
        return [k for k in keys if len(k) == 64 and all(c in "0123456789abcdef" for c in k)][:limit]

    def has_blob(self, sha256: str) -> bool:
        response = self._open(blob_name(sha256), "HEAD")
        if response is None:
            return False
        response.close()
        return True

    def read_blob(self, sha256: str, size: int, sink: Sink) -> bool:
        name = blob_name(sha256)
        response = self._open(name)
        if response is None:
            return False
        deadline = time.monotonic() + self._timeout + size / MIN_RATE
        with response:
            try:
                while chunk := response.read(CHUNK):
                    sink(chunk)  # the verifier raises once more than `size` bytes came
                    if time.monotonic() > deadline:
                        raise RemoteError(f"GET {self._shown}/{name}: too slow")
            except OSError as exc:
                raise RemoteError(f"GET {self._shown}/{name} failed ({first_line(exc)})") from None
        return True

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise RemoteError(f"{self._shown} is read-only (a static server): publish with "
                          "abicache push --remote file:///the/folder/it/serves")

    put_manifest = write_blob = delete_manifest = delete_blob = set_marks = clear_marks = put_name = _read_only
    put_lease = entries = variants = blobs = marks = _read_only



def _tls_context(ca: str) -> Any:
    import ssl

    return ssl.create_default_context(cafile=ca or None)
