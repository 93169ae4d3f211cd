"""A folder as a remote store: file:///srv/abicache (a shared mount, or what a web server serves).

The layout is the S3 layout (backend.py), plus one small index per key,
v1/entries/<kind>/<key>.variants (a line "<variant> <size> <written>" per
manifest, rewritten after each publish), and one per name,
v1/names/<kind>/<digest>.keys (a key a line), so that a static file server can
serve the folder to readers that cannot list it (remote/http.py: any web
server, CDN or bucket's public URL). `abicache push --remote file:///srv/www/abicache`
publishes; readers set ABICACHE_REMOTE=https://host/abicache.

First writer wins, as on the other engines: a manifest is written to a
temporary name and hard-linked into place (the link fails if one is there).
Blobs are written to a temporary name and renamed. Build leases are not kept
(a folder is a place to publish, not a fleet's meeting point: ABICACHE_REMOTE_LEASE
is 0 for it); every OSError is a RemoteError, so a missing mount fails open.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Iterator

from ..errors import RemoteError
from .backend import CHUNK, Advance, Listed, Sink, Static, Tag, blob_name, entry_prefix, names_prefix
from .url import RemoteURL

#: the per-key index a static server serves in place of a listing
INDEX_SUFFIX = ".variants"
INDEX_BYTES = 256 << 10


def index_name(kind: str, key: str) -> str:
    return entry_prefix(kind, key).rstrip("/") + INDEX_SUFFIX


def names_index(kind: str, digest: str) -> str:
    """The keys of one name, a line each, for readers that cannot list (http.py)."""
    return names_prefix(kind, digest).rstrip("/") + ".keys"


def parse_index(data: bytes, limit: int) -> list[Listed]:
    """The index's lines as Listed (name: the variant); malformed lines are skipped."""
    out = []
    for line in data.decode("utf-8", "replace").splitlines()[:limit]:
        parts = line.split()
        if len(parts) == 3 and len(parts[0]) == 16 and all(c in "0123456789abcdef" for c in parts[0]):
            try:
                out.append(Listed(parts[0], int(parts[1]), float(parts[2])))
            except ValueError:
                continue
    return out


class FolderBackend(Static):
    def __init__(self, url: RemoteURL, timeout: float) -> None:
        self._root = Path("/" + url.path)

    def _p(self, name: str) -> Path:
        return self._root / name

    def _fail(self, what: str, exc: OSError) -> RemoteError:
        return RemoteError(f"{what} in {self._root} failed ({exc.strerror or exc})")

    def variant_list(self, kind: str, key: str, limit: int) -> list[Listed]:
        folder = self._p(entry_prefix(kind, key))
        try:
            with os.scandir(folder) as it:
                found = [e for e in it if len(e.name) == 16 and e.is_file(follow_symlinks=False)]
            return [Listed(e.name, st.st_size, st.st_mtime) for e in found[:limit] for st in [e.stat()]]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._fail(f"listing {kind}/{key[:16]}", exc) from None

    def read_manifest(self, kind: str, key: str, variant: str, limit: int) -> bytes | None:
        return self._read(entry_prefix(kind, key) + variant, limit)

    def _read(self, name: str, limit: int) -> bytes | None:
        try:
            fd = os.open(self._p(name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail(f"reading {name}", exc) from None
        try:
            if os.fstat(fd).st_size > limit:
                return None
            data = os.read(fd, limit + 1)
            return None if len(data) > limit else data
        except OSError as exc:
            raise self._fail(f"reading {name}", exc) from None
        finally:
            os.close(fd)

    def put_manifest(self, kind: str, key: str, variant: str, data: bytes) -> bool:
        final = self._p(entry_prefix(kind, key) + variant)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            temp = self._temp(final, data)
            try:
                os.link(temp, final)
            except FileExistsError:
                return False
            finally:
                os.unlink(temp)
            self._write_index(kind, key)
            return True
        except OSError as exc:
            raise self._fail(f"publishing {kind}/{key[:16]}/{variant}", exc) from None

    def _write_index(self, kind: str, key: str) -> None:
        lines = [f"{v.name} {v.size} {v.written:.3f}\n" for v in self.variant_list(kind, key, 4096)]
        final = self._p(index_name(kind, key))
        os.replace(self._temp(final, "".join(sorted(lines)).encode()), final)

    @staticmethod
    def _temp(final: Path, data: bytes) -> Path:
        temp = final.with_name(f".{final.name}.{os.getpid()}-{time.monotonic_ns()}")
        with open(temp, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)  # a web server reads it as another user
        return temp

    def put_name(self, kind: str, digest: str, key: str) -> None:
        folder = self._p(names_prefix(kind, digest))
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / key).touch()
            listed = "".join(f"{k}\n" for k in self.keys_named(kind, digest, 4096))
            final = self._p(names_index(kind, digest))
            os.replace(self._temp(final, listed.encode()), final)
        except OSError as exc:
            raise self._fail(f"recording {kind} name {digest[:12]}", exc) from None

    def keys_named(self, kind: str, digest: str, limit: int) -> list[str]:
        return [k for k in _names(self._p(names_prefix(kind, digest)), files=True) if len(k) == 64][:limit]

    def has_blob(self, sha256: str) -> bool:
        return self._p(blob_name(sha256)).is_file()

    def read_blob(self, sha256: str, size: int, sink: Sink) -> bool:
        try:
            with open(self._p(blob_name(sha256)), "rb") as fh:
                while chunk := fh.read(CHUNK):
                    sink(chunk)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._fail(f"reading blob {sha256[:16]}", exc) from None

    def write_blob(self, sha256: str, path: Path, size: int, advance: Advance) -> None:
        final = self._p(blob_name(sha256))
        try:
            if final.is_file():
                return
            final.parent.mkdir(parents=True, exist_ok=True)
            temp = final.with_name(f".{final.name}.{os.getpid()}-{time.monotonic_ns()}")
            with open(path, "rb") as src, open(temp, "xb") as out:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    advance(len(chunk))
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temp, 0o644)
            os.replace(temp, final)
        except OSError as exc:
            raise self._fail(f"uploading blob {sha256[:16]}", exc) from None

    def entries(self) -> Iterator[tuple[str, str]]:
        for kind in _names(self._p("v1/entries")):
            for key in _names(self._p(f"v1/entries/{kind}")):
                if len(key) == 64:
                    yield kind, key

    def variants(self) -> Iterator[Listed]:
        for kind, key in self.entries():
            for item in self.variant_list(kind, key, 1 << 20):
                yield Listed(f"{kind}/{key}/{item.name}", item.size, item.written)

    def blobs(self) -> Iterator[Listed]:
        for prefix in _names(self._p("v1/blobs")):
            for name in _names(self._p(f"v1/blobs/{prefix}")):
                if len(name) == 64:
                    st = os.stat(self._p(f"v1/blobs/{prefix}/{name}"))
                    yield Listed(name, st.st_size, st.st_mtime)

    def delete_manifest(self, kind: str, key: str, variant: str) -> None:
        try:
            os.unlink(self._p(entry_prefix(kind, key) + variant))
            self._write_index(kind, key)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._fail(f"deleting {kind}/{key[:16]}/{variant}", exc) from None

    def delete_blob(self, sha256: str) -> None:
        try:
            os.unlink(self._p(blob_name(sha256)))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._fail(f"deleting blob {sha256[:16]}", exc) from None

    def marks(self) -> dict[str, float]:
        folder = self._p("v1/gc")
        return {name: os.stat(folder / name).st_mtime for name in _names(folder, files=True) if len(name) == 64}

    def set_marks(self, marks: dict[str, float]) -> None:
        folder = self._p("v1/gc")
        folder.mkdir(parents=True, exist_ok=True)
        for sha in marks:
            (folder / sha).touch()

    def clear_marks(self, shas: list[str]) -> None:
        for sha in shas:
            try:
                os.unlink(self._p(f"v1/gc/{sha}"))
            except FileNotFoundError:
                pass

    def put_lease(self, kind: str, key: str, data: bytes, ttl: float, replacing: Tag | None) -> Tag | None:
        raise RemoteError(f"a folder remote ({self._root}) keeps no build leases (its settings' lease is 0)")


def _names(folder: Path, files: bool = False) -> list[str]:
    try:
        with os.scandir(folder) as it:
            return sorted(e.name for e in it if not e.name.startswith(".")
                          and (e.is_file(follow_symlinks=False) if files else e.is_dir(follow_symlinks=False)))
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return []
        raise RemoteError(f"listing {folder} failed ({exc.strerror})") from None
