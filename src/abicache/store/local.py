"""The local store: its folders, reading and checking entries (owners, modes, sizes,
stamps, recorded dependencies), quarantine, and enumeration. Its write side (stage,
hash, link, commit: the publish protocol) is store/publishing.py.
"""

from __future__ import annotations

import errno
import os
import stat
import time
import warnings
from pathlib import Path
from stat import S_ISREG

from ..errors import AbicacheWarning, ManifestError, UntrustedRootError
from . import blobs, deps, manifest as mf, manifest_names, stamps
from .layout import FOLDERS, LAYOUT_VERSION, Layout, check_hex, entry_name, is_hex
from .manifest import Dependency, FileRecord, Manifest
from .publishing import BROKEN_PUBLISH, Publishing, stage_in_use, walk_dirs  # noqa: F401  (re-exported)
from .trust import Trust, ensure_root

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Iterator, Mapping, Sequence

    from . import logs


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: roots already checked in this process: (root as given, group) -> resolved root
_ENSURED: dict[tuple[str, str | None], Path] = {}



class Store(Publishing):
    """One store root. `group` names the trusted group of a shared store
    (ABICACHE_SHARED); None keeps it private to the user (see trust.py)."""

    def __init__(self, root: Path, *, group: str | None = None, read_only: bool = False) -> None:
        self.layout = Layout(Path(root))
        self.trust = Trust(group, private_groups=read_only)
        self.read_only = read_only  # a store that is never written: nothing made, nothing repaired
        self._ready = False
        self._written = False
        self.listed: tuple[str, list[str]] | None = None  # _manifest_bytes's last listing
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
        memo = (os.fspath(self.layout.root), self.trust.group, writing, self.read_only)
        real = _ENSURED.get(memo)
        if real is None:
            if self.read_only and writing:
                raise UntrustedRootError(f"{self.layout.root} is a read-only store: abicache never writes it")
            real = ensure_root(self.layout.root, self.trust, create=not self.read_only)
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
            if self.read_only:
                raise UntrustedRootError(f"{path} is missing from the read-only store") from None
            self.make_dir(Path(path))
            return
        if self.trust.ok(st) and stat.S_ISDIR(st.st_mode):
            return
        problem = self.trust.problem(st, path)
        if not stat.S_ISDIR(st.st_mode) or not self.trust.trusted_owner(st.st_uid) or self.read_only:
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
        if self.read_only:
            raise UntrustedRootError(f"{self.layout.root} is a read-only store: abicache never writes it ({path})")
        self.trust.make_dir(path)

    # ---- read side -------------------------------------------------------

    def variant_dirs(self, kind: str, key: str) -> list[Path]:
        """The folders of key's variants: "<key>.<variant>" in its prefix folder (listed)."""
        prefix = self.layout.prefix_dir(kind, check_hex(key, "key"))
        return [Path(f"{prefix}/{key}.{v}") for v in _variants_listed(os.fspath(prefix), key)]

    def hinted_variant_dirs(self, kind: str, key: str) -> list[Path] | None:
        """The folders the key's variants link names (Layout.variants_link), without listing
        the prefix folder; None where there is no such link. A hint: a folder named there
        may be gone, and one published in a race may be missing (the caller lists then)."""
        link = self.layout.variants_link(kind, key)
        try:
            target = os.readlink(link)
        except OSError:
            return None
        variants = target.split(",")
        if not all(map(is_hex, variants)):
            return None
        return [Path(f"{link}.{v}") for v in variants]

    def link_variants(self, kind: str, key: str) -> None:
        """Write the key's variants link from a listing (after a publish or a removal):
        made under a temporary name, then renamed over the old one; removed where the key
        has no variant left or more than fit in an inode."""
        link = self.layout.variants_link(kind, key)
        variants = _variants_listed(os.fspath(link.parent), key)
        target = ",".join(variants)
        try:
            if not variants or len(target) > _INLINE_LINK:
                os.unlink(link)
                return
            temp = link.with_name(f".{key}.{os.getpid()}-{time.monotonic_ns()}")
            os.symlink(target, temp)
            os.replace(temp, link)
        except OSError:
            pass  # a hint: lookups list the folder instead

    def read_manifest(self, vdir: Path) -> Manifest:
        """The validated manifest of a variant dir; it must describe that very
        dir, be ours (owner and mode), and have the variant id its requirements give."""
        manifest = mf.parse(self._manifest_bytes(os.fspath(vdir)), local=True)
        prefix, name = os.path.split(vdir)
        where = (os.path.basename(os.path.dirname(prefix)), *(entry_name(name) or ("", "")))
        if (manifest.kind, manifest.key, manifest.variant) != where:
            raise ManifestError(
                f"manifest in {vdir} describes {manifest.kind}/{manifest.key[:16]}/"
                f"{manifest.variant}, not this entry"
            )
        if mf.variant_of(manifest) != manifest.variant:
            raise ManifestError(f"manifest in {vdir}: its requirements do not give its variant id (edited)")
        return manifest

    def _manifest_bytes(self, vdir: str) -> bytes:
        """The manifest's bytes: the file manifest.json where there is one, else the names
        it is kept in (manifest_names), read only from a folder that passes the trust check.
        The folder's listing is kept for the stamp's first read (stamps.read: one listing a hit)."""
        dfd = os.open(vdir, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
        try:
            folder = os.fstat(dfd)
            names = os.listdir(dfd)
            if mf.FILENAME in names:
                fd = os.open(mf.FILENAME, os.O_RDONLY | _NOFOLLOW, dir_fd=dfd)
                try:
                    st = os.fstat(fd)
                    if not self.trust.ok(st):
                        raise ManifestError(self.trust.problem(st, mf.FILENAME) or "untrusted")
                    return _read_upto(fd, mf.MAX_BYTES + 1, st.st_size)
                finally:
                    os.close(fd)
            if not manifest_names.present(names):
                raise FileNotFoundError(errno.ENOENT, "no manifest", os.path.join(vdir, mf.FILENAME))
            if not self.trust.ok(folder):
                raise ManifestError(self.trust.problem(folder, "the folder its names are in") or "untrusted")
            self.listed = (vdir, names)
            return manifest_names.decode(names, mf.MAX_BYTES) or b""
        finally:
            os.close(dfd)

    def take_listing(self, vdir: Path) -> list[str] | None:
        """The names _manifest_bytes listed in vdir, once (a stamp written since is not in them)."""
        listed, self.listed = self.listed, None
        return listed[1] if listed is not None and listed[0] == os.fspath(vdir) else None

    def has_manifest(self, vdir: Path) -> bool:
        """Whether the folder holds a manifest in either form (whole or not)."""
        try:
            names = os.listdir(vdir)
        except OSError:
            return False
        return mf.FILENAME in names or manifest_names.present(names)

    def chain_problem(self, vdir: Path) -> tuple[str, Path | None] | None:
        """Every folder from entries/<kind> down to the variant must be a real
        folder we trust: (why not, the outermost offender) otherwise. A folder
        of ours that others could write is repaired: (why, None), and the
        caller checks the entry in full."""
        v = os.fspath(vdir)
        prefix = os.path.dirname(v)
        for name in (os.path.dirname(prefix), prefix, v):
            try:
                st = os.lstat(name)
            except FileNotFoundError:
                return f"{os.path.basename(name)}: gone", vdir
            if self.trust.ok(st) and stat.S_ISDIR(st.st_mode):
                continue
            folder = Path(name)
            problem = self.trust.problem(st, f"folder {folder.relative_to(self.layout.entries)}")
            if stat.S_ISDIR(st.st_mode) and self.trust.trusted_owner(st.st_uid) and not self.read_only:
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
        order = sorted(record.path for record in manifest.files)
        stamp = stamps.read(vdir, self.trust.ok, order, self.take_listing(vdir))
        full = full or chain is not None or time.time() - stamp.verified > max_age
        hashed: dict[str, stamps.Witness] = {}
        folder = os.fspath(vdir) + os.sep  # strings, not Paths: a join per file is most of a hit's time
        vouched = {} if full else stamp.files
        ok = self.trust.ok
        for record in manifest.files:
            path = folder + record.path
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                return f"{record.path}: missing", [], vdir
            # the common case inline (a hit checks every file): a regular read-only file of ours,
            # of the manifest's size, whose stamp vouches for it
            if not (S_ISREG(st.st_mode) and st.st_size == record.size and not st.st_mode & 0o222 and ok(st)):
                return self._file_problem(record, st) or f"{record.path}: not trusted", [], vdir
            if vouched.get(record.path) == (st.st_ino, st.st_size, st.st_ctime_ns):
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
            stamps.write(vdir, kept, hashed, time.time() if every else stamp.verified, stamp.deps_ok, seen_ns=seen,
                         order=order, old=stamp.names)
        return None

    def remembered_deps(self, vdir: Path) -> dict[str, list[int]]:
        """The witnesses at which the entry's dependencies were found current (its stamp)."""
        return stamps.read_deps(vdir, self.trust.ok)

    def deps_changed(self, vdir: Path, manifest: Manifest, bases: Mapping[str, str]) -> Dependency | None:
        """The first of the entry's dependencies whose file changed (None: all
        current); witnesses of current ones are remembered in its stamp for
        the next process."""
        order = sorted(record.path for record in manifest.files)
        stamp = stamps.read(vdir, self.trust.ok, order, self.take_listing(vdir))
        absent, env, system = manifest.absent, manifest.env, manifest.system
        if stamp.deps_ok and deps.summary(manifest.deps, bases, None, absent, env, system) in stamp.deps_ok:
            return None  # the common hit: no file was touched since all were found current
        remembered = stamps.read_deps(vdir, self.trust.ok)
        changed, current = deps.first_changed(manifest.deps, bases, remembered, absent, env, system)
        if changed is None and current:
            stamps.remember_deps(vdir, stamp, remembered, current,
                                 deps.summary(manifest.deps, bases, current, absent, env, system), order)
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
            f"{time.strftime('%Y%m%dT%H%M%S')}-{_short(path.name)}-{os.getpid()}"
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


    def log_event(self, name: str, line: str, compact: logs.Compact | None = None) -> None:
        """Append one line to log/<name>.jsonl (one write: lines never interleave); the log is
        bounded and opened safely (store/logs.py)."""
        self.log_events(name, [line], compact)

    def log_events(self, name: str, lines: Sequence[str], compact: logs.Compact | None = None) -> None:
        from . import logs  # a hit logs nothing

        try:
            self.make_dir(self.layout.log)
        except OSError:
            return  # the log only informs `abicache stats`
        logs.append(self.layout.log, name, lines, self.trust.file_mode, compact)

    def read_events(self, name: str) -> list[str]:
        """The log's lines, the older generation's first."""
        from . import logs

        return logs.read(self.layout.log, name)

    def keys_named(self, kind: str, name: str) -> list[str]:
        """The keys built under (kind, name), by the index."""
        marker = self.layout.name_marker(kind, name, "0" * 64)
        start = marker.name[:33]  # "<name digest>."
        try:
            with os.scandir(marker.parent) as it:
                return [e.name[33:] for e in it if e.name.startswith(start) and len(e.name) == 33 + 64]
        except (FileNotFoundError, NotADirectoryError):
            return []

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
        """Every variant directory: entries/<kind>/<xx>/<key>.<variant>."""
        for kind_dir in subdirs(self.layout.entries):
            yield from self.iter_kind(kind_dir.name)

    def iter_kind(self, kind: str) -> Iterator[Path]:
        """Every variant directory of one kind."""
        for prefix in subdirs(self.layout.entries / kind):
            yield from (vdir for vdir in subdirs(prefix) if entry_name(vdir.name))

    def iter_name_variants(self, kind: str, name: str) -> Iterator[Path]:
        """Variant directories of the keys built under (kind, name), by the index."""
        for key in self.keys_named(kind, name):
            try:
                yield from self.variant_dirs(kind, key)
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


#: the longest symlink target ext4 keeps in the inode (60 bytes, less its terminating zero)
_INLINE_LINK = 59


def _variants_listed(prefix: str, key: str) -> list[str]:
    start = key + "."
    try:
        names = os.listdir(prefix)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(found[1] for found in map(entry_name, (n for n in names if n.startswith(start))) if found)


def _short(name: str) -> str:
    """An entry folder's name with its key cut to 16 digits (quarantine's names)."""
    key, _, variant = name.partition(".")
    return f"{key[:16]}-{variant}" if variant else name


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
