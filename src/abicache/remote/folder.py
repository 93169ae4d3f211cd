"""A folder as a remote store: file:///srv/abicache (a shared mount, or what a web server serves).

The layout is the S3 layout (backend.py), plus one small index per key,
v2/entries/<kind>/<key>.variants (a line "<variant> <size> <written>" per
manifest, rewritten after each publish), and one per name,
v2/names/<kind>/<digest>.keys (a key a line), so that a static file server can
serve the folder to readers that cannot list it (remote/http.py: any web
server, CDN or bucket's public URL). `abicache push --remote file:///srv/www/abicache`
publishes; readers set ABICACHE_REMOTE=https://host/abicache.

First writer wins, as on the other engines: a manifest is written to a
temporary name and hard-linked into place (the link fails if one is there).
Blobs are written to a temporary name and renamed. Build leases are not kept
(a folder is a place to publish, not a fleet's meeting point: ABICACHE_REMOTE_LEASE
is 0 for it); every OSError is a RemoteError, so a missing mount fails open.

Bounded before trusted, as the other engines: only regular files are read, opened by
descriptor without following a link and without blocking (a FIFO planted at a blob's
path would hang a plain open() for ever) and checked by fstat against the size
announced for them; gc marks are made with O_EXCL | O_NOFOLLOW; and every call runs
against a deadline (ABICACHE_REMOTE_TIMEOUT, plus size / MIN_RATE for a blob), so a
hung mount makes a RemoteError, not a hung process.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from ..errors import RemoteError
from .backend import CHUNK, LAYOUT, MIN_RATE, Advance, Listed, Sink, Static, Tag, blob_name, entry_prefix, names_prefix
from . import packed
from .url import RemoteURL

_T = TypeVar("_T")
#: open a file of the remote: no link followed, no wait on a FIFO or device
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

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


def bounded(call: Callable[[], _T], seconds: float, what: str) -> _T:
    """call() in a thread of its own, or RemoteError after `seconds`: a file system call
    on a hung mount cannot be interrupted, so the caller stops waiting for it instead (the
    thread is a daemon: it never holds up the process's exit)."""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as exc:  # noqa: BLE001  (handed to the caller as it is)
            box.append((False, exc))

    worker = threading.Thread(target=run, name="abicache-folder-remote", daemon=True)
    worker.start()
    worker.join(seconds)
    if not box:
        raise RemoteError(f"{what}: no answer in {seconds:.1f} s (a hung mount?); ABICACHE_REMOTE_TIMEOUT sets it")
    ok, value = box[0]
    if ok:
        return value
    raise value


class FolderBackend(Static):
    def __init__(self, url: RemoteURL, timeout: float) -> None:
        self._root = Path("/" + url.path)
        self._timeout = timeout

    def _p(self, name: str) -> Path:
        return self._root / name

    def _fail(self, what: str, exc: OSError) -> RemoteError:
        return RemoteError(f"{what} in {self._root} failed ({exc.strerror or exc})")

    def _bounded(self, call: Callable[[], _T], what: str, size: int = 0) -> _T:
        return bounded(call, self._timeout + size / MIN_RATE, f"{what} in {self._root}")

    def variant_list(self, kind: str, key: str, limit: int) -> list[Listed]:
        return self._bounded(lambda: self._variant_list(kind, key, limit), f"listing {kind}/{key[:16]}")

    def _variant_list(self, kind: str, key: str, limit: int) -> list[Listed]:
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
        name = entry_prefix(kind, key) + variant
        return self._bounded(lambda: self._read(name, limit), f"reading {name}", limit)

    def _open(self, name: str) -> int | None:
        """A descriptor of the regular file at name (None if there is none); RemoteError for
        anything else there (a link, a FIFO, a device, a folder)."""
        try:
            fd = os.open(self._p(name), _READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RemoteError(f"{name} in {self._root} is a symbolic link, not a file: refused") from None
            raise self._fail(f"reading {name}", exc) from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise RemoteError(f"{name} in {self._root} is not a regular file (mode {mode:o}): refused")
        return fd

    def _read(self, name: str, limit: int) -> bytes | None:
        fd = self._open(name)
        if fd is None:
            return None
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
        return self._bounded(lambda: self._put_manifest(kind, key, variant, data),
                             f"publishing {kind}/{key[:16]}/{variant}", len(data))

    def _put_manifest(self, kind: str, key: str, variant: str, data: bytes) -> bool:
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
        lines = [f"{v.name} {v.size} {v.written:.3f}\n" for v in self._variant_list(kind, key, 4096)]
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
        self._bounded(lambda: self._put_name(kind, digest, key), f"recording {kind} name {digest[:12]}")

    def _put_name(self, kind: str, digest: str, key: str) -> None:
        folder = self._p(names_prefix(kind, digest))
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _mark(folder / key)
            listed = "".join(f"{k}\n" for k in self._keys_named(kind, digest, 4096))
            final = self._p(names_index(kind, digest))
            os.replace(self._temp(final, listed.encode()), final)
        except OSError as exc:
            raise self._fail(f"recording {kind} name {digest[:12]}", exc) from None

    def keys_named(self, kind: str, digest: str, limit: int) -> list[str]:
        return self._bounded(lambda: self._keys_named(kind, digest, limit), f"listing {kind} name {digest[:12]}")

    def _keys_named(self, kind: str, digest: str, limit: int) -> list[str]:
        return [k for k in _names(self._p(names_prefix(kind, digest)), files=True) if len(k) == 64][:limit]

    def has_blob(self, sha256: str) -> bool:
        return self._bounded(lambda: _is_file(self._p(blob_name(sha256))), f"looking for blob {sha256[:16]}")

    def read_blob(self, sha256: str, size: int, sink: Sink) -> bool:
        stop = threading.Event()  # set when the caller stopped waiting: the sink is its no longer
        try:
            return self._bounded(lambda: self._read_blob(sha256, size, sink, stop), f"reading blob {sha256[:16]}",
                                 size)
        finally:
            stop.set()

    def _read_blob(self, sha256: str, size: int, sink: Sink, stop: threading.Event) -> bool:
        name = blob_name(sha256)
        fd = self._open(name)
        if fd is None:
            return False
        try:
            left = size + 1  # one byte past the announced size is enough for the verifier to refuse it
            with os.fdopen(fd, "rb", closefd=False) as fh:
                while left > 0 and (chunk := fh.read(min(CHUNK, left))) and not stop.is_set():
                    left -= len(chunk)
                    sink(chunk)
            return True
        except OSError as exc:
            raise self._fail(f"reading blob {sha256[:16]}", exc) from None
        finally:
            os.close(fd)

    def write_blob(self, sha256: str, path: Path, size: int, advance: Advance) -> None:
        self._bounded(lambda: self._write_blob(sha256, path, advance), f"uploading blob {sha256[:16]}", size)

    def _write_blob(self, sha256: str, path: Path, advance: Advance) -> None:
        final = self._p(blob_name(sha256))
        try:
            if _is_file(final):
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

    def _listed(self, folder: str, files: bool = False) -> list[str]:
        return self._bounded(lambda: _names(self._p(folder), files), f"listing {folder}")

    def entries(self) -> Iterator[tuple[str, str]]:
        for kind in self._listed(f"{LAYOUT}/entries"):
            for key in self._listed(f"{LAYOUT}/entries/{kind}"):
                if len(key) == 64:
                    yield kind, key

    def variants(self) -> Iterator[Listed]:
        for kind, key in self.entries():
            for item in self.variant_list(kind, key, 1 << 20):
                yield Listed(f"{kind}/{key}/{item.name}", item.size, item.written)

    def blobs(self) -> Iterator[Listed]:
        """Every blob: the regular files of <LAYOUT>/blobs/<2 hex>/ named by a digest (a folder or a
        link named like one is no blob: listing folders here once made prune think every
        manifest named a missing blob)."""
        for prefix in self._listed(f"{LAYOUT}/blobs"):
            folder = f"{LAYOUT}/blobs/{prefix}"
            yield from self._bounded(lambda: _files_listed(self._p(folder)), f"listing {folder}")

    def delete_manifest(self, kind: str, key: str, variant: str) -> None:
        self._bounded(lambda: self._delete_manifest(kind, key, variant), f"deleting {kind}/{key[:16]}/{variant}")

    def _delete_manifest(self, kind: str, key: str, variant: str) -> None:
        try:
            os.unlink(self._p(entry_prefix(kind, key) + variant))
            self._write_index(kind, key)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._fail(f"deleting {kind}/{key[:16]}/{variant}", exc) from None

    def delete_blob(self, sha256: str) -> None:
        self._bounded(lambda: self._delete_blob(sha256), f"deleting blob {sha256[:16]}")

    def _delete_blob(self, sha256: str) -> None:
        try:
            os.unlink(self._p(blob_name(sha256)))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._fail(f"deleting blob {sha256[:16]}", exc) from None

    def marks(self) -> dict[str, float]:
        folder = self._p(f"{LAYOUT}/gc")

        def read() -> dict[str, float]:
            return {name: os.lstat(folder / name).st_mtime for name in _names(folder, files=True) if len(name) == 64}

        return self._bounded(read, "reading gc marks")

    def set_marks(self, marks: dict[str, float]) -> None:
        folder = self._p(f"{LAYOUT}/gc")

        def write() -> None:
            folder.mkdir(parents=True, exist_ok=True)
            for sha in marks:
                _mark(folder / sha)

        self._bounded(write, "marking unnamed blobs")

    def clear_marks(self, shas: list[str]) -> None:
        def clear() -> None:
            for sha in shas:
                try:
                    os.unlink(self._p(f"{LAYOUT}/gc/{sha}"))
                except (FileNotFoundError, IsADirectoryError):
                    pass

        self._bounded(clear, "clearing gc marks")

    def put_lease(self, kind: str, key: str, data: bytes, ttl: float, replacing: Tag | None) -> Tag | None:
        raise RemoteError(f"a folder remote ({self._root}) keeps no build leases (its settings' lease is 0)")


def _is_file(path: Path) -> bool:
    """A regular file there (a link to one is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _mark(path: Path) -> None:
    """An empty file at path, made now or touched if one is there, without following a link:
    a link planted there is removed, never written through (the pruning user is often root)."""
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644))
            return
        except FileExistsError:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                os.utime(path, follow_symlinks=False)
                return
            if stat.S_ISDIR(st.st_mode):
                raise RemoteError(f"{path} is a folder where a mark file belongs: remove it") from None
            os.unlink(path)  # a link, a FIFO: not ours
    raise RemoteError(f"{path} keeps being replaced while it is written")


def _files_listed(folder: Path) -> list[Listed]:
    """The regular files named as packed blobs in folder (packed.py), with their sizes and times
    (one listing)."""
    try:
        with os.scandir(folder) as it:
            found = [(e.name, e.stat(follow_symlinks=False)) for e in it
                     if packed.sha_of(e.name) is not None and e.is_file(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise RemoteError(f"listing {folder} failed ({exc.strerror})") from None
    return [Listed(name, st.st_size, st.st_mtime) for name, st in sorted(found)]


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
