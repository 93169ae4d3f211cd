"""Read-only stores searched after the local one: prebuilt entries a package ships.

A tier is a store folder (the layout of the local store: `abicache bundle`
writes one, or a copy of a local store) that abicache reads and never writes:
a folder inside an installed package, a read-only shared folder, a container
layer. Where they come from, in this order:

  1. ABICACHE_READ_STORES: folders separated by os.pathsep;
  2. the `abicache.stores` entry points of installed packages: each names a
     folder (a str or os.PathLike), or a callable that returns one, so that
     `pip install mylib-kernels` is all a user does:

         [project.entry-points."abicache.stores"]
         mylib = "mylib_kernels:STORE"   # STORE = str(Path(__file__).parent / "store")

A tier is looked at only on a local miss (so a hit costs nothing more).

What a tier may serve, and how it is checked:
  * the entry of what was asked for (asked.py): the tool identities of the key
    are not compared, since the entry was built elsewhere, by the maintainer's
    compiler; the requirements read from its binary decide whether it loads,
    and its recorded project files (the sources' folders, include folders)
    must hold their bytes here. The compiler's own files (system headers, its
    environment) were the maintainer's: they are not compared.
  * trust as for the local store: every folder from the tier's root down and
    every file is owned by this user or root (or a member of the ABICACHE_SHARED
    group) and writable by nobody else, but for the owner's private group (what
    pip installs under umask 002) or the shared group; a symbolic link is never
    followed. A tier is never written: a folder left open is refused, not closed;
  * integrity: stamps cannot be written there, so every file is hashed in full
    once per process (a changed byte never runs), then remembered by its
    (inode, size, mtime, ctime); with ABICACHE_TRUSTED_KEYS set, a manifest
    must be signed by one of them (`abicache bundle` signs with
    ABICACHE_SIGNING_KEY), as on the remote tier.
An entry that fails a check is skipped with a warning (it cannot be moved
aside: the tier is not ours to write), and the lookup goes on.
"""

from __future__ import annotations

import hashlib
import os
import stat
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ..store import asked
from ..settings import config
from ..errors import AbicacheError, AbicacheWarning, ManifestError
from ..store import Manifest, Store, blobs
from ..store import deps as depcheck
from ..store.layout import LAYOUT_VERSION, OLD_VERSIONS
from ..store.manifest import preference

#: the group of entry points installed packages register their stores under
ENTRY_POINTS = "abicache.stores"

_tiers: dict[tuple[str, ...], list[Tier]] = {}
_verified: dict[str, tuple[int, ...]] = {}  # variant folder -> the witnesses its files were hashed at
_warned: set[str] = set()


class Tier:
    """One read-only store."""

    def __init__(self, root: Path, origin: str) -> None:
        from ..settings.owners import group_setting

        self.root, self.origin = root, origin
        # never written (not even repaired); trusted as the local store is, and also where it is
        # writable by its owner's private group (pip under umask 002) or the group the user shares with
        self.store = Store(root, group=group_setting(config.text("ABICACHE_SHARED")), read_only=True)

    def __repr__(self) -> str:
        return f"Tier({str(self.root)!r}, from {self.origin})"

    def find(self, kind: str, name: str, key: str, described: Mapping[str, Any], usable: Callable[[Manifest], bool],
             bases: Mapping[str, str], facts: Any = None, local: Store | None = None) -> tuple[Path, Manifest] | None:
        """The preferred entry of what was asked for that holds here, verified (facts: whose GPUs
        rank the variants, Requirements.gpu_rank). An entry whose files are the store's blobs
        (a wheel keeps each once) is copied into the local store first (materialize)."""
        want = asked.asked(described)
        found = []
        for vdir in [*self.store.variant_dirs(kind, key), *asked.candidates(self.store, kind, name)]:
            manifest = self._manifest(vdir)
            if manifest is not None and asked.asked(manifest.inputs) == want and usable(manifest):
                found.append((vdir, manifest))
        found.sort(key=lambda vm: (vm[1].requirements.gpu_rank(facts) if facts is not None else 0,
                                   *preference(vm[1])), reverse=True)
        for vdir, manifest in found:
            if not project_files_hold(manifest, bases):
                continue
            if manifest.files and not os.path.lexists(vdir / manifest.files[0].path) and local is not None:
                try:
                    got = self.materialize(manifest, local)
                except OSError:  # a local store that cannot be written: the miss goes to its fallback
                    continue
                if got is not None:
                    return got
            elif self.intact(vdir, manifest):
                return vdir, manifest
        return None

    def materialize(self, manifest: Manifest, local: Store) -> tuple[Path, Manifest] | None:
        """The entry in the local store, its files copied from this store's blobs, each hashed
        as it is copied (as a remote download is); a copy made before is used as it is."""
        there = local.layout.variant_dir(manifest.kind, manifest.key, manifest.variant)
        if there.is_dir():
            try:
                mine = local.read_manifest(there)
                if local.check(there, mine) is None:
                    return there, mine
            except (OSError, ManifestError):
                pass
        with local.stage() as stage:
            for record in manifest.files:
                problem = self._copy_blob(record, stage / record.path)
                if problem is not None:
                    _warn(f"abicache: refused {manifest.kind} {manifest.name} of the read-only store {self.root} "
                          f"({problem}); it is never loaded")
                    return None
            vdir, won = local.commit_verified(stage, manifest)
        return (vdir, manifest) if won else (vdir, local.read_manifest(vdir))

    def _copy_blob(self, record: Any, dest: Path) -> str | None:
        blob = self.store.layout.blob(record.sha256, record.executable)
        try:
            st = os.lstat(blob)
            if not stat.S_ISREG(st.st_mode) or st.st_size != record.size or not self.store.trust.ok(st):
                return f"{record.path}: its blob is missing, untrusted or of the wrong size"
            dest.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            with open(blob, "rb") as src, open(dest, "xb") as out:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            return f"{record.path}: {exc.strerror}"
        return None if digest.hexdigest() == record.sha256 else f"{record.path}: sha256 differs from its manifest's"

    def _manifest(self, vdir: Path) -> Manifest | None:
        try:
            manifest = self.store.read_manifest(vdir)
        except FileNotFoundError:
            return None
        except (OSError, ManifestError) as exc:
            _warn(f"abicache: skipped {vdir} of the read-only store {self.root}: {exc}")
            return None
        problem = _unsigned(manifest)
        if problem is not None:
            _warn(f"abicache: refused {vdir} of the read-only store {self.root}: {problem}")
            return None
        return manifest

    def intact(self, vdir: Path, manifest: Manifest) -> bool:
        """Trusted folders and files, each hashing to the manifest's sha256 (once per process)."""
        problem = self._folders_problem(vdir)
        witnesses: list[int] = []
        for record in manifest.files if problem is None else ():
            path = vdir / record.path
            try:
                st = os.lstat(path)
            except OSError as exc:
                problem = f"{record.path}: {exc.strerror}"
                break
            if not stat.S_ISREG(st.st_mode) or st.st_size != record.size or not self.store.trust.ok(st):
                problem = f"{record.path}: " + (self.store.trust.problem(st, record.path) or "not the file its "
                                                "manifest describes (type or size)")
                break
            witnesses += [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        if problem is None and _verified.get(str(vdir)) == tuple(witnesses):
            return True
        for record in manifest.files if problem is None else ():
            digest, _ = blobs.hash_file(vdir / record.path)
            if digest != record.sha256:
                problem = f"{record.path}: sha256 {digest[:16]}..., its manifest says {record.sha256[:16]}..."
                break
        if problem is not None:
            _warn(f"abicache: refused {vdir} of the read-only store {self.root} ({problem}); it is never loaded")
            return False
        _verified[str(vdir)] = tuple(witnesses)
        return True

    def _folders_problem(self, vdir: Path) -> str | None:
        """Every folder from the tier's root down to the entry: a real folder we trust."""
        folder, top = Path(vdir), os.fspath(self.store.layout.root)
        while True:
            try:
                st = os.lstat(folder)
            except OSError as exc:
                return f"{folder}: {exc.strerror}"
            if not (stat.S_ISDIR(st.st_mode) and self.store.trust.ok(st)):
                return self.store.trust.problem(st, f"folder {folder}") or f"{folder} is not a folder"
            if os.fspath(folder) == top or folder.parent == folder:
                return None
            folder = folder.parent


def _unsigned(manifest: Manifest) -> str | None:
    """Where ABICACHE_TRUSTED_KEYS is set, why this manifest is not signed by one of them."""
    text = config.text("ABICACHE_TRUSTED_KEYS")
    if not text:
        return None
    from ..remote import keys

    return keys.check(manifest, keys.parse_trusted(text))


def project_files_hold(manifest: Manifest, bases: Mapping[str, str]) -> bool:
    """The recorded files under the project's folders hold their bytes here, and the paths
    looked for there are still missing; files outside them were the builder's machine's."""
    project = [d for d in manifest.deps if d.base != "abs"]
    absent = [a for a in manifest.absent if a.base != "abs"]
    return depcheck.first_changed(project, bases, {}, absent)[0] is None


def tiers() -> list[Tier]:
    """The read-only stores in effect (ABICACHE_READ_STORES, then entry points), remembered per setting."""
    setting = config.text("ABICACHE_READ_STORES")
    memo = (setting,)
    found = _tiers.get(memo)
    if found is None:
        listed = [(Path(p).expanduser(), "ABICACHE_READ_STORES") for p in setting.split(os.pathsep) if p.strip()]
        found = _tiers[memo] = _usable([*listed, *_from_entry_points()])
    return found


def forget() -> None:
    """Look for tiers again at the next miss (a package was installed meanwhile; tests)."""
    _tiers.clear()
    _verified.clear()


def _from_entry_points() -> list[tuple[Path, str]]:
    if not _declared():
        return []
    from importlib.metadata import entry_points

    out = []
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            value = ep.load()
            value = value() if callable(value) else value
            out.append((Path(os.fspath(value)), f"entry point {ep.name} ({ep.value})"))
        except Exception as exc:  # a broken package must not break every build: it is named, and skipped
            _warn(f"abicache: the read-only store of entry point {ep.name} ({ep.value}) is skipped: "
                  f"{type(exc).__name__}: {exc}")
    return out


def _declared() -> bool:
    """Whether an installed distribution may declare a read-only store: its entry_points.txt
    names the group. Read without importing importlib.metadata, which costs 70 ms of every
    miss of a fresh process (a compiler launcher's); where sys.path holds anything but
    folders (a zip, an egg), importlib.metadata decides."""
    import sys

    needle = f"[{ENTRY_POINTS}]".encode()
    for folder in sys.path:
        try:
            names = os.listdir(folder or ".")
        except NotADirectoryError:
            return True  # a zip or an egg: importlib.metadata reads those
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(folder or ".", name, "entry_points.txt"), "rb") as f:
                    if needle in f.read():
                        return True
            except OSError:
                continue
    return False


def _usable(listed: Iterable[tuple[Path, str]]) -> list[Tier]:
    out: list[Tier] = []
    seen: set[str] = set()
    for root, origin in listed:
        real = os.path.realpath(root)
        if real in seen:
            continue
        seen.add(real)
        if not os.path.isdir(os.path.join(root, LAYOUT_VERSION, "entries")):
            old = [v for v in OLD_VERSIONS if os.path.isdir(os.path.join(root, v, "entries"))]
            why = (f"a store of the older layout {old[0]} (bundle it again with this abicache)" if old
                   else f"not an abicache store (no {LAYOUT_VERSION}/entries folder)")
            _warn(f"abicache: {root} ({origin}) is {why}: skipped")
            continue
        try:
            tier = Tier(root, origin)
            tier.store.ensure()
        except (OSError, AbicacheError) as exc:
            _warn(f"abicache: the read-only store {root} ({origin}) is skipped: {exc}")
            continue
        out.append(tier)
    return out


def _warn(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, AbicacheWarning, stacklevel=5)
