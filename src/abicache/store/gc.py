"""Eviction: least recently used entries first, down to a size cap and an age.

Safe while other processes use the store: an entry leaves by one rename into
trash/ (a reader sees it whole or not at all; a process that has the .so
mapped keeps its mapping), only while no build pins or builds its key (a
build pins the object entries it hands to its linker: store/lock.py), and a
blob is deleted only when no entry links to it (link count 1). Builders' leftovers in tmp/ are removed once older than
`tmp_age`, so a live build is never touched.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import LockTimeout, ManifestError
from . import listing_log
from .layout import OLD_VERSIONS, entry_name
from .local import Store, children, stage_in_use
from .lock import key_lock, unless_in_use

DEFAULT_TMP_AGE = 6 * 3600.0
QUARANTINE_AGE = 7 * 86400.0
#: an empty folder or a stray lock file this recent may be a build's, just begun: left for the next gc
SETTLED = 60.0


@dataclass
class GcReport:
    entries_before: int = 0
    entries_removed: int = 0
    blobs_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    leftovers_removed: int = 0
    in_use: int = 0  # entries left because a running build uses them (store/lock.py's pins)
    strays_removed: int = 0  # empty folders and lock files of keys with no entry
    removed: list[str] = field(default_factory=list)
    dry_run: bool = False
    max_size: int | None = None


@dataclass
class _Entry:
    vdir: Path
    last_used: float
    blobs: list[Path]


def disk_usage(store: Store) -> tuple[int, int]:
    """(bytes, count) of all blobs: every stored byte lives in exactly one blob."""
    total = count = 0
    for entry in store.iter_blobs():
        total += entry.stat(follow_symlinks=False).st_size
        count += 1
    return total, count


def collect_garbage(
    store: Store,
    *,
    max_size: int | None = None,
    max_age: float | None = None,
    tmp_age: float = DEFAULT_TMP_AGE,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    spare: Path | None = None,
    sweep: bool = True,
) -> GcReport:
    """spare: an entry that stays
    (the automatic eviction after a build must not take the entry that build is about to load,
    whatever the clocks say: a stamp written into the entry before it may be newer). A dry run
    counts what the real run would free (a blob goes with the last entry that links it).
    sweep: also remove strays, old layouts and stale memos (a walk of every folder; the
    eviction after a build leaves that to `abicache gc`)."""
    report = GcReport(dry_run=dry_run, max_size=max_size)
    links: dict[Path, list[int]] = {}  # a dry run's blob -> [links left, size]
    report.bytes_before, _ = disk_usage(store)
    entries = sorted(_entries(store), key=lambda e: e.last_used)
    report.entries_before = len(entries)
    size = report.bytes_before
    now = time.time()
    for entry in entries:
        too_old = max_age is not None and now - entry.last_used > max_age
        too_big = max_size is not None and size > max_size
        if not (too_old or too_big) or (spare is not None and entry.vdir.name == spare.name):
            continue
        with unless_in_use(_lock_of(store, entry.vdir)) as free:
            if not free:  # a running build handed its file to a linker, or builds the key
                report.in_use += 1
                continue
            if not dry_run:
                store.remove_tree(entry.vdir)
        if dry_run:
            size -= _would_free(entry.blobs, links, report)
        else:
            _relink(store, entry.vdir)
            size -= _drop_orphans(store, entry.blobs, report)
        report.removed.append(entry.vdir.relative_to(store.layout.entries).as_posix())
        report.entries_removed += 1
        if progress:
            progress(1)
    if dry_run:
        size -= _would_free_orphans(store, links, report)
    else:
        size -= _drop_orphans(store, [Path(e.path) for e in store.iter_blobs()], report)
        report.leftovers_removed = _drop_leftovers(store, tmp_age if sweep else None)
    if not dry_run and sweep:
        keys = _keys(store)
        report.strays_removed = _drop_stray_links(store, keys)
        report.strays_removed += _drop_empty_folders(store) + _drop_stray_locks(store, keys)
        report.strays_removed += _drop_old_layouts(store)
        _drop_stale_index(store, keys)
        report.strays_removed += _drop_stale_listings(store, keys)
        _drop_old_hit_records(store)
    report.bytes_after = size
    return report


def _would_free_orphans(store: Store, counted: dict[Path, list[int]], report: GcReport) -> int:
    """The bytes of blobs no entry links to already (a build killed before its entry was
    made, an older version's leftovers), which the real run removes too."""
    freed = 0
    for entry in store.iter_blobs():
        if Path(entry.path) in counted:
            continue
        st = entry.stat(follow_symlinks=False)
        if st.st_nlink == 1:
            freed += st.st_size
            report.blobs_removed += 1
    return freed


def _would_free(blobs: list[Path], links: dict[Path, list[int]], report: GcReport) -> int:
    """The bytes removing an entry with these blobs would free, after the entries a dry run
    removed before it (each blob's links counted down)."""
    freed = 0
    for blob in blobs:
        left = links.get(blob)
        if left is None:
            try:
                st = os.stat(blob)
            except FileNotFoundError:
                continue
            left = links[blob] = [st.st_nlink, st.st_size]
        left[0] -= 1
        if left[0] == 1:
            freed += left[1]
            report.blobs_removed += 1
    return freed


def _lock_of(store: Store, vdir: Path) -> Path:
    """The lock file of the entry's key (a folder not named by a key has none)."""
    try:
        return store.layout.lock_file(vdir.name.partition(".")[0])
    except ValueError:
        return store.layout.locks / "-"


def _entries(store: Store) -> list[_Entry]:
    out = []
    for vdir in store.iter_variant_dirs():
        try:
            manifest = store.read_manifest(vdir)
            used = store.last_used(vdir)
        except (OSError, ManifestError):
            continue  # verify's business; gc only evicts what it understands
        paths = [store.layout.blob(f.sha256, f.executable) for f in manifest.files]
        out.append(_Entry(vdir, used, paths))
    return out


def _drop_orphans(store: Store, candidates: list[Path], report: GcReport) -> int:
    """Delete blobs no entry links to; returns the bytes freed."""
    freed = 0
    for blob in candidates:
        try:
            st = os.stat(blob)
            if st.st_nlink != 1:
                continue
            os.unlink(blob)
        except FileNotFoundError:
            continue
        freed += st.st_size
        report.blobs_removed += 1
    return freed


def _drop_leftovers(store: Store, tmp_age: float | None) -> int:
    """Old builder leftovers, old quarantine, and anything in trash/ (only that: tmp_age None)."""
    removed = 0
    now = time.time()
    ages = ((store.layout.tmp, tmp_age), (store.layout.quarantine, QUARANTINE_AGE), (store.layout.trash, 0.0)) \
        if tmp_age is not None else ((store.layout.trash, 0.0),)
    for folder, age in ages:
        for child in children(folder):
            if folder == store.layout.tmp and stage_in_use(child):
                continue  # a build still running, however long it has taken
            try:
                if now - child.lstat().st_mtime >= age:
                    store.remove_tree(child)
                    removed += folder == store.layout.tmp
            except FileNotFoundError:
                continue
    return removed


#: a hit record not rewritten for this long is removed (a record of an entry still used is
#: written again by the next full lookup: one lookup a week)
HIT_RECORD_AGE = 7 * 86400.0


def _drop_old_hit_records(store: Store) -> None:
    """Hit records (hits/) past HIT_RECORD_AGE, and the temporary files of writers that died
    (a record is only a shortcut: the full lookup stands behind each)."""
    now = time.time()
    for child in children(store.layout.hits):
        try:
            age = now - child.lstat().st_mtime
            if age >= HIT_RECORD_AGE or (child.name.startswith(".") and age >= DEFAULT_TMP_AGE):
                child.unlink()
        except OSError:
            continue


def _relink(store: Store, vdir: Path) -> None:
    """The removed entry's key's variants link, written again (or removed: no variant left)."""
    found = entry_name(vdir.name)
    if found is not None:
        store.link_variants(vdir.parent.parent.name, found[0])


def _drop_stray_links(store: Store, keys: dict[str, set[str]]) -> int:
    """Variants links of keys with no entry left, and links a publish killed between making
    and renaming one left (".<key>.<pid>-<time>", untouched for SETTLED seconds)."""
    removed, now = 0, time.time()
    for kind_dir in children(store.layout.entries):
        for prefix in children(kind_dir):
            for path in children(prefix):
                if "." in path.name[1:]:
                    continue  # an entry's folder (<key>.<variant>): no stat for those
                try:
                    st = path.lstat()
                except FileNotFoundError:
                    continue
                if not stat.S_ISLNK(st.st_mode):
                    continue
                temp = path.name.startswith(".")
                if (temp and now - st.st_mtime >= SETTLED) or (not temp and path.name not in keys.get(kind_dir.name, ())):
                    path.unlink(missing_ok=True)
                    removed += 1
    return removed


def _keys(store: Store) -> dict[str, set[str]]:
    """kind -> the keys that have an entry (read from the folders' names)."""
    keys: dict[str, set[str]] = {}
    for kind_dir in children(store.layout.entries):
        named = (entry_name(vdir.name) for prefix in children(kind_dir) for vdir in children(prefix))
        keys[kind_dir.name] = {found[0] for found in named if found}
    return keys


def _drop_stale_index(store: Store, keys: dict[str, set[str]]) -> None:
    """Index markers (<digest>.<key> files in folders of 256) of keys no entry has."""
    for kind_dir in children(store.layout.index):
        for folder in children(kind_dir):
            for marker in children(folder):
                key = marker.name.rpartition(".")[2]
                if key not in keys.get(kind_dir.name, ()):
                    marker.unlink(missing_ok=True)
            _rmdir(folder)
        _rmdir(kind_dir)


def _drop_empty_folders(store: Store) -> int:
    """Prefix and kind folders left empty by evictions, untouched for a minute (a commit
    makes its prefix folder, then renames its entry into it: that folder is left alone;
    rmdir never removes a folder that is not empty)."""
    removed = 0
    for kind_dir in children(store.layout.entries):
        for prefix in children(kind_dir):
            removed += _rmdir(prefix)
        removed += _rmdir(kind_dir)
    for prefix in children(store.layout.locks):
        removed += _rmdir(prefix)
    return removed


def _drop_stray_locks(store: Store, by_kind: dict[str, set[str]]) -> int:
    """Lock files (and their holder notes) of keys no entry has, untouched for SETTLED
    seconds and held by nobody (a build in progress holds its key's lock). One taken
    between a builder's open and its flock costs at most a second build of that key."""
    keys = set().union(*by_kind.values())
    removed, now = 0, time.time()
    for prefix in children(store.layout.locks):
        for lock in children(prefix):
            key = lock.name.split(".")[0]
            if lock.suffix != ".lock" or key in keys:
                continue
            try:
                if now - lock.lstat().st_mtime < SETTLED:
                    continue
            except FileNotFoundError:
                continue
            with unless_in_use(lock) as free:
                if free:
                    for path in (lock, lock.with_suffix(".holder")):
                        path.unlink(missing_ok=True)
                    removed += 1
    return removed


def _drop_stale_listings(store: Store, keys: dict[str, set[str]]) -> int:
    """`abicache ls`'s memos (cli/listing_memo) and publishers' logs (store/listing_log) of
    kinds with no entry left, and the temporary files a killed `ls` left, untouched for
    SETTLED seconds."""
    removed = 0
    now = time.time()
    for path in children(store.layout.listing):
        kind = listing_log.memo_kind(path.name) or listing_log.kind_of(path.name)
        try:
            stray = not keys.get(kind) if kind is not None else now - path.lstat().st_mtime >= SETTLED
            if stray:
                path.unlink()
                removed += 1
        except OSError:
            continue
    _rmdir(store.layout.listing)
    return removed


def _drop_old_layouts(store: Store) -> int:
    """The folders of older layouts (v1/, v2/ beside v3/): nothing reads them any more. Each
    leaves by one rename into trash/, as an entry does (a process still mapping a .so
    from it keeps its mapping)."""
    removed = 0
    for version in OLD_VERSIONS:
        old = store.layout.root / version
        try:
            if not store.trust.ok(old.lstat()) or not old.is_dir():
                continue  # not ours to remove: verify and ensure say why
        except FileNotFoundError:
            continue
        store.remove_tree(old)
        removed += 1
    return removed


def _rmdir(folder: Path) -> int:
    try:
        if time.time() - folder.lstat().st_mtime < SETTLED:
            return 0
        folder.rmdir()
    except OSError:
        return 0
    return 1


# ---- the size cap (ABICACHE_MAX_SIZE), kept after builds ------------------------------------

#: the store's size as the last eviction measured it, with what builds added since ("bytes time")
_SIZE = "size"
_LOCK = "evict.lock"
#: a size measured longer ago than this is measured again (gc by hand, other processes'
#: removals and older abicache versions do not update it)
REMEASURE = 60.0
#: how long a build waits for another process's eviction before leaving it to the next build
LOCK_WAIT = 60.0


def keep_under(store: Store, max_size: int, built: Path | None = None, added: int = 0) -> GcReport | None:
    """After a build, before the call returns: evict the least recently used entries down to
    max_size, never `built` (about to be loaded, even alone over the cap). One process at a
    time (the store's eviction lock): the next finds the store under the cap. Bounded: the
    blobs are walked only when the size last measured, plus the bytes builds added since
    (`added`: this one's), is over the cap or older than REMEASURE; a hit never pays."""
    try:
        store.make_dir(store.layout.log)
        with key_lock(store.layout.log / _LOCK, "the store's size cap", LOCK_WAIT, mode=store.trust.file_mode):
            known = _measured(store)
            if known is not None and known[0] + added <= max_size and time.time() - known[1] < REMEASURE:
                _remember(store, known[0] + added, known[1])
                return None
            measured_at = time.time()
            report = collect_garbage(store, max_size=max_size, spare=built, sweep=False)
            _remember(store, report.bytes_after, measured_at)
            return report
    except (LockTimeout, OSError):
        return None  # housekeeping: the next build evicts; `abicache gc` reports its failures


def _measured(store: Store) -> tuple[int, float] | None:
    """(bytes, when measured) from log/size, believed only if ours (owner and mode, as every
    file of the store): another user's would steer eviction (a size of 0 would stop it)."""
    try:
        fd = os.open(store.layout.log / _SIZE, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if not store.trust.ok(os.fstat(fd)):
            return None  # measured again; _remember replaces it with ours
        size, _, when = os.read(fd, 64).decode().partition(" ")
        return int(size), float(when)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _remember(store: Store, size: int, when: float) -> None:
    path = store.layout.log / _SIZE
    temp = path.with_name(f".{_SIZE}.{os.getpid()}")
    temp.write_text(f"{size} {when}")
    os.chmod(temp, store.trust.file_mode)
    os.replace(temp, path)
