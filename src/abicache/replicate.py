"""Moving entries between the local store and the remote tier.

fetch: the remote's manifests for a key -> admitted by the tier (parse,
identity, signature) -> the most specific one whose requirements hold ->
its blobs downloaded into a private stage, each hashed while it streams and
compared with the manifest before anything is linked into the store -> the
normal atomic commit. A blob already in the local store is linked, not
downloaded.

publish: blobs first (skipping those the remote has), the manifest last with
a create-only write; if another machine's manifest is there first, its
entry is the fleet's and the caller adopts it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, ContextManager, NamedTuple

from . import progress
from .errors import ManifestError, RefusedError
from .remote import Tier
from .store import Store, blobs
from .store import manifest as mf
from .store.manifest import FileRecord, Manifest

#: log/<this>.jsonl records every refusal (abicache stats, abicache remote)
REFUSALS_LOG = "remote-refused"
#: transfers at least this large show a progress bar
BAR_BYTES = 32 << 20
#: a download starts the write-back of what came so far every this many bytes
SYNC_BYTES = 16 << 20


class Fetched(NamedTuple):
    vdir: Path
    manifest: Manifest


class Published(NamedTuple):
    status: str  # "uploaded", "exists" (another machine's is there), "skipped", "failed"
    winner: Manifest | None = None  # the remote's manifest when status is "exists"


def candidates(tier: Tier, store: Store, kind: str, key: str,
               usable: Callable[[Manifest], bool]) -> list[Manifest]:
    """Admitted remote manifests whose requirements hold, the most specific first."""
    raws = tier.call(lambda b: b.manifests(kind, key, mf.MAX_BYTES))
    if not raws:
        tier.stats["misses"] += 1
        return []
    found = []
    for variant, raw in sorted(raws.items()):
        try:
            manifest = tier.admit(kind, key, variant, raw)
        except RefusedError as exc:
            refuse(tier, store, str(exc))
            continue
        if usable(manifest):
            found.append(manifest)
    found.sort(key=mf.preference, reverse=True)
    return found


def fetch(tier: Tier, store: Store, kind: str, key: str,
          usable: Callable[[Manifest], bool]) -> Fetched | None:
    for manifest in candidates(tier, store, kind, key, usable):
        got = download(tier, store, manifest)
        if got is not None:
            tier.stats["hits"] += 1
            return got
        if tier.down:
            break
    return None


def download(tier: Tier, store: Store, manifest: Manifest) -> Fetched | None:
    """Every file verified into a stage, then committed; None if refused or the remote failed."""
    with store.stage() as stage:
        for record in manifest.files:
            problem = _get_file(tier, store, record, stage / record.path)
            if problem is not None:
                if problem:
                    refuse(tier, store, f"{manifest.kind} {manifest.name}: {problem}")
                return None
        vdir, won = store.commit_verified(stage, manifest)
    if won:
        return Fetched(vdir, manifest)
    # Another process committed this variant first: use it only if it checks out.
    try:
        theirs = store.read_manifest(vdir)
    except (OSError, ManifestError):
        return None
    return Fetched(vdir, theirs) if store.check(vdir, theirs) is None else None


def _get_file(tier: Tier, store: Store, record: FileRecord, dest: Path) -> str | None:
    """None when dest holds the verified file; '' if the remote failed; else the refusal."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if store.link_blob(record, dest):
        return None
    with open(dest, "wb") as fh, _bar(f"downloading {record.path}", record.size) as advance, \
            _Verifier(fh, record.size, advance) as verifier:
        try:
            found = tier.call(lambda b: b.read_blob(record.sha256, record.size, verifier.feed))
        except _TooLong:
            return f"blob {record.sha256[:16]} for {record.path} is longer than its {record.size} bytes"
    if found is None:
        return ""
    if not found:
        return f"blob {record.sha256[:16]} for {record.path} is missing on the remote"
    if verifier.size != record.size:
        return f"blob {record.sha256[:16]} for {record.path}: got {verifier.size} of {record.size} bytes"
    if verifier.hexdigest != record.sha256:
        return (f"blob for {record.path} hashes to {verifier.hexdigest[:16]}, the manifest says "
                f"{record.sha256[:16]} (altered)")
    tier.stats["bytes_down"] += record.size
    return None


class _Verifier:
    """Hashes and writes a download as it streams, in the stream's own thread
    (sha256 runs at over 1.5 GB/s; threads cost more than they overlapped
    against SeaweedFS). Every SYNC_BYTES the kernel is asked to start writing
    back what came so far (sync_file_range, which does not wait), so the
    fsync before commit finds little left: a 100 MiB hit went from 34% to
    over 80% of the raw client's throughput with this (bench/remote.py)."""

    def __init__(self, fh: BinaryIO, expected: int, advance: progress.Advance) -> None:
        self._fh, self._expected, self._advance = fh, expected, advance
        self._digest = hashlib.sha256()
        self.size = 0
        self.hexdigest = ""
        self._flushed = 0

    def __enter__(self) -> _Verifier:
        return self

    def feed(self, chunk: bytes | memoryview) -> None:
        self.size += len(chunk)
        if self.size > self._expected:
            raise _TooLong()
        self._advance(len(chunk))
        self._digest.update(chunk)
        self._fh.write(chunk)
        if self.size - self._flushed >= SYNC_BYTES:
            self._fh.flush()
            _start_writeback(self._fh.fileno(), self._flushed, self.size - self._flushed)
            self._flushed = self.size

    def __exit__(self, *exc: Any) -> None:
        self.hexdigest = self._digest.hexdigest()


_SYNC_FILE_RANGE_WRITE = 2
_writeback: Any = None


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """sync_file_range(SYNC_FILE_RANGE_WRITE) where the C library has it (Linux); else nothing."""
    global _writeback
    if _writeback is None:
        import ctypes

        try:
            call = ctypes.CDLL(None, use_errno=True).sync_file_range
            call.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
            _writeback = call
        except (AttributeError, OSError):
            _writeback = False
    if _writeback:
        _writeback(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


class _TooLong(Exception):
    pass


def publish(tier: Tier, store: Store, folder: Path, manifest: Manifest) -> Published:
    """Upload an entry whose files are in folder: blobs, then the manifest."""
    if not tier.writable:
        return Published("skipped")
    for record in manifest.files:
        if not _put_blob(tier, folder / record.path, record):
            return Published("failed")
    signed = tier.sign(manifest)
    created = tier.call(lambda b: b.put_manifest(manifest.kind, manifest.key, manifest.variant,
                                                  signed.dumps()))
    if created is None:
        return Published("failed")
    if created:
        tier.stats["uploaded"] += 1
        return Published("uploaded")
    tier.stats["lost_races"] += 1
    raws = tier.call(lambda b: b.manifests(manifest.kind, manifest.key, mf.MAX_BYTES)) or {}
    try:
        winner = tier.admit(manifest.kind, manifest.key, manifest.variant, raws.get(manifest.variant))
    except RefusedError as exc:
        refuse(tier, store, str(exc))
        return Published("failed")
    return Published("exists", winner)


def _put_blob(tier: Tier, path: Path, record: FileRecord) -> bool:
    present = tier.call(lambda b: b.has_blob(record.sha256))
    if present is None:
        return False
    if present:
        return True
    with _bar(f"uploading {record.path}", record.size) as advance:
        done = tier.call(lambda b: b.write_blob(record.sha256, path, record.size, advance) or True)
    if done:
        tier.stats["bytes_up"] += record.size
    return bool(done)


def refuse(tier: Tier, store: Store, reason: str) -> None:
    """Count a refusal, say it once on stderr, and log it for `abicache stats`."""
    import warnings

    from .errors import AbicacheWarning

    tier.stats["refused"] += 1
    warnings.warn(f"abicache: refused from remote {tier.name}: {reason}", AbicacheWarning, stacklevel=4)
    line = json.dumps({"time": time.time(), "remote": tier.name, "reason": reason, "pid": os.getpid()})
    store.log_event(REFUSALS_LOG, line)


def _bar(label: str, total: int) -> ContextManager[progress.Advance]:
    return progress.bar(label, total, show=total >= BAR_BYTES)


def refusal_count(store: Store) -> int:
    return len(store.read_events(REFUSALS_LOG))
