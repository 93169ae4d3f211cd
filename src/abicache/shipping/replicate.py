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
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO, Callable, ContextManager, NamedTuple

from ..console import progress
from ..errors import ManifestError, RefusedError
from ..remote import Tier, packed
from ..remote.backend import Backend
from ..store import Store
from ..store import manifest as mf
from ..store.layout import name_digest
from ..store.manifest import FileRecord, Manifest

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


class Lookups:
    """What the lookups of one miss have read: a miss looks at the remote several
    times (before waiting, while waiting, under the lock), and all of them together
    stay within one lookup's bounds: a variant read once (refused, not usable here,
    or its download failed) is not read again; only new ones are."""

    def __init__(self, budget: int, reads: int) -> None:
        self.budget, self.reads = budget, reads  # bytes and manifests still to be read
        self.seen: set[str] = set()
        self.said = False  # the variants past max_variants were mentioned


def candidates(tier: Tier, store: Store, kind: str, key: str, usable: Callable[[Manifest], bool],
               lookups: Lookups | None = None, rank: Callable[[Manifest], int] = lambda m: 0) -> list[Manifest]:
    """Admitted remote manifests whose requirements hold, the most specific first.

    Bounded, since anyone who can write the remote can file thousands of variants
    under a key (signing does not help: a manifest is checked after it is read):
    names and sizes are listed first, the oldest max_variants are read one at a
    time (the oldest: a flood comes after the entries it tries to bury), each
    checked and dropped before the next, until lookup_bytes have been read. What
    was refused is said in one warning and one log line per lookup, by reason;
    `lookups` carries the bounds over the lookups of one miss."""
    settings = tier.settings
    lookups = lookups or Lookups(settings.lookup_bytes, settings.max_variants)
    listed = tier.call(lambda b: b.variant_list(kind, key, min(4 * settings.max_variants, 1024)))
    if not listed:
        tier.stats["misses"] += 1
        return []
    order = sorted(listed, key=lambda v: (v.written or 0.0, v.name))
    found, refused = [], Counter()
    for item in order[:settings.max_variants]:
        if item.name in lookups.seen:
            continue
        limit = min(lookups.budget, mf.MAX_BYTES)
        if item.size > limit:
            lookups.seen.add(item.name)
            refused["larger than the bytes left to this lookup (ABICACHE_REMOTE_LOOKUP_BYTES)"
                    if item.size <= mf.MAX_BYTES else f"larger than {mf.MAX_BYTES} bytes"] += 1
            continue
        if lookups.reads <= 0:
            break
        lookups.reads -= 1
        lookups.seen.add(item.name)
        raw = tier.call(lambda b: b.read_manifest(kind, key, item.name, limit))
        if tier.down:
            break
        if raw is None:
            continue  # gone since the listing (a prune), or it grew
        lookups.budget -= len(raw)
        try:
            manifest = tier.admit(kind, key, item.name, raw)
        except RefusedError as exc:
            refused[str(exc)] += 1
            continue
        if usable(manifest):
            found.append(manifest)
    skipped = len(order) - settings.max_variants
    if refused or (skipped > 0 and not lookups.said):
        lookups.said = skipped > 0
        _refuse_all(tier, store, kind, key, refused, skipped, len(listed))
    found.sort(key=lambda m: (rank(m), *mf.preference(m)), reverse=True)  # rank: the GPU fit, first
    return found


def _refuse_all(tier: Tier, store: Store, kind: str, key: str, refused: Counter[str], skipped: int,
                listed: int) -> None:
    """One refusal said as itself; several in one line, counted by reason (the variant each
    names left out): a flood of junk variants costs one warning, not one per variant."""
    if sum(refused.values()) == 1 and skipped <= 0:
        refuse(tier, store, next(iter(refused)))
        return
    by_reason: Counter[str] = Counter()
    for message, n in refused.items():
        by_reason[message.split(": ", 1)[-1][:200]] += n
    parts = [f"{n} x {why}" for why, n in by_reason.most_common()]
    if skipped > 0:
        parts.append(f"{skipped} or more not considered (ABICACHE_REMOTE_MAX_VARIANTS={tier.settings.max_variants})")
    refuse(tier, store, f"remote manifests {kind}/{key[:16]} ({listed} listed): " + "; ".join(parts),
           count=sum(refused.values()))


def fetch(tier: Tier, store: Store, kind: str, key: str, usable: Callable[[Manifest], bool],
          lookups: Lookups | None = None, rank: Callable[[Manifest], int] = lambda m: 0) -> Fetched | None:
    for manifest in candidates(tier, store, kind, key, usable, lookups, rank):
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
            found = tier.call(lambda b: _read_blob(b, record, verifier))
        except _TooLong:
            return f"blob {record.sha256[:16]} for {record.path} is longer than its {record.size} bytes"
        except packed.Damaged as exc:
            return f"blob {record.sha256[:16]} for {record.path}: {exc}"
    if found is None:
        return ""
    if not found:
        return f"blob {record.sha256[:16]} for {record.path} is missing on the remote"
    if verifier.size != record.size:
        return f"blob {record.sha256[:16]} for {record.path}: got {verifier.size} of {record.size} bytes"
    if verifier.hexdigest != record.sha256:
        return (f"blob for {record.path} hashes to {verifier.hexdigest[:16]}, the manifest says "
                f"{record.sha256[:16]} (altered)")
    tier.stats["bytes_down"] += verifier.moved  # what came over the wire (packed)
    return None


def _read_blob(backend: Backend, record: FileRecord, verifier: _Verifier) -> bool:
    """Stream the file's bytes into the verifier: its packed copy inflated as it comes
    (remote/packed.py; the frame read up to its largest size, the bytes cut past the manifest's
    size by the verifier); False if the remote has no such blob."""
    unpacking = packed.Unpacking(verifier.feed)

    def take(chunk: bytes | memoryview) -> None:
        verifier.moved += len(chunk)
        unpacking.feed(chunk)

    try:
        if not backend.read_blob(packed.packed_name(record.sha256), packed.bound(record.size), take):
            return False
        unpacking.finish()
        return True
    finally:
        unpacking.close()


class _Verifier:
    """Hashes and writes a download's bytes as they are inflated, in the thread that
    inflation hands them to (remote/packed.Unpacking: inflating beside hashing and
    writing took a 100 MiB hit from 0.28 to 0.18 s; for raw bytes a second thread
    cost more than it overlapped against SeaweedFS). Every SYNC_BYTES the kernel is asked to start writing
    back what came so far (sync_file_range, which does not wait), so the
    fsync before commit finds little left: a 100 MiB hit went from 34% to
    over 80% of the raw client's throughput with this (bench/remote.py)."""

    def __init__(self, fh: BinaryIO, expected: int, advance: progress.Advance) -> None:
        self._fh, self._expected, self._advance = fh, expected, advance
        self._digest = hashlib.sha256()
        self.size = 0
        self.moved = 0  # the bytes that came, packed (remote/packed.py)
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
    reused = []
    for record in manifest.files:
        uploaded = _put_blob(tier, folder / record.path, record, store.layout.tmp)
        if uploaded is None:
            return Published("failed")
        if not uploaded:
            reused.append(record)
    signed = tier.sign(manifest)
    created = tier.call(lambda b: b.put_manifest(manifest.kind, manifest.key, manifest.variant,
                                                  signed.dumps()))
    if created is None:
        return Published("failed")
    if created:
        tier.stats["uploaded"] += 1
        _still_there(tier, folder, reused, store.layout.tmp)
        _name(tier, manifest)
        return Published("uploaded")
    tier.stats["lost_races"] += 1
    raw = tier.call(lambda b: b.read_manifest(manifest.kind, manifest.key, manifest.variant, mf.MAX_BYTES))
    try:
        winner = tier.admit(manifest.kind, manifest.key, manifest.variant, raw)
    except RefusedError as exc:
        refuse(tier, store, str(exc))
        return Published("failed")
    return Published("exists", winner)


def _name(tier: Tier, manifest: Manifest) -> None:
    """Record the key under its name, for lookups by what was asked for (fetch_asked)."""
    tier.call(lambda b: b.put_name(manifest.kind, name_digest(manifest.name), manifest.key))


#: keys of one name a lookup by what was asked for looks at
ASKED_KEYS = 16


def fetch_asked(tier: Tier, store: Store, kind: str, name: str, key: str, wanted: Callable[[Manifest], bool],
                lookups: Lookups | None = None, rank: Callable[[Manifest], int] = lambda m: 0) -> Fetched | None:
    """The remote's entry of this name that is wanted (what was asked for, asked.py), under
    any key but `key` (already looked at): the remote's name index gives the keys."""
    keys = tier.call(lambda b: b.keys_named(kind, name_digest(name), ASKED_KEYS)) or []
    for other in keys:
        if other != key and not tier.down:
            got = fetch(tier, store, kind, other, wanted, lookups, rank)
            if got is not None:
                return got
    return None


def _put_blob(tier: Tier, path: Path, record: FileRecord, scratch: Path) -> bool | None:
    """True once uploaded (packed: remote/packed.py), False if the remote had it already, None if
    the remote failed. The packed copy is made in scratch (the store's tmp/) and removed after."""
    name = packed.packed_name(record.sha256)
    present = tier.call(lambda b: b.has_blob(name))
    if present is None:
        return None
    if present:
        return False
    with packed.packing(path, scratch) as (packed_path, size), _bar(f"uploading {record.path}", size) as advance:
        done = tier.call(lambda b: b.write_blob(name, packed_path, size, advance) or True)
    if done:
        tier.stats["bytes_up"] += size
    return True if done else None


def _still_there(tier: Tier, folder: Path, reused: list[FileRecord], scratch: Path) -> None:
    """A blob found on the remote (not uploaded) may have been deleted by a prune that
    listed the manifests before ours was written: look again now that ours is there,
    and upload what went. A prune deleting later sees our manifest (remote/prune.py)."""
    for record in reused:
        if tier.call(lambda b: b.has_blob(packed.packed_name(record.sha256))) is False:
            _put_blob(tier, folder / record.path, record, scratch)


def refuse(tier: Tier, store: Store, reason: str, count: int = 1) -> None:
    """Count refusals, say them in one warning, and log them in one line for `abicache stats`."""
    import warnings

    from ..errors import AbicacheWarning

    tier.stats["refused"] += count
    warnings.warn(f"abicache: refused from remote {tier.name}: {reason}", AbicacheWarning, stacklevel=4)
    line = json.dumps({"time": time.time(), "remote": tier.name, "reason": reason, "pid": os.getpid(),
                       "count": count})
    store.log_event(REFUSALS_LOG, line)


def _bar(label: str, total: int) -> ContextManager[progress.Advance]:
    return progress.bar(label, total, show=total >= BAR_BYTES)


def refusal_count(store: Store) -> int:
    """Refusals logged (a line may count several: one lookup's, by reason)."""
    total = 0
    for line in store.read_events(REFUSALS_LOG):
        try:
            count = json.loads(line).get("count", 1)
        except (ValueError, AttributeError):
            count = 1
        total += count if isinstance(count, int) and count > 0 else 1
    return total
