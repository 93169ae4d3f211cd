"""The local store: lookup, verification, atomic publish, quarantine.

Publish protocol (DESIGN.md): build into tmp/<unique>/, hash and link every
file to its blob, write and fsync the manifest, then rename the whole
directory into entries/. A reader sees either no variant or a complete one,
whatever is killed when; if the rename finds the variant there, another
process won and its entry is used.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from ..errors import AbicacheWarning, BuildError, ManifestError, UntrustedRootError
from . import blobs, deps, manifest as mf, stamps
from .layout import FOLDERS, LAYOUT_VERSION, Layout, check_hex
from .manifest import Dependency, FileRecord, Manifest
from .trust import Trust, ensure_root


#: roots already checked in this process: (root as given, group) -> resolved root
_ENSURED: dict[tuple[str, str | None], Path] = {}

#: test-only switch: "1" replaces the atomic rename by a copy (see _copy_publish)
BROKEN_PUBLISH = "ABICACHE_TEST_BROKEN_PUBLISH"


class Store:
    """One store root. `group` names the trusted group of a shared store
    (ABICACHE_SHARED); None keeps it private to the user (see trust.py)."""

    def __init__(self, root: Path, *, group: str | None = None) -> None:
        self.layout = Layout(Path(root))
        self.trust = Trust(group)
        self._ready = False
        self._written = False
        self._marks: dict[str, dict[str, tuple[int, int]]] = {}  # stage -> file -> (inode, mtime) hashed

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def shared(self) -> bool:
        return self.trust.shared

    def ensure(self, *, writing: bool = False) -> None:
        """Check the root, v1/ and entries/ (once per process and root), and
        before the first write every other folder of the layout, creating and
        repairing what is missing or left open. A folder deleted later is
        made again where it is next needed (make_dir)."""
        if self._ready and (self._written or not writing):
            return
        memo = (os.fspath(self.layout.root), self.trust.group, writing)
        real = _ENSURED.get(memo)
        if real is None:
            real = ensure_root(self.layout.root, self.trust)
            base = os.path.join(real, LAYOUT_VERSION)
            for folder in ("", *(FOLDERS if writing else ("entries",))):
                self._ensure_folder(os.path.join(base, folder) if folder else base)
            _ENSURED[memo] = real
        self.layout = Layout(real)
        self._ready = True
        self._written = self._written or writing

    def _ensure_folder(self, path: str) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            self.make_dir(Path(path))
            return
        if self.trust.ok(st) and stat.S_ISDIR(st.st_mode):
            return
        problem = self.trust.problem(st, path)
        if not stat.S_ISDIR(st.st_mode) or not self.trust.trusted_owner(st.st_uid):
            raise UntrustedRootError(
                f"{problem or f'{path} is not a directory'}: someone else may have put it there. "
                f"Move it away (mv {path} {path}.suspect) and abicache will make a new one."
            )
        self._tighten(Path(path), st)

    def _tighten(self, path: Path, st: os.stat_result) -> None:
        """A folder of ours that others may write (an older abicache under umask 000):
        give it our mode, and say so."""
        self.trust.fix_dir(path)
        warnings.warn(f"abicache: {path} was writable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                      f"set it to {self.trust.dir_mode:o}", AbicacheWarning, stacklevel=5)

    def make_dir(self, path: Path) -> None:
        """A folder of the store, made with the store's mode whatever the umask."""
        self.trust.make_dir(path)

    # ---- read side -------------------------------------------------------

    def variant_dirs(self, kind: str, key: str) -> list[Path]:
        return subdirs(self.layout.key_dir(kind, key))

    def read_manifest(self, vdir: Path) -> Manifest:
        """The validated manifest of a variant dir; it must describe that very
        dir, be ours (owner and mode), and have the variant id its requirements give."""
        fd = os.open(vdir / mf.FILENAME, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            st = os.fstat(fd)
            if not self.trust.ok(st):
                raise ManifestError(self.trust.problem(st, mf.FILENAME) or "untrusted")
            data = _read_upto(fd, mf.MAX_BYTES + 1, st.st_size)
        finally:
            os.close(fd)
        manifest = mf.parse(data, local=True)
        where = (vdir.parent.parent.parent.name, vdir.parent.name, vdir.name)
        if (manifest.kind, manifest.key, manifest.variant) != where:
            raise ManifestError(
                f"manifest in {vdir} describes {manifest.kind}/{manifest.key[:16]}/"
                f"{manifest.variant}, not this entry"
            )
        if mf.variant_of(manifest) != manifest.variant:
            raise ManifestError(f"manifest in {vdir}: its requirements do not give its variant id (edited)")
        return manifest

    def chain_problem(self, vdir: Path) -> tuple[str, Path | None] | None:
        """Every folder from entries/<kind> down to the variant must be a real
        folder we trust: (why not, the outermost offender) otherwise. A folder
        of ours that others could write is repaired: (why, None), and the
        caller checks the entry in full."""
        v = os.fspath(vdir)
        key = os.path.dirname(v)
        prefix = os.path.dirname(key)
        for name in (os.path.dirname(prefix), prefix, key, v):
            try:
                st = os.lstat(name)
            except FileNotFoundError:
                return f"{os.path.basename(name)}: gone", vdir
            if self.trust.ok(st) and stat.S_ISDIR(st.st_mode):
                continue
            folder = Path(name)
            problem = self.trust.problem(st, f"folder {folder.relative_to(self.layout.entries)}")
            if stat.S_ISDIR(st.st_mode) and self.trust.trusted_owner(st.st_uid):
                self._tighten(folder, st)
                return f"{problem} (repaired)", None
            return problem or f"{folder} is not a folder", folder
        return None

    def check(self, vdir: Path, manifest: Manifest, *, full: bool = False, max_age: float = float("inf"),
              hashed: Mapping[tuple[int, int], tuple[str, int]] | None = None) -> tuple[str, list[str], Path] | None:
        """None if the entry may be used; else (why, damaged blob hashes, what to
        move aside). Files are hashed only where the stamp cannot vouch for them
        (stamps.py): a changed byte is found on every lookup, not after an age."""
        seen = time.time_ns()  # before any stat: what is hashed now is judged against it
        chain = self.chain_problem(vdir)
        if chain is not None and chain[1] is not None:
            return chain[0], [], chain[1]
        stamp = stamps.read(vdir, self.trust.ok)
        full = full or chain is not None or time.time() - stamp.verified > max_age
        hashed: dict[str, stamps.Witness] = {}
        for record in manifest.files:
            path = vdir / record.path
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                return f"{record.path}: missing", [], vdir
            problem = self._file_problem(record, st)
            if problem is not None:
                return problem, [], vdir
            if not full and stamp.vouches_for(record.path, st):
                continue
            if hashed is not None and hashed.get((st.st_dev, st.st_ino)) == (record.sha256, st.st_ctime_ns):
                continue  # this very file (a link to its blob) was just hashed whole: verify --full
            digest, _ = blobs.hash_file(path)
            if digest != record.sha256:
                reason = f"{record.path}: sha256 {digest[:16]}..., manifest says {record.sha256[:16]}..."
                return reason, self._blob_of(record, st), vdir
            if stamps.witness(os.lstat(path)) != stamps.witness(st):
                return f"{record.path}: changed while it was checked", [], vdir
            hashed[record.path] = stamps.witness(st)
        if hashed:
            every = len(hashed) == len(manifest.files)
            kept = {p: w for p, w in stamp.files.items() if p not in hashed}
            stamps.write(vdir, kept, hashed, time.time() if every else stamp.verified, stamp.deps_ok, seen_ns=seen)
        return None

    def deps_changed(self, vdir: Path, manifest: Manifest, bases: Mapping[str, str]) -> Dependency | None:
        """The first of the entry's dependencies whose file changed (None: all
        current); witnesses of current ones are remembered in its stamp for
        the next process."""
        stamp = stamps.read(vdir, self.trust.ok)
        absent, env, system = manifest.absent, manifest.env, manifest.system
        if stamp.deps_ok and deps.summary(manifest.deps, bases, None, absent, env, system) in stamp.deps_ok:
            return None  # the common hit: no file was touched since all were found current
        remembered = stamps.read_deps(vdir, self.trust.ok)
        changed, current = deps.first_changed(manifest.deps, bases, remembered, absent, env, system)
        if changed is None and current:
            stamps.remember_deps(vdir, stamp, remembered, current,
                                 deps.summary(manifest.deps, bases, current, absent, env, system))
        return changed

    def _file_problem(self, record: FileRecord, st: os.stat_result) -> str | None:
        if stat.S_ISREG(st.st_mode) and st.st_size == record.size and not st.st_mode & 0o222 \
                and self.trust.ok(st):
            return None  # the common case, without building messages
        if not stat.S_ISREG(st.st_mode):
            return f"{record.path}: not a regular file"
        if st.st_size != record.size:
            return f"{record.path}: size {st.st_size}, manifest says {record.size}"
        if st.st_mode & 0o222:
            return f"{record.path}: writable (mode {stat.S_IMODE(st.st_mode):o})"
        return self.trust.problem(st, record.path)

    def _blob_of(self, record: FileRecord, st: os.stat_result) -> list[str]:
        """[sha] if the damaged file is the blob itself (so it is moved aside too)."""
        try:
            blob = os.lstat(self.layout.blob(record.sha256, record.executable))
        except OSError:
            return []
        return [record.sha256] if (blob.st_ino, blob.st_dev) == (st.st_ino, st.st_dev) else []

    def touch(self, vdir: Path, interval: float) -> None:
        """Record a use, at most once per interval (the variant dir's mtime)."""
        try:
            if time.time() - os.stat(vdir).st_mtime >= interval:
                os.utime(vdir)
        except OSError:
            pass  # a read-only or shared store still serves hits

    def last_used(self, vdir: Path) -> float:
        return os.stat(vdir).st_mtime

    def quarantine(self, path: Path, reason: str, damaged: Sequence[str] = ()) -> Path | None:
        """Move a bad variant (or an untrusted folder above it, and damaged
        blobs) out of the way, with the reason."""
        self.make_dir(self.layout.quarantine)
        target = self.layout.quarantine / (
            f"{time.strftime('%Y%m%dT%H%M%S')}-{path.parent.name[:16]}-{path.name}-{os.getpid()}"
            f"-{time.monotonic_ns() % 10**9}"
        )
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return None  # already moved by another process
        except PermissionError:
            # Someone else's folder cannot change parents without write access
            # to it; a rename within its parent (ours) still takes it out of use.
            target = path.with_name(f".untrusted-{path.name}-{os.getpid()}-{time.monotonic_ns()}")
            os.rename(path, target)
            return target
        for sha in damaged:
            for executable in (False, True):
                blob = self.layout.blob(sha, executable)
                try:
                    os.replace(blob, target / f".damaged-blob-{blob.name}")
                except FileNotFoundError:
                    pass
        try:
            (target / ".abicache-quarantine-reason").write_text(reason + "\n")
        except OSError:
            pass
        return target

    def full_problem(self, vdir: Path, manifest: Manifest) -> tuple[str, list[str]] | None:
        """Hash every file: (reason, damaged blob hashes), or None if it is whole."""
        found = self.check(vdir, manifest, full=True)
        return None if found is None else (found[0], found[1])

    # ---- write side ------------------------------------------------------

    @contextmanager
    def stage(self) -> Iterator[Path]:
        """A fresh private directory under tmp/; removed if the block fails."""
        import tempfile  # the write side is only reached on a miss

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
        mpath = stage / mf.FILENAME
        if not os.path.lexists(mpath):  # a second try after a lost race has written it
            fd = os.open(mpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o444)
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
        threading.Thread(target=blobs.fsync_dir, args=(final.parent,), name="abicache-fsync", daemon=True).start()
        self._index(manifest)
        self._stamp_published(final, manifest, self._marks.pop(os.fspath(stage), {}))
        return final, True

    def _stamp_published(self, vdir: Path, manifest: Manifest, marks: Mapping[str, tuple[int, int]]) -> None:
        """Stamp the files ingest hashed, so the first hit does not hash them
        again (a 0.8 GB precompiled header costs 1.5 s). A file is stamped only
        if it is the very inode ingest hashed (not a blob already there, which
        was not hashed) with the mtime it had then (no write since), and its
        ctime (the link into the blob store just set it) lies far enough in
        the past: up to FINE_SECONDS are waited for; coarse timestamps are not."""
        if not marks:
            return
        files = {r.path: vdir / r.path for r in manifest.files if r.path in marks}
        try:
            newest = max(os.lstat(p).st_ctime_ns for p in files.values())
        except OSError:
            return
        wait = newest + stamps.window_ns(newest) - time.time_ns()
        if wait > stamps.FINE_SECONDS * 1e9:
            return  # whole-second timestamps: the first hit hashes instead
        if wait > 0:
            if sum(manifest.file(rel).size for rel in files) < _WAIT_BYTES:
                return  # the first hit hashing them costs less than waiting here
            time.sleep(wait / 1e9 + 0.001)
        seen = time.time_ns()
        witnessed = {}
        for rel, path in files.items():
            try:
                st = os.lstat(path)
            except OSError:
                return
            if (st.st_ino, st.st_mtime_ns) == marks[rel] and st.st_size == manifest.file(rel).size:
                witnessed[rel] = stamps.witness(st)
        if witnessed:
            stamps.write(vdir, {}, witnessed, time.time() if len(witnessed) == len(manifest.files) else 0.0,
                         seen_ns=seen)

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

    def log_event(self, name: str, line: str) -> None:
        """Append one line to log/<name>.jsonl (one write: lines never interleave)."""
        try:
            self.make_dir(self.layout.log)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(self.layout.log / f"{name}.jsonl", flags, self.trust.file_mode)
            try:
                os.write(fd, (line.rstrip("\n") + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # the log only informs `abicache stats`

    def read_events(self, name: str) -> list[str]:
        try:
            return (self.layout.log / f"{name}.jsonl").read_text().splitlines()
        except OSError:
            return []

    def keys_named(self, kind: str, name: str) -> list[str]:
        """The keys built under (kind, name), by the index (both of its forms)."""
        marker = self.layout.name_marker(kind, name, "0" * 64)
        start = marker.name[:33]  # "<name digest>."
        keys = []
        for folder, named in ((marker.parent, lambda n: n[33:] if n.startswith(start) else ""),
                              (self.layout.name_dir(kind, name), lambda n: n)):
            try:
                with os.scandir(folder) as it:
                    keys += [key for key in map(named, (e.name for e in it)) if len(key) == 64]
            except (FileNotFoundError, NotADirectoryError):
                continue
        return keys

    def remove_tree(self, path: Path) -> None:
        """Rename into trash/ first (atomic for readers), then delete."""
        import shutil

        self.make_dir(self.layout.trash)
        target = self.layout.trash / f"{os.getpid()}-{time.monotonic_ns()}-{path.name}"
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return
        shutil.rmtree(target, ignore_errors=True)

    # ---- enumeration -----------------------------------------------------

    def iter_variant_dirs(self) -> Iterator[Path]:
        """Every variant directory: entries/<kind>/<xx>/<key>/<variant>."""
        for kind_dir in subdirs(self.layout.entries):
            for prefix in subdirs(kind_dir):
                for key_dir in subdirs(prefix):
                    yield from subdirs(key_dir)

    def iter_name_variants(self, kind: str, name: str) -> Iterator[Path]:
        """Variant directories of the keys built under (kind, name), by the index."""
        for key in self.keys_named(kind, name):
            try:
                yield from subdirs(self.layout.key_dir(kind, key))
            except ValueError:
                continue  # not a key's name: the index is advisory

    def iter_blobs(self) -> Iterator[os.DirEntry[str]]:
        for prefix in subdirs(self.layout.blobs):
            try:
                with os.scandir(prefix) as it:
                    yield from (e for e in it if e.is_file(follow_symlinks=False))
            except FileNotFoundError:
                continue

    def blob_digest(self, name: str) -> str | None:
        digest = name[:-1] if name.endswith("x") else name
        try:
            return check_hex(digest, "blob")
        except ValueError:
            return None


#: below this many bytes a build is not delayed (up to stamps.FINE_SECONDS) to stamp its files:
#: hashing them at the first hit (about 1 GB/s) costs less than the wait
_WAIT_BYTES = 32 << 20


def _read_upto(fd: int, limit: int, size_hint: int = 1 << 20) -> bytes:
    """At most `limit` bytes; the first read asks for size_hint + 1 (the
    file's size, where known: no megabyte buffer allocated for a small file)."""
    chunks, size = [], 0
    step = min(size_hint + 1, 1 << 20)
    while size < limit and (chunk := os.read(fd, min(step, limit - size))):
        step = 1 << 20
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


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


def children(path: Path) -> list[Path]:
    """Everything directly in a folder; [] if it does not exist (yet, or any more)."""
    try:
        return sorted(path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def subdirs(path: Path) -> list[Path]:
    """Real folders in path; names starting with '.' are folders moved aside."""
    try:
        with os.scandir(path) as it:
            return sorted(Path(e.path) for e in it if e.is_dir(follow_symlinks=False) and e.name[0] != ".")
    except (FileNotFoundError, NotADirectoryError):
        return []


def _raise(exc: OSError) -> None:
    raise exc
