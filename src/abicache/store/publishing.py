"""The store's write side: stage a build, hash and link its files to their blobs, write and
fsync the manifest, rename the variant into entries/ (the publish protocol, ARCHITECTURE.md), and
stamp what was published. A mixin of store.local.Store.

A reader sees either no variant or a complete one, whatever is killed when; if the rename
finds the variant there, another process won and its entry is used.
"""

from __future__ import annotations

from _thread import allocate_lock  # threading.Lock itself, without importing threading on a hit
import errno
import os
import stat
import time
from pathlib import Path

from ..errors import BuildError, ManifestError
from . import blobs, manifest as mf, manifest_names, stamps
from .manifest import FileRecord, Manifest

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, ContextManager, Iterator, Mapping, Sequence

#: test-only switch: "1" replaces the atomic rename by a copy (see _copy_publish)
BROKEN_PUBLISH = "ABICACHE_TEST_BROKEN_PUBLISH"
#: below this many bytes a build is not delayed (up to stamps.FINE_SECONDS) to stamp its files:
#: hashing them at the first hit (about 1 GB/s) costs less than the wait
_WAIT_BYTES = 32 << 20


class Publishing:
    """Writes of store.local.Store: it has layout, trust, ensure, make_dir, check, read_manifest,
    link_variants."""

    layout: Any
    trust: Any
    link_variants: Any
    _names_fit: int | None = None  # the longest name this store's filesystem takes (probed once)

    def _name_max(self, stage: Path) -> int:
        if self._names_fit is None:
            self._names_fit = manifest_names.name_max(os.fspath(stage))
        return self._names_fit

    def stage(self) -> ContextManager[Path]:
        """A fresh private directory under tmp/; removed if the block fails."""
        from contextlib import contextmanager  # the write side is only reached on a miss

        return contextmanager(self._stage)()

    def _stage(self) -> Iterator[Path]:
        import tempfile

        self.ensure(writing=True)
        try:
            path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=self.layout.tmp))
        except FileNotFoundError:  # tmp/ was deleted under us: make it again
            self.make_dir(self.layout.tmp)
            path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=self.layout.tmp))
        self.trust.fix_dir(path)  # becomes the variant folder: the store's mode, not mkdtemp's
        try:
            yield path
        except BaseException:
            self.remove_tree(path)
            raise
        if path.exists():  # not committed (e.g. lost the race)
            self.remove_tree(path)

    def collect(self, stage: Path) -> list[str]:
        """The regular files a builder left in stage, as safe relative paths."""
        top = stage.lstat()
        if not stat.S_ISDIR(top.st_mode):  # replaced by a link: what it points at is not ours to publish or chmod
            raise BuildError(f"the builder replaced its output directory {stage} with "
                             f"{'a symbolic link' if stat.S_ISLNK(top.st_mode) else 'something else'}; "
                             "write regular files into it instead")
        found = []
        for folder, dirs, files in os.walk(stage, onerror=_raise):  # a folder unread is not a folder empty
            for name in dirs + files:
                full = Path(folder) / name
                rel = full.relative_to(stage).as_posix()
                st = full.lstat()
                if stat.S_ISLNK(st.st_mode):
                    raise BuildError(f"the builder left a symbolic link {rel!r}; write regular files only")
                try:
                    mf.safe_relpath(rel)
                except ManifestError as exc:
                    raise BuildError(f"the builder wrote an unusable file: {exc}") from None
                if stat.S_ISREG(st.st_mode):
                    found.append(rel)
                elif not stat.S_ISDIR(st.st_mode):
                    raise BuildError(f"the builder left {rel!r}, which is not a regular file")
        if not found:
            raise BuildError(f"the builder wrote no files into its output directory {stage}")
        return sorted(found)

    def ingest(self, stage: Path, paths: Sequence[str]) -> tuple[FileRecord, ...]:
        """Hash every file and make it a hard link to its blob. The mtime of
        each file whose bytes were settled when hashed is kept, so commit can
        stamp it and its first hit need not hash it again."""
        for rel in paths:
            _own_copy(stage / rel)
        if sum(os.lstat(stage / rel).st_size for rel in paths) >= _WAIT_BYTES:
            _wait_settled([stage / rel for rel in paths])  # worth it: the first hit will not hash them
        records, marks = [], {}
        for rel in paths:
            path = stage / rel
            seen = time.time_ns()
            before = os.lstat(path)
            digest, size = blobs.hash_file(path)
            after = os.lstat(path)
            if after.st_mtime_ns == before.st_mtime_ns and stamps.settled(after.st_mtime_ns, seen):
                marks[rel] = (after.st_ino, after.st_mtime_ns)  # no write since well before the hash began
            records.append(FileRecord(rel, digest, size, 0o555 if after.st_mode & 0o111 else 0o444))
        self._adopt(stage, records)
        self._marks[os.fspath(stage)] = marks
        return tuple(records)

    def _adopt(self, stage: Path, records: Sequence[FileRecord]) -> None:
        for record in records:
            blobs.adopt(stage / record.path, self.layout.blob(record.sha256, record.executable), record,
                        self._blob_place)

    def _blob_place(self, blob: Path) -> None:
        """Make the folder of a blob, and move aside whatever there we may not trust."""
        self.make_dir(blob.parent)
        try:
            st = os.lstat(blob)
        except FileNotFoundError:
            return
        problem = self.trust.problem(st, f"blob {blob.name[:16]}")
        if problem is None and stat.S_ISREG(st.st_mode):
            return
        aside = self.layout.quarantine / "untrusted-blobs"
        self.make_dir(aside)
        try:
            os.replace(blob, aside / f"{blob.name}.{os.getpid()}-{time.monotonic_ns()}")
        except FileNotFoundError:
            pass

    def commit_verified(self, stage: Path, manifest: Manifest) -> tuple[Path, bool]:
        """Commit files the caller has already hashed against the manifest
        (a remote fetch hashes while it downloads): no second pass over them."""
        self._adopt(stage, manifest.files)
        return self.commit(stage, manifest)

    def link_blob(self, record: FileRecord, dest: Path) -> bool:
        """Put a hard link to the local blob of record at dest, if there is a
        trusted one of the right size (the entry is hashed at its first hit)."""
        blob = self.layout.blob(record.sha256, record.executable)
        try:
            st = os.lstat(blob)
            if st.st_size != record.size or self.trust.problem(st, "blob") or not stat.S_ISREG(st.st_mode):
                return False
            os.link(blob, dest, follow_symlinks=False)
        except OSError:
            return False
        return True

    def commit(self, stage: Path, manifest: Manifest) -> tuple[Path, bool]:
        """Write the manifest and rename stage into place; (dir, whether we won)."""
        data = manifest.dumps(compact=True)  # read on every lookup: a third less to parse than indented
        if len(data) > mf.MAX_BYTES:
            raise BuildError(
                f"{manifest.kind} {manifest.name!r}: its {len(manifest.files)} files need a manifest of "
                f"{len(data) / 2**20:.1f} MiB, over the {mf.MAX_BYTES >> 20} MiB limit that every reader "
                "enforces. Pack them into fewer files (an archive) or use shorter paths."
            )
        for folder in walk_dirs(stage):  # the builder's (or a download's) folders: the store's mode
            self.trust.fix_dir(folder)
        there = os.listdir(stage)
        if mf.FILENAME not in there and not manifest_names.present(there):  # a second try has written it
            # in the folder's names (no block of its own), where the filesystem takes names that long
            names = manifest_names.encode(data, there, self._name_max(stage))
            if names is None or not manifest_names.write(os.fspath(stage), names):
                fd = os.open(stage / mf.FILENAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                             0o444)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            blobs.fsync_dir(stage)
        final = self.layout.variant_dir(manifest.kind, manifest.key, manifest.variant)
        self.make_dir(final.parent)
        if os.environ.get(BROKEN_PUBLISH) == "1":
            return self._copy_publish(stage, final, manifest)
        try:
            os.rename(stage, final)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            return final, False
        # What was fsynced above makes the entry whole whenever the rename survives a crash;
        # this only hastens the rename itself to disk, so it is not waited for (1.7 ms a publish)
        import threading  # a publish, not a hit
        threading.Thread(target=blobs.fsync_dir, args=(final.parent,), name="abicache-fsync", daemon=True).start()
        self._index(manifest)
        self.link_variants(manifest.kind, manifest.key)
        self._log_listing(final, manifest)
        self._stamp_published(final, manifest, self._marks.pop(os.fspath(stage), {}))
        return final, True

    def _log_listing(self, final: Path, manifest: Manifest) -> None:
        """`ls`'s row of the new entry (store/listing_log): its first `ls` reads no manifest."""
        try:
            inode = os.lstat(final).st_ino
        except OSError:
            return
        from . import listing_log  # a publish's, not a hit's

        listing_log.append(self.layout.listing, manifest, inode, self.make_dir)

    def _stamp_published(self, vdir: Path, manifest: Manifest, marks: Mapping[str, tuple[int, int]]) -> None:
        """Stamp the files of a new entry so that its first hit need not hash them. A large
        entry (a 0.8 GB precompiled header costs 1.5 s to hash) waits, up to FINE_SECONDS,
        for the ctimes its link into the blob store just set to settle, and stamps the files
        ingest hashed: the very inode (not a blob already there, which was not hashed) with
        the mtime it had then (no write since). A small one is not held back: this process
        checks it (hashes and stamps, as a first hit would) at its next publish once its
        times have settled, or at its exit (_Deferred): a thousand Triton kernels' first
        hits in the next process then hash nothing (0.75 ms each). Coarse timestamps are
        not waited for: the first hit hashes instead."""
        _deferred.flush()
        try:
            newest = max(os.lstat(os.path.join(vdir, r.path)).st_ctime_ns for r in manifest.files)
        except OSError:
            return
        wait = newest + stamps.window_ns(newest) - time.time_ns()
        if wait > stamps.FINE_SECONDS * 1e9:
            return  # whole-second timestamps: the first hit hashes instead
        small = sum(r.size for r in manifest.files) < _WAIT_BYTES
        if wait > 0 and small:
            _deferred.add(self, vdir, manifest, time.time_ns() + wait)
            return
        if not marks:
            if small:  # settled already (a slow publish, under load), but nothing ingest hashed to vouch
                _deferred.add(self, vdir, manifest, time.time_ns())
            return
        if wait > 0:
            time.sleep(wait / 1e9 + 0.001)
        seen = time.time_ns()
        witnessed = {}
        for rel, mark in marks.items():
            try:
                st = os.lstat(os.path.join(vdir, rel))
            except OSError:
                return
            if (st.st_ino, st.st_mtime_ns) == mark and st.st_size == manifest.file(rel).size:
                witnessed[rel] = stamps.witness(st)
        order = sorted(r.path for r in manifest.files)
        if witnessed:
            stamps.write(vdir, {}, witnessed, time.time() if len(witnessed) == len(manifest.files) else 0.0,
                         seen_ns=seen, order=order)
        if small and len(stamps.read(vdir, self.trust.ok, order).files) < len(manifest.files):
            _deferred.add(self, vdir, manifest, time.time_ns())  # the rest (a blob there already): checked later

    def _copy_publish(self, stage: Path, final: Path, manifest: Manifest) -> tuple[Path, bool]:
        """TEST ONLY (bench/faults.py and tests/test_crash.py prove the harness can
        fail): publish by copying file by file, as hand-rolled caches do. A kill
        leaves half-copied entries, and the copies are not the verified blobs;
        never set BROKEN_PUBLISH outside those."""
        import shutil

        if final.exists():
            return final, False
        shutil.copytree(stage, final, copy_function=shutil.copyfile)  # file by file, bytes copied
        self._index(manifest)
        return final, True

    def _index(self, manifest: Manifest) -> None:
        marker = self.layout.name_marker(manifest.kind, manifest.name, manifest.key)
        try:
            self.make_dir(marker.parent)
            marker.touch(mode=self.trust.file_mode)
        except OSError:
            pass  # the index only serves `explain`, and the lookups that know no key (asked.py)


def _wait_settled(paths: Sequence[Path]) -> None:
    """Let the newest write age past the timestamp window (at most FINE_SECONDS):
    then a write after hashing must show in the mtime, and the file can be stamped."""
    try:
        newest = max(os.lstat(p).st_mtime_ns for p in paths)
    except (OSError, ValueError):
        return
    wait = newest + stamps.window_ns(newest) - time.time_ns()
    if 0 < wait <= stamps.FINE_SECONDS * 1e9:
        time.sleep(wait / 1e9 + 0.001)


def _own_copy(path: Path) -> None:
    """A file a builder hard-linked from elsewhere (or that another user owns)
    is replaced by a private copy: the store never chmods, links or keeps
    an inode that something outside it can still write."""
    st = path.lstat()
    if st.st_nlink == 1 and (not hasattr(os, "geteuid") or st.st_uid == os.geteuid()):
        return
    import shutil

    temp = path.with_name(f".abicache-copy-{os.getpid()}-{time.monotonic_ns()}")
    shutil.copyfile(path, temp, follow_symlinks=False)
    os.chmod(temp, stat.S_IMODE(st.st_mode) & 0o755)
    os.replace(temp, path)


def stage_in_use(stage: Path) -> bool:
    """Whether a folder in tmp/ belongs to a build still running here: stages are named
    '<pid>-...' by the process that builds into them (another machine's on a shared
    store cannot be told apart from a live one, so it counts as in use too)."""
    pid, _, _ = stage.name.partition("-")
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def walk_dirs(top: Path) -> Iterator[Path]:
    """Every folder under top (not following links), top first."""
    yield top
    for folder, dirs, _ in os.walk(top):
        for name in dirs:
            yield Path(folder) / name


def _raise(exc: OSError) -> None:
    raise exc


class _Deferred:
    """The small entries this process published before their files' times had settled,
    checked (store.check: hashed, stamped) at its next publish once due, and at its exit
    (waiting at most FINE_SECONDS, once). One killed before leaves them to their first
    hits, as before; one whose check finds a problem leaves it to the first hit too. A
    forked child starts with none: they are its parent's to check (and a lock the parent
    held at the fork would never be released in the child)."""

    def __init__(self) -> None:
        self._entries: list[tuple[Any, Path, Manifest, int]] = []  # (store, entry, manifest, due ns)
        self._lock = allocate_lock()
        self._hooked = False
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._entries, self._lock = [], allocate_lock()

    def add(self, store: Any, vdir: Path, manifest: Manifest, due_ns: int) -> None:
        with self._lock:
            self._entries.append((store, vdir, manifest, due_ns))
            if not self._hooked:
                import atexit

                atexit.register(self.flush, True)
                self._hooked = True

    def flush(self, wait: bool = False) -> None:
        if not self._entries:
            return
        now = time.time_ns()
        with self._lock:
            due = [e for e in self._entries if wait or e[3] <= now]
            self._entries = [e for e in self._entries if not (wait or e[3] <= now)]
        if wait and due:
            time.sleep(max(0, max(e[3] for e in due) - now) / 1e9 + 0.001)
        unstamped = [e for e in due if not self._stamped(*e[:3], asked=wait)]
        # At exit, again after a window, a few times (0.17 s at most, only while one is left):
        # under load the filesystem's clock (a tick behind this one) or a link count that moved
        # since (a build folder removed) can leave a file's time unsettled at the first check,
        # and the next process would hash what this one had just hashed.
        for pause in _EXIT_PAUSES if wait else ():
            if not unstamped:
                break
            time.sleep(pause)
            unstamped = [e for e in unstamped if not self._stamped(*e[:3])]

    @staticmethod
    def _stamped(store: Any, vdir: Path, manifest: Manifest, asked: bool = True) -> bool:
        """Check (hash and stamp) an entry; asked: whether its stamp now vouches for every file."""
        try:
            store.check(vdir, manifest)
            if not asked:
                return True
            order = sorted(r.path for r in manifest.files)
            return len(stamps.read(vdir, store.trust.ok, order).files) == len(manifest.files)
        except Exception:  # noqa: BLE001 - a stamp is a shortcut: the first hit checks it anyway
            return True


#: the pauses before the exit's later checks of entries still unstamped
_EXIT_PAUSES = (stamps.FINE_SECONDS, 0.05, 0.1)

_deferred = _Deferred()
