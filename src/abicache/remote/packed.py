"""Blobs on a remote are kept compressed: zstd frames under `<sha256>.zst`.

A shared library or a fatbin shrinks 3-5x with zstd at level 3, so every fleet hit moves,
and the object store keeps, a fraction of the bytes. The local store keeps files as they
are (directly loadable); only the remote's copy is packed. Every blob is packed, whatever
it holds: a frame of random bytes is a few bytes longer than they are and inflates at
memory speed (a remote hit of 100 MiB of random bytes: 93% of the raw client's download of
the object), and one name a blob means one request a read. The bytes that come out are hashed and sized against
the manifest as before (shipping/replicate.py). The remote's layout version
(backend.LAYOUT) moved to v2 with this: an abicache that keeps blobs raw reads and prunes
only v1/, and never meets a frame.

A frame is decompressed while it downloads, into the verifier, in pieces of at most
`PIECE` bytes with a window of at most `WINDOW`: a small blob that inflates to gigabytes (a
decompression bomb) is cut as soon as it passes the size the manifest announces, and never
holds more than a piece and a window in memory.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

#: the suffix of a packed blob's name (the format: a zstd frame of the file's bytes)
SUFFIX = ".zst"
#: zstd level: 3 is zstd's default, about 300 MB/s per core to pack and over 1 GB/s to unpack
LEVEL = 3
#: the largest window a frame may ask for (level 3 uses at most 2 MiB on large inputs)
WINDOW = 8 << 20
#: decompressed bytes handed to the verifier at a time
PIECE = 1 << 20


def packed_name(sha256: str) -> str:
    """The name a blob is stored under, packed (backend.blob_name places it)."""
    return sha256 + SUFFIX


def sha_of(name: str) -> str | None:
    """The sha256 a listed blob name stands for, or None for a name that is no packed blob."""
    sha = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else ""
    return sha if len(sha) == 64 and all(c in "0123456789abcdef" for c in sha) else None


def bound(size: int) -> int:
    """The most bytes a frame of `size` bytes takes (zstd's compress bound)."""
    return size + (size >> 8) + (((128 << 10) - size) >> 11 if size < (128 << 10) else 0) + 64


@contextmanager
def packing(path: Path, folder: Path) -> Iterator[tuple[Path, int]]:
    """(a packed copy of the file at path, its size): a temporary file in folder, removed after."""
    import zstandard

    fd, temp = tempfile.mkstemp(prefix=".pack-", dir=folder)
    try:
        with open(path, "rb") as src, os.fdopen(fd, "wb") as out:
            size = os.fstat(src.fileno()).st_size
            zstandard.ZstdCompressor(level=LEVEL, threads=-1).copy_stream(src, out, size=size)
        yield Path(temp), os.path.getsize(temp)
    finally:
        os.unlink(temp)


class Unpacking:
    """A sink for a packed blob's pieces that hands the file's bytes to `sink` as they come, from
    a thread of its own: inflating (about 1 GB/s) and the sink's hashing and writing then run
    side by side, not one after the other (a remote hit of 100 MiB of library bytes over
    loopback: 0.28 s inflating in line, 0.18 s so, the raw file 0.21 s). At most QUEUED pieces
    wait; an error of the sink (the verifier refusing a byte past the manifest's size) stops
    the download at its next piece."""

    QUEUED = 8

    def __init__(self, sink: Callable[[bytes], None]) -> None:
        import queue
        import threading

        import zstandard

        self._sink = sink
        self._queue: queue.Queue[bytes | None] = queue.Queue(self.QUEUED)
        self._failed: BaseException | None = None
        self._closed = False
        self._writer = zstandard.ZstdDecompressor(max_window_size=WINDOW).stream_writer(
            _To(self._put), write_size=PIECE, write_return_read=True, closefd=False)
        self._error = zstandard.ZstdError
        self._thread = threading.Thread(target=self._drain, name="abicache-unpack", daemon=True)
        self._thread.start()

    def feed(self, chunk: bytes | memoryview) -> None:
        try:
            self._writer.write(chunk)
        except self._error as exc:
            raise Damaged(f"not a zstd frame of this blob ({exc})") from None

    def finish(self) -> None:
        """The rest of the frame to the sink, and the sink's error if it had one."""
        try:
            self._writer.flush()
        except self._error as exc:
            raise Damaged(f"not a zstd frame of this blob ({exc})") from None
        finally:
            self.close()
        if self._failed is not None:
            raise self._failed

    def close(self) -> None:
        """Stop the thread (after a failed download too); idempotent. A piece that comes after
        (from a download given up on, still running in its own thread) is refused."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()

    def _put(self, piece: bytes) -> None:
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise Damaged("the download was given up on")
        self._queue.put(piece)

    def _drain(self) -> None:
        while (piece := self._queue.get()) is not None:
            if self._failed is None:
                try:
                    self._sink(piece)
                except BaseException as exc:  # noqa: BLE001  handed to the downloading thread
                    self._failed = exc


class Damaged(Exception):
    """A packed blob that does not unpack: refused as a blob of wrong bytes is (the remote
    is not down for it, as it is for a RemoteError)."""


class _To:
    """The file-like object zstandard writes decompressed pieces to."""

    def __init__(self, sink: Callable[[bytes], None]) -> None:
        self._sink = sink

    def write(self, data: bytes) -> int:
        self._sink(data)
        return len(data)
