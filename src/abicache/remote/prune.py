"""What a remote holds, and pruning it while other machines read and write.

Manifests name blobs; nothing else ties them. A prune:

1. lists every manifest and blob, and reads each manifest (bounded, parsed
   as untrusted; one that does not parse is "unreadable");
2. chooses manifests to delete: those naming a blob the remote lacks (a
   broken entry: a fetch of it fails), those created before --max-age, then
   the oldest until the blobs the rest name fit in --max-size;
3. deletes those manifests (an entry disappears whole: readers look up
   manifests first);
4. marks every blob no kept manifest names, and deletes a blob only when a
   mark at least `grace` old (an earlier prune's) finds it still unnamed.

Why the mark: a machine publishing uploads its blobs before its manifest,
and a machine fetching has read a manifest before its blobs. Either may be
in the middle of that while a prune lists, so an unnamed blob is deleted
only after it stayed unnamed for the grace period (default an hour: far
longer than any transfer, which is bounded by timeout + size / MIN_RATE).
A blob named again (a new manifest) loses its mark at the next prune. A
publish that reuses a blob the prune is
deleting, between the prune's listing and its deletion, is caught from both
sides: the publisher checks its reused blobs again once its manifest is
written (and uploads what went), and the prune lists the manifests again
after deleting (and removes a new one whose blob is still gone). Either the
entry is whole or it is absent; it is never broken.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ManifestError
from ..store import manifest as mf
from ..store.manifest import Manifest
from . import packed
from .backend import Backend

#: default seconds an unreferenced blob stays before a prune deletes it
GRACE = 3600.0


@dataclass
class Variant:
    kind: str
    key: str
    variant: str
    size: int
    written: float | None
    manifest: Manifest | None  # None: unreadable (too large, or not a manifest)

    @property
    def created(self) -> float | None:
        return self.manifest.created if self.manifest is not None else self.written

    @property
    def shas(self) -> frozenset[str]:
        return frozenset(f.sha256 for f in self.manifest.files) if self.manifest is not None else frozenset()


@dataclass
class Inventory:
    variants: list[Variant]
    blobs: dict[str, int]  # sha256 -> the bytes stored for it (its packed frame: packed.py)
    marks: dict[str, float]


def inventory(backend: Backend, progress: Callable[[int], None] = lambda n: None) -> Inventory:
    """Everything the remote holds (RemoteError if it fails); manifests read one at a time.
    A name that is not kind/key/variant (another tool's, or planted) is listed as unreadable."""
    variants = []
    for listed in backend.variants():
        kind, key, variant = _split(listed.name)
        raw = backend.read_manifest(kind, key, variant, mf.MAX_BYTES) if variant else None
        variants.append(Variant(kind, key, variant, listed.size, listed.written,
                                _manifest(raw, kind, key, variant)))
        progress(1)
    blobs: dict[str, int] = {}
    for listed in backend.blobs():
        sha = packed.sha_of(listed.name)  # <sha256>.zst; another name is no blob of ours
        if sha is not None:
            blobs[sha] = listed.size
    return Inventory(variants, blobs, backend.marks())


def _split(name: str) -> tuple[str, str, str]:
    """(kind, key, variant) of a listed manifest name; variant '' when the name is not one."""
    parts = name.split("/")
    if len(parts) != 3 or not all(parts) or any(c in name for c in "\0\n\r\ufffd"):
        return name[:100], "", ""
    return parts[0], parts[1], parts[2]


def _manifest(raw: bytes | None, kind: str, key: str, variant: str) -> Manifest | None:
    if raw is None:
        return None
    try:
        found = mf.parse(raw)
    except ManifestError:
        return None
    return found if (found.kind, found.key, found.variant) == (kind, key, variant) else None


def stats(inv: Inventory) -> dict[str, Any]:
    named = set().union(*(v.shas for v in inv.variants)) if inv.variants else set()
    kinds: dict[str, dict[str, int]] = {}
    for v in inv.variants:
        row = kinds.setdefault(v.kind, {"variants": 0, "bytes": 0})
        row["variants"] += 1
        row["bytes"] += sum(f.size for f in v.manifest.files) if v.manifest else 0
    return {
        "entries": len({(v.kind, v.key) for v in inv.variants}),
        "variants": len(inv.variants),
        "unreadable_manifests": sum(v.manifest is None for v in inv.variants),
        "broken_entries": sum(bool(v.shas - inv.blobs.keys()) for v in inv.variants),
        "blobs": len(inv.blobs),
        "blob_bytes": sum(inv.blobs.values()),
        "unreferenced_blobs": len(inv.blobs.keys() - named),
        "unreferenced_bytes": sum(size for sha, size in inv.blobs.items() if sha not in named),
        "marked_blobs": len(inv.marks),
        "kinds": kinds,
    }


@dataclass
class Plan:
    delete: list[tuple[Variant, str]] = field(default_factory=list)  # (variant, why)
    delete_blobs: list[str] = field(default_factory=list)
    mark: list[str] = field(default_factory=list)
    unmark: list[str] = field(default_factory=list)
    freed: int = 0


def plan(inv: Inventory, *, now: float, max_age: float | None = None, max_size: int | None = None,
         grace: float = GRACE) -> Plan:
    out = Plan()
    kept: list[Variant] = []
    for v in inv.variants:
        missing = v.shas - inv.blobs.keys()
        if missing:
            out.delete.append((v, f"names {len(missing)} blob(s) the remote lacks"))
        elif max_age is not None and v.created is not None and now - v.created > max_age:
            out.delete.append((v, f"created {(now - v.created) / 86400:.1f} days ago"))
        else:
            kept.append(v)
    if max_size is not None:
        _oldest_over(kept, inv, max_size, out)
    named = set().union(*(v.shas for v in kept)) if kept else set()
    for sha in inv.blobs.keys() - named:
        marked = inv.marks.get(sha)
        if marked is None:
            out.mark.append(sha)
        elif now - marked >= grace:
            out.delete_blobs.append(sha)
            out.freed += inv.blobs[sha]
    out.unmark = sorted((inv.marks.keys() & named) | (inv.marks.keys() - inv.blobs.keys() - named))
    return out


def _oldest_over(kept: list[Variant], inv: Inventory, max_size: int, out: Plan) -> None:
    """Delete the oldest of kept until the blobs the rest name fit in max_size
    (a blob shared by several entries counts once, and is freed with the last)."""
    users = Counter(sha for v in kept for sha in v.shas)
    total = sum(inv.blobs.get(sha, 0) for sha in users)
    kept.sort(key=lambda v: v.created or 0.0)
    while kept and total > max_size:
        v = kept.pop(0)
        out.delete.append((v, "oldest while the remote is over --max-size"))
        for sha in v.shas:
            users[sha] -= 1
            if not users[sha]:
                total -= inv.blobs.get(sha, 0)


def apply(backend: Backend, todo: Plan, inv: Inventory | None = None, *, now: float | None = None) -> int:
    """Manifests first (entries vanish whole), then blobs past their grace, then marks;
    then (given the inventory the plan came from) the manifests published meanwhile
    that name a deleted blob (_published_meanwhile). Returns how many of those were removed."""
    for v, _ in todo.delete:
        if v.variant:
            backend.delete_manifest(v.kind, v.key, v.variant)
    for sha in todo.delete_blobs:
        backend.delete_blob(packed.packed_name(sha))
    backend.set_marks({sha: now or time.time() for sha in todo.mark})
    backend.clear_marks(sorted(set(todo.unmark) | set(todo.delete_blobs)))
    return _published_meanwhile(backend, inv, set(todo.delete_blobs)) if inv is not None else 0


def _published_meanwhile(backend: Backend, inv: Inventory, deleted: set[str]) -> int:
    """A machine publishing reuses a blob the remote has (it uploads only what is missing).
    If the prune listed the manifests before that machine's was written, the blob may be
    one it deleted. The publisher looks again once its manifest is written and uploads
    what went (replicate._still_there); a manifest written before this second listing
    whose blob is still gone is deleted here: the entry is then absent (rebuilt and
    published again), never broken."""
    if not deleted:
        return 0
    known = {(v.kind, v.key, v.variant) for v in inv.variants}
    removed = 0
    for listed in backend.variants():
        kind, key, variant = _split(listed.name)
        if not variant or (kind, key, variant) in known:
            continue
        found = _manifest(backend.read_manifest(kind, key, variant, mf.MAX_BYTES), kind, key, variant)
        if found is None:
            continue
        lost = {f.sha256 for f in found.files} & deleted
        if lost and not all(backend.has_blob(packed.packed_name(sha)) for sha in lost):
            backend.delete_manifest(kind, key, variant)
            removed += 1
    return removed
