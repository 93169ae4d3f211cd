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
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import BuildError, ManifestError
from . import blobs, manifest as mf
from .layout import Layout, check_hex
from .manifest import FileRecord, Manifest
from .trust import ensure_private_root


#: test-only switch: "1" replaces the atomic rename by a copy (see _copy_publish)
BROKEN_PUBLISH = "ABICACHE_TEST_BROKEN_PUBLISH"


class Store:
    def __init__(self, root: Path, *, shared: bool = False) -> None:
        self.layout = Layout(Path(root))
        self.shared = shared
        self._ready = False

    @property
    def root(self) -> Path:
        return self.layout.root

    def ensure(self) -> None:
        """Check the root is ours (once per process) and create the layout."""
        if self._ready:
            return
        ensure_private_root(self.layout.root, shared=self.shared)
        if not self.layout.entries.is_dir():
            ensure_private_root(self.layout.base, shared=self.shared)
            for folder in ("entries", "blobs", "tmp", "locks", "quarantine", "trash", "index"):
                (self.layout.base / folder).mkdir(exist_ok=True)
        self._ready = True

    # ---- read side -------------------------------------------------------

    def variant_dirs(self, kind: str, key: str) -> list[Path]:
        try:
            with os.scandir(self.layout.key_dir(kind, key)) as it:
                return sorted(Path(e.path) for e in it if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read_manifest(self, vdir: Path) -> Manifest:
        """The validated manifest of a variant dir; it must describe that very dir."""
        path = vdir / mf.FILENAME
        with open(path, "rb") as fh:
            data = fh.read(mf.MAX_BYTES + 1)
        manifest = mf.parse(data)
        where = (vdir.parent.parent.parent.name, vdir.parent.name, vdir.name)
        if (manifest.kind, manifest.key, manifest.variant) != where:
            raise ManifestError(
                f"manifest in {vdir} describes {manifest.kind}/{manifest.key[:16]}/"
                f"{manifest.variant}, not this entry"
            )
        return manifest

    def quick_problem(self, vdir: Path, manifest: Manifest) -> str | None:
        """Sizes, modes and blob identity; no hashing."""
        for record in manifest.files:
            try:
                st = os.stat(vdir / record.path)
                blob = os.stat(self.layout.blob(record.sha256, record.executable))
            except FileNotFoundError as exc:
                return f"{record.path}: missing ({exc.filename})"
            if st.st_size != record.size:
                return f"{record.path}: size {st.st_size}, manifest says {record.size}"
            if (st.st_ino, st.st_dev) != (blob.st_ino, blob.st_dev):
                return f"{record.path}: no longer the blob {record.sha256[:16]}"
            if st.st_mode & 0o222:
                return f"{record.path}: writable (mode {stat.S_IMODE(st.st_mode):o})"
        return None

    def full_problem(self, vdir: Path, manifest: Manifest) -> tuple[str, list[str]] | None:
        """Hash every file; returns (reason, damaged blob hashes) or None."""
        quick = self.quick_problem(vdir, manifest)
        if quick is not None:
            return quick, []
        for record in manifest.files:
            digest, _ = blobs.hash_file(vdir / record.path)
            if digest != record.sha256:
                reason = f"{record.path}: sha256 {digest[:16]}..., manifest says {record.sha256[:16]}..."
                return reason, [record.sha256]
        return None

    def verified_age(self, vdir: Path) -> float:
        """Seconds since the last full verification (the manifest's mtime)."""
        try:
            return time.time() - os.stat(vdir / mf.FILENAME).st_mtime
        except OSError:
            return float("inf")

    def mark_verified(self, vdir: Path) -> None:
        try:
            os.utime(vdir / mf.FILENAME)
        except OSError:
            pass

    def touch(self, vdir: Path, interval: float) -> None:
        """Record a use, at most once per interval (the variant dir's mtime)."""
        try:
            if time.time() - os.stat(vdir).st_mtime >= interval:
                os.utime(vdir)
        except OSError:
            pass  # a read-only or shared store still serves hits

    def last_used(self, vdir: Path) -> float:
        return os.stat(vdir).st_mtime

    def quarantine(self, vdir: Path, reason: str, damaged: Sequence[str] = ()) -> Path | None:
        """Move a bad variant (and its damaged blobs) out of the way, with the reason."""
        self.layout.quarantine.mkdir(parents=True, exist_ok=True)
        target = self.layout.quarantine / (
            f"{time.strftime('%Y%m%dT%H%M%S')}-{vdir.parent.name[:16]}-{vdir.name}-{os.getpid()}"
        )
        try:
            os.rename(vdir, target)
        except FileNotFoundError:
            return None  # already moved by another process
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

    # ---- write side ------------------------------------------------------

    @contextmanager
    def stage(self) -> Iterator[Path]:
        """A fresh private directory under tmp/; removed if the block fails."""
        import tempfile  # the write side is only reached on a miss

        self.ensure()
        path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=self.layout.tmp))
        try:
            yield path
        except BaseException:
            self.remove_tree(path)
            raise
        if path.exists():  # not committed (e.g. lost the race)
            self.remove_tree(path)

    def collect(self, stage: Path) -> list[str]:
        """The regular files a builder left in stage, as safe relative paths."""
        found = []
        for folder, dirs, files in os.walk(stage):
            for name in dirs + files:
                full = Path(folder) / name
                rel = full.relative_to(stage).as_posix()
                st = full.lstat()
                if stat.S_ISLNK(st.st_mode):
                    raise BuildError(f"the builder left a symbolic link {rel!r}; write regular files only")
                if stat.S_ISREG(st.st_mode):
                    try:
                        found.append(mf.safe_relpath(rel))
                    except ManifestError as exc:
                        raise BuildError(f"the builder wrote an unusable file: {exc}") from None
                elif not stat.S_ISDIR(st.st_mode):
                    raise BuildError(f"the builder left {rel!r}, which is not a regular file")
        if not found:
            raise BuildError(f"the builder wrote no files into its output directory {stage}")
        return sorted(found)

    def ingest(self, stage: Path, paths: Sequence[str]) -> tuple[FileRecord, ...]:
        """Hash every file and make it a hard link to its blob."""
        records = []
        for rel in paths:
            path = stage / rel
            digest, size = blobs.hash_file(path)
            executable = bool(path.stat().st_mode & 0o111)
            records.append(FileRecord(rel, digest, size, 0o555 if executable else 0o444))
        self._adopt(stage, records)
        return tuple(records)

    def _adopt(self, stage: Path, records: Sequence[FileRecord]) -> None:
        aside = self.layout.quarantine / "damaged-blobs"
        for record in records:
            blobs.adopt(stage / record.path, self.layout.blob(record.sha256, record.executable), record, aside)

    def commit_verified(self, stage: Path, manifest: Manifest) -> tuple[Path, bool]:
        """Commit files the caller has already hashed against the manifest
        (a remote fetch hashes while it downloads): no second pass over them."""
        self._adopt(stage, manifest.files)
        return self.commit(stage, manifest)

    def link_blob(self, record: FileRecord, dest: Path) -> bool:
        """Put a hard link to the local blob of record at dest, if there is one of the right size."""
        blob = self.layout.blob(record.sha256, record.executable)
        try:
            if os.stat(blob).st_size != record.size:
                return False
            os.link(blob, dest)
        except OSError:
            return False
        return True

    def commit(self, stage: Path, manifest: Manifest) -> tuple[Path, bool]:
        """Write the manifest and rename stage into place; (dir, whether we won)."""
        mpath = stage / mf.FILENAME
        fd = os.open(mpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.write(fd, manifest.dumps())
            os.fsync(fd)
        finally:
            os.close(fd)
        blobs.fsync_dir(stage)
        final = self.layout.variant_dir(manifest.kind, manifest.key, manifest.variant)
        final.parent.mkdir(parents=True, exist_ok=True)
        if os.environ.get(BROKEN_PUBLISH) == "1":
            return self._copy_publish(stage, final, manifest)
        try:
            os.rename(stage, final)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            return final, False
        blobs.fsync_dir(final.parent)
        self._index(manifest)
        return final, True

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
        folder = self.layout.name_dir(manifest.kind, manifest.name)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / manifest.key).touch()
        except OSError:
            pass  # the index only serves `explain`

    def log_event(self, name: str, line: str) -> None:
        """Append one line to log/<name>.jsonl (one write: lines never interleave)."""
        try:
            self.layout.log.mkdir(exist_ok=True)
            fd = os.open(self.layout.log / f"{name}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
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
        try:
            with os.scandir(self.layout.name_dir(kind, name)) as it:
                return [e.name for e in it if len(e.name) == 64]
        except FileNotFoundError:
            return []

    def remove_tree(self, path: Path) -> None:
        """Rename into trash/ first (atomic for readers), then delete."""
        import shutil

        self.layout.trash.mkdir(parents=True, exist_ok=True)
        target = self.layout.trash / f"{os.getpid()}-{time.monotonic_ns()}-{path.name}"
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return
        shutil.rmtree(target, ignore_errors=True)

    # ---- enumeration -----------------------------------------------------

    def iter_variant_dirs(self) -> Iterator[Path]:
        """Every variant directory: entries/<kind>/<xx>/<key>/<variant>."""
        for kind_dir in _subdirs(self.layout.entries):
            for prefix in _subdirs(kind_dir):
                for key_dir in _subdirs(prefix):
                    yield from _subdirs(key_dir)

    def iter_blobs(self) -> Iterator[os.DirEntry[str]]:
        for prefix in _subdirs(self.layout.blobs):
            with os.scandir(prefix) as it:
                yield from (e for e in it if e.is_file(follow_symlinks=False))

    def blob_digest(self, name: str) -> str | None:
        digest = name[:-1] if name.endswith("x") else name
        try:
            return check_hex(digest, "blob")
        except ValueError:
            return None


def children(path: Path) -> list[Path]:
    """Everything directly in a folder; [] if it does not exist (yet, or any more)."""
    try:
        return sorted(path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _subdirs(path: Path) -> list[Path]:
    try:
        with os.scandir(path) as it:
            return sorted(Path(e.path) for e in it if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []
