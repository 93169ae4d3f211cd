"""An http(s):// remote, for reading: any static file server, CDN or bucket's public URL
that serves a folder remote (remote/folder.py: `abicache push --remote file:///srv/www/abicache`).

Nothing is listed: a key's variants come from its index file (folder.INDEX_SUFFIX).
Bounded before trusted, as the other engines: every request has one deadline for
the whole of it, status line, headers and body together (ABICACHE_REMOTE_TIMEOUT,
plus size / MIN_RATE for what it may download): a watchdog (backend.Watchdog, as
Redis's calls have) shuts its sockets down when the deadline passes, so a server that drips a byte a second is cut off
wherever it drips (a socket timeout alone restarts with every byte). Nothing is read
past the size announced for it (an index or manifest past its limit is not read at
all; a blob is streamed to the verifier, which stops at its manifest's size). It is
read-only: a write is a RemoteError naming the folder remote to publish with.
Standard library only (urllib, whose proxies and redirects it keeps).
"""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.error
import urllib.request
from typing import Any

from ..errors import RemoteError
from .backend import CHUNK, MIN_RATE, Listed, Sink, Static, Watchdog, blob_name, entry_prefix, first_line
from .folder import INDEX_BYTES, index_name, names_index, parse_index
from .url import RemoteURL

_READ = 64 << 10


class _Sockets:
    """The sockets one request opened (a redirect opens another): its watchdog shuts them all
    down, and a blocked read returns at once."""

    def __init__(self) -> None:
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.append(sock)

    def shut(self) -> None:
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _watched(base: type[http.client.HTTPConnection], sockets: _Sockets) -> Any:
    """A connection class of `base` whose sockets join the request's."""

    class Watched(base):  # type: ignore[misc, valid-type]
        def connect(self) -> None:
            super().connect()
            sockets.add(self.sock)

    return Watched


class _Handler(urllib.request.HTTPHandler):
    def __init__(self, sockets: _Sockets) -> None:
        super().__init__()
        self._sockets = sockets

    def http_open(self, req: Any) -> Any:
        return self.do_open(_watched(http.client.HTTPConnection, self._sockets), req)


class _TLSHandler(urllib.request.HTTPSHandler):
    def __init__(self, sockets: _Sockets, context: Any) -> None:
        super().__init__(context=context)
        self._sockets = sockets

    def https_open(self, req: Any) -> Any:
        return self.do_open(_watched(http.client.HTTPSConnection, self._sockets), req, context=self._context)


class HttpBackend(Static):
    def __init__(self, url: RemoteURL, timeout: float) -> None:
        self._base = f"{url.scheme}://{url.location}/{url.path}".rstrip("/") + "/"
        self._shown = url.redacted()
        self._timeout = timeout
        self._context = _tls_context(url.option("ca")) if url.scheme == "https" else None

    def _open(self, name: str, deadline: Watchdog, sockets: _Sockets, method: str = "GET") -> Any:
        """The response, or None for a 404; RemoteError for anything else."""
        request = urllib.request.Request(self._base + name, method=method,
                                         headers={"User-Agent": "abicache", "Accept-Encoding": "identity"})
        opener = urllib.request.build_opener(_Handler(sockets), _TLSHandler(sockets, self._context))
        try:
            return opener.open(request, timeout=self._timeout)
        except urllib.error.HTTPError as exc:
            if exc.code in (403, 404, 410):  # a static server or bucket says "not there" with either
                exc.close()
                return None
            raise RemoteError(f"GET {self._shown}/{name}: HTTP {exc.code}") from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise self._failed(name, deadline, exc) from None

    def _failed(self, name: str, deadline: Watchdog, exc: BaseException) -> RemoteError:
        if deadline.expired:
            return RemoteError(f"GET {self._shown}/{name}: too slow (no whole answer within its deadline: "
                               f"{self._timeout} s + {MIN_RATE >> 20} MiB/s; ABICACHE_REMOTE_TIMEOUT sets it)")
        return RemoteError(f"GET {self._shown}/{name} failed ({first_line(exc)})")

    def _request(self, name: str, size: int, method: str = "GET") -> tuple[Any, Watchdog]:
        """The response (None for a 404) and the watchdog over the whole request: stop it when done."""
        sockets = _Sockets()
        deadline = Watchdog(self._timeout + size / MIN_RATE, sockets.shut).start()
        try:
            return self._open(name, deadline, sockets, method), deadline
        except BaseException:
            deadline.stop()
            raise

    def _get(self, name: str, limit: int) -> bytes | None:
        """At most limit bytes; None if absent or larger (its announced length is checked first)."""
        response, deadline = self._request(name, limit)
        if response is None:
            deadline.stop()
            return None
        chunks, size = [], 0
        try:
            with response:
                length = response.headers.get("Content-Length")
                if length is not None and length.isdigit() and int(length) > limit:
                    return None
                while chunk := response.read(min(_READ, limit + 1 - size)):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > limit:
                        return None
        except (OSError, http.client.HTTPException) as exc:
            raise self._failed(name, deadline, exc) from None
        finally:
            deadline.stop()
        if deadline.expired:  # cut short: what came is not the whole file
            raise self._failed(name, deadline, TimeoutError())
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
        response, deadline = self._request(blob_name(sha256), 0, "HEAD")
        deadline.stop()
        if response is None:
            return False
        response.close()
        return True

    def read_blob(self, sha256: str, size: int, sink: Sink) -> bool:
        name = blob_name(sha256)
        response, deadline = self._request(name, size)
        if response is None:
            deadline.stop()
            return False
        try:
            with response:
                while chunk := response.read(CHUNK):
                    sink(chunk)  # the verifier raises once more than `size` bytes came
        except (OSError, http.client.HTTPException) as exc:
            raise self._failed(name, deadline, exc) from None
        finally:
            deadline.stop()
        if deadline.expired:
            raise self._failed(name, deadline, TimeoutError())
        return True

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise RemoteError(f"{self._shown} is read-only (a static server): publish with "
                          "abicache push --remote file:///the/folder/it/serves")

    put_manifest = write_blob = delete_manifest = delete_blob = set_marks = clear_marks = put_name = _read_only
    put_lease = entries = variants = blobs = marks = _read_only



def _tls_context(ca: str) -> Any:
    import ssl

    return ssl.create_default_context(cafile=ca or None)
