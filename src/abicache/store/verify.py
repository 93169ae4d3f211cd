"""Check every entry of a store; quarantine what fails.

Quick mode checks owners, modes, sizes and stamps (re-hashing any file its
stamp cannot vouch for); full mode re-hashes every file and every blob.
Entries that gc removes while we look are gone, not damaged. Leftovers of killed builders (tmp/) are counted but
are not damage: no reader ever sees them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import ManifestError
from . import blobs
from .local import Store, children, stage_in_use


@dataclass
class Problem:
    where: str
    reason: str


@dataclass
class VerifyReport:
    entries: int = 0
    blobs: int = 0
    bytes_hashed: int = 0
    leftovers: int = 0
    building: int = 0  # stages of builds still running
    problems: list[Problem] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.problems


def verify_store(
    store: Store, *, full: bool = False, progress: Callable[[int], None] | None = None
) -> VerifyReport:
    start = time.perf_counter()
    report = VerifyReport()
    # --full: every blob is hashed once, first; an entry's file that is a link to a blob found
    # good is not hashed again (it was read twice: as the entry's file, then as the blob)
    good = _verify_blobs(store, report) if full else None
    for vdir in list(store.iter_variant_dirs()):
        report.entries += 1
        _verify_entry(store, vdir, full, report, good)
        if progress:
            progress(1)
    stages = children(store.layout.tmp)
    report.building = sum(1 for stage in stages if stage_in_use(stage))
    report.leftovers = len(stages) - report.building
    report.seconds = time.perf_counter() - start
    return report


def _verify_entry(store: Store, vdir: Path, full: bool, report: VerifyReport,
                  good: dict[tuple[int, int], tuple[str, int]] | None = None) -> None:
    try:
        manifest = store.read_manifest(vdir)
    except FileNotFoundError:
        if _gone(vdir):
            report.entries -= 1  # removed while we looked: gc or another verify
            return
        _quarantine(store, vdir, vdir, "no manifest (neither manifest.json nor its names)", [], report)
        return
    except (ManifestError, OSError) as exc:
        _quarantine(store, vdir, vdir, f"unreadable manifest: {exc}", [], report)
        return
    if full:
        report.bytes_hashed += sum(f.size for f in manifest.files if not _linked_to_good(vdir / f.path, f.sha256,
                                                                                          good))
    try:
        found = store.check(vdir, manifest, full=full, hashed=good)
    except FileNotFoundError:
        found = ("vanished while it was checked", [], vdir)
    if found is None:
        return
    reason, damaged, offender = found
    if _gone(vdir):  # gc moved it to trash/ while we read it: not damage
        report.entries -= 1
        return
    _quarantine(store, vdir, offender, reason, damaged, report)


def _gone(vdir: Path) -> bool:
    return not os.path.lexists(vdir)


def _quarantine(store: Store, vdir: Path, offender: Path, reason: str, damaged: list[str],
                report: VerifyReport) -> None:
    where = vdir.relative_to(store.layout.entries).as_posix()
    report.problems.append(Problem(where, reason))
    store.quarantine(offender, reason, damaged)


def _linked_to_good(path: Path, sha256: str, good: dict[tuple[int, int], tuple[str, int]] | None) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return good is not None and good.get((st.st_dev, st.st_ino)) == (sha256, st.st_ctime_ns)


def _verify_blobs(store: Store, report: VerifyReport) -> dict[tuple[int, int], tuple[str, int]]:
    """Hash every blob; (device, inode) -> (sha256, ctime) of those that hold their bytes."""
    good: dict[tuple[int, int], tuple[str, int]] = {}
    for entry in store.iter_blobs():
        digest = store.blob_digest(entry.name)
        if digest is None:
            continue
        try:
            actual, size = blobs.hash_file(Path(entry.path))
        except FileNotFoundError:
            continue  # gc removed an orphan while we looked
        report.blobs += 1
        report.bytes_hashed += size
        if actual == digest:
            try:
                st = os.lstat(entry.path)
            except FileNotFoundError:
                continue
            good[(st.st_dev, st.st_ino)] = (digest, st.st_ctime_ns)  # any write since changes the ctime
        else:
            report.problems.append(Problem(f"blobs/{entry.name}", f"its content's sha256 is {actual[:16]}..., "
                                                                  f"its name says {digest[:16]}..."))
            aside = store.layout.quarantine / "damaged-blobs"
            store.make_dir(aside)
            try:
                Path(entry.path).replace(aside / entry.name)
            except FileNotFoundError:
                pass
    return good
