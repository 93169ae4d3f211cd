"""Triton: one cached cubin for every Python version, found in milliseconds.

    import abicache.triton
    abicache.triton.install()          # or TRITON_CACHE_MANAGER=abicache.triton:CacheManager

install() does two things:

1. Triton's kernel key starts with `triton_key()`, which hashes Triton's Python
   sources *and the whole libtriton.so*: ~500 MB, different for each Python
   version although the cubin and PTX it produces are byte-identical, and
   0.5-0.9 s of hashing in every fresh process. install() replaces it, in
   every module that imported it by name, with `codegen_key()`:

   in the key:     Triton's version as installed (with its local/git tag),
                   the sha256 of every .py file of triton/compiler, triton/backends,
                   triton/language and triton/runtime/cache.py (the same sources
                   Triton hashes), and the versions of the bundled ptxas;
   not in the key: the bytes of libtriton.so and of other Python extension
                   modules, which differ per Python version, where they are the
                   ones a wheel from an index installed: its RECORD names them
                   (size) and none was written after it (mtime). Elsewhere (a
                   source or editable install, a library rebuilt in place) their
                   sha256s are in the key too, hashed once per version of them.

   It is safe because such a libtriton.so is built from the sources its version
   names: a release wheel's version says which. What Triton adds after triton_key() —
   the source hash, the backend hash (ptxas version and target), the options
   and the cache-invalidating environment variables — stays as Triton computes
   it. The result is memoized on disk by the stat of the hashed files and ptxas.

   The subprocesses Triton runs in every process to describe its tools (`ptxas
   --version`, `file` on the Python executable) are remembered the same way
   (frontends/triton_probes.py): their answers are Triton's own, computed once.

2. CacheManager stores each compiled kernel as one abicache entry: all files
   are published together (temp dir + rename) when Triton writes its group
   file, the group records file names, not absolute paths (so a moved cache
   keeps hitting), identical files are stored once, `abicache gc` evicts, and
   a SIGKILL mid-compile leaves nothing behind. Requirements come from the
   audit of the cubin; none are on the Python version.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Optional

from .core.cache import Cache, default_cache
from .errors import AbicacheError

KIND = "triton"
FILE_KIND = "triton.file"  # one file put() alone
GROUP = "__abicache_group__.json"
_SOURCE_DIRS = ("compiler", "backends", "language")
_KNOWN_CACHE_API = ("get_file", "put", "get_group", "put_group")


def triton_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        raise AbicacheError("triton is not installed; pip install triton")
    return Path(next(iter(spec.submodule_search_locations)))


def _sources(root: Path) -> list[Path]:
    files = [root / "runtime" / "cache.py"]
    for sub in _SOURCE_DIRS:
        files += sorted(p for p in (root / sub).rglob("*.py") if "__pycache__" not in p.parts)
    return files


def _tools(root: Path) -> tuple[list[Path], list[Path]]:
    """(the bundled ptxas programs, the native libraries that compile: libtriton.so and the
    backends' own), from one walk of backends/ (a fresh process's install() pays it)."""
    ptxas, natives = [], sorted(p for p in (root / "_C").rglob("*.so") if p.is_file())
    for folder, _, names in os.walk(root / "backends"):
        for name in names:
            path = Path(folder, name)
            if name.startswith("ptxas") and path.is_file() and os.access(path, os.X_OK):
                ptxas.append(path)
            elif name.endswith(".so") and path.is_file():
                natives.append(path)
    return sorted(ptxas), sorted(natives)


def codegen_key(memo_dir: Path | None = None) -> str:
    """Triton's code-generation identity, without libtriton.so's bytes where the version
    names them; memoized (in memory and under memo_dir) while no file's stat changes."""
    from .env import toolid

    root = triton_root()
    files, (tools, natives) = _sources(root), _tools(root)
    stamp = tuple((str(p), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
                  for p in files + tools + natives for st in [p.stat()])
    return toolid.memoized_by(stamp, f"triton codegen key {root}",
                              lambda: _compute_key(root, files, tools, natives), memo_dir)


def _compute_key(root: Path, files: list[Path], tools: list[Path], natives: list[Path]) -> str:
    from importlib import metadata

    from .env import toolid

    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    for ptxas in tools:
        digest.update(toolid.run_tool([str(ptxas), "--version"]).strip().encode())
    for native in _unvouched(root, natives):
        digest.update(b"native\0" + native.relative_to(root).as_posix().encode() + b"\0")
        digest.update(bytes.fromhex(toolid.memoized(native, "sha256", _sha256_file, None)))
    return f"{metadata.version('triton')}-abicache-codegen-{digest.hexdigest()}"


def _sha256_file(path: Path) -> str:
    from .store import blobs

    return blobs.hash_file(path)[0]


def _unvouched(root: Path, natives: list[Path]) -> list[Path]:
    """The native libraries Triton's version does not vouch for: all of them unless the
    distribution came from an index (no direct_url.json: not a source, editable or local
    install), and else those its RECORD does not name at their size, or written after it."""
    from importlib import metadata

    try:
        dist = metadata.distribution("triton")
    except metadata.PackageNotFoundError:
        return natives
    record = next((f for f in dist.files or () if f.name == "RECORD" and f.parent.name.endswith(".dist-info")), None)
    if record is None or dist.read_text("direct_url.json") is not None:
        return natives
    record_path = Path(dist.locate_file(record))
    try:
        written = record_path.stat().st_mtime_ns
        sizes = {row.rsplit(",", 2)[0]: row.rsplit(",", 1)[-1] for row in record_path.read_text().splitlines()}
    except (OSError, ValueError):
        return natives
    site = Path(dist.locate_file(""))
    out = []
    for native in natives:
        st = native.stat()
        named = sizes.get(native.relative_to(site).as_posix()) if native.is_relative_to(site) else None
        if named != str(st.st_size) or st.st_mtime_ns > written:
            out.append(native)
    return out


def install(cache: Cache | None = None) -> None:
    """Use abicache for Triton's cache and its key in this process."""
    import importlib

    try:
        cache_mod = importlib.import_module("triton.runtime.cache")
    except ImportError as exc:
        raise AbicacheError(f"this Triton has no cache plug-in interface abicache knows ({exc}); "
                            "abicache.triton supports Triton 3.2 and newer") from None
    base = getattr(cache_mod, "CacheManager", None)
    if base is None or not all(hasattr(base, name) for name in _KNOWN_CACHE_API):
        raise AbicacheError("this Triton's CacheManager lacks get_file/put/get_group/put_group; "
                            "abicache.triton does not know how to plug into it")
    global _cache
    _cache = cache
    memo_dir = (cache or default_cache()).store.layout.tools
    key = codegen_key(memo_dir)
    replaced = lambda: key  # noqa: E731  (Triton calls it with no arguments)
    for name in ("triton.runtime.cache", "triton.runtime.autotuner", "triton.compiler.compiler"):
        module = importlib.import_module(name)
        if hasattr(module, "triton_key"):
            module.triton_key = replaced
    from .frontends import triton_probes

    triton_probes.install(memo_dir, triton_root())
    _plug_in(cache_mod)


def _plug_in(cache_mod: Any) -> None:
    """Triton 3.4 and newer read the manager class from knobs.cache.manager_class;
    3.2 and 3.3 from $TRITON_CACHE_MANAGER, once per value, in get_cache_manager()
    (whose dump and override managers are the same class: CacheManager hands those
    to Triton's own FileCacheManager)."""
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(getattr(knobs, "cache", None), "manager_class"):
        knobs.cache.manager_class = CacheManager
        return
    if not hasattr(cache_mod, "get_cache_manager"):
        raise AbicacheError(f"Triton {getattr(triton, '__version__', '?')} has neither knobs.cache.manager_class "
                            "nor get_cache_manager(); abicache.triton supports Triton 3.2 and newer")
    os.environ["TRITON_CACHE_MANAGER"] = f"{__name__}:CacheManager"


_cache: Cache | None = None


def _store() -> Cache:
    """The cache install() was given; else $ABICACHE_DIR's; else, where the user
    pointed Triton's cache ($TRITON_CACHE_DIR), an abicache store there; else the
    default store. The target arch is part of Triton's key: trust it instead of
    this machine's GPU."""
    cache = _cache
    if cache is None:
        triton_dir = os.environ.get("TRITON_CACHE_DIR")
        if triton_dir and not os.environ.get("ABICACHE_DIR"):
            root = Path(triton_dir) / "abicache"
            cache = _in_triton_dir.get(root)
            if cache is None:
                cache = _in_triton_dir[root] = Cache(root)
        else:
            cache = default_cache()
    pinned = _pinned.get(id(cache))
    if pinned is None or pinned[0] is not cache:  # one view a cache: Triton makes a manager a lookup
        pinned = _pinned[id(cache)] = (cache, cache.pinned_by_key({"gpu.arch", "cuda.driver"}))
    return pinned[1]


_in_triton_dir: dict[Path, Cache] = {}
_pinned: dict[int, tuple[Cache, Cache]] = {}


class CacheManager:
    """Triton's CacheManager interface on the abicache store.

    Every put() is persisted at once, as Triton's FileCacheManager does: a lone
    put() (how Triton caches its compiled launcher and driver modules, and the
    autotuner its results) is found by the next process with get_file(). A
    kernel's files are also published together, as one entry, when put_group()
    names them, so get_group() is one lookup; identical bytes share one blob.
    The dump and override managers (TRITON_KERNEL_DUMP / TRITON_KERNEL_OVERRIDE)
    are directories for people to read and edit: Triton's own manager serves them.
    """

    def __new__(cls, key: str, override: bool = False, dump: bool = False) -> Any:
        if override or dump:
            from triton.runtime.cache import FileCacheManager

            return FileCacheManager(key, override=override, dump=dump)
        return super().__new__(cls)

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self.cache = _store()

    def _inputs(self, filename: str | None = None) -> dict[str, Any]:
        extra = {"triton_key": self.key}
        return {"extra": extra if filename is None else {**extra, "file": filename}}

    def get_file(self, filename: str) -> Optional[str]:
        memo = (os.fspath(self.cache.store.root), self.key, filename)
        found = _recall(memo)
        if found is not None:
            return found
        entry = self.cache.lookup(FILE_KIND, _kernel_name(filename), self._inputs(filename))
        if entry is None or filename not in entry.files:
            entry = self.cache.lookup(KIND, _kernel_name(filename), self._inputs())
        if entry is None or filename not in entry.files:
            return None
        return _remember(memo, str(entry.path / filename))

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        # As Triton's own manager: bytes as they are, anything else (text, MLIR modules, even a
        # bytearray) as its str().
        raw = data if isinstance(data, bytes) else str(data).encode("utf-8")

        def build(out: Path) -> None:
            (out / filename).write_bytes(raw)

        art = self.cache.get_or_build(FILE_KIND, _kernel_name(filename), self._inputs(filename), build)
        return str(art.path / filename)

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        entry = self.cache.lookup(KIND, _kernel_name(filename), self._inputs())
        if entry is None:
            return None
        # the entry holds the group's names that were files (as Triton's own manager answers
        # only those that exist); GROUP is in an entry of a group with none, or of an older abicache
        folder = os.fspath(entry.path) + os.sep
        return {name: folder + name for name in entry.files if name != GROUP}

    def put_group(self, filename: str, group: Dict[str, str]) -> str:
        """Publish the group's files (each already persisted by put()) as one entry;
        the caller's dict and the paths put() returned stay as they are."""
        files = {name: Path(path) for name, path in group.items() if Path(path).is_file()}
        names = sorted(group)

        def build(out: Path) -> None:
            for name, path in files.items():
                shutil.copyfile(path, out / name)
            if not files:  # an entry holds at least one file
                (out / GROUP).write_text(json.dumps(names))

        art = self.cache.get_or_build(KIND, _kernel_name(filename), self._inputs(), build)
        # Triton's own record of the group, as its manager writes it: what get_file("__grp__…")
        # gives a reader that opens it, and the path put_group returns.
        children = {name: str(art.path / name) for name in names if name in art.files}
        return self.put(json.dumps({"child_paths": children}), f"__grp__{filename}", binary=False)


#: get_file answers of this process (store, Triton key, file) -> (path, its witness). Triton asks
#: again and again for the same file (its launcher module, once per kernel): a repeat costs one
#: stat, as Triton's own manager's os.path.exists, and any change to the file (its removal by gc,
#: a write, a chmod: each moves the ctime) sends the lookup to the store again.
_answered: dict[tuple[str, ...], tuple[str, tuple[int, int, int, int]]] = {}


def _witness(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _recall(memo: tuple[str, ...]) -> str | None:
    got = _answered.get(memo)
    if got is None:
        return None
    try:
        if _witness(got[0]) == got[1]:
            return got[0]
    except OSError:
        pass
    _answered.pop(memo, None)
    return None


def _remember(memo: tuple[str, ...], path: str) -> str:
    try:
        _answered[memo] = (path, _witness(path))
    except OSError:
        pass  # gone already: not remembered, the caller still gets what the lookup found
    return path


class RemoteCacheBackend:
    """For users who keep Triton's own cache manager and want a fleet's shared cache:

        TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
        TRITON_REMOTE_CACHE_BACKEND=abicache.triton:RemoteCacheBackend
        ABICACHE_REMOTE=s3://bucket/prefix   (or redis://host:port/0?prefix=...)

    Each file Triton puts is an abicache entry, published to the remote tier
    (verified, signed where keys are set, bounded in size and time) and kept in
    the local store; get() is a local hit or a verified download. Triton's key
    is kept as Triton computes it. Without ABICACHE_REMOTE it is a local cache."""

    def __init__(self, key: str) -> None:
        self._files = CacheManager(key)

    def get(self, filenames: list[str]) -> Dict[str, bytes]:
        found = {}
        for filename in filenames:
            path = self._files.get_file(filename)
            if path is not None:
                found[filename] = Path(path).read_bytes()
        return found

    def put(self, filename: str, data: bytes) -> None:
        self._files.put(data, filename)


def _kernel_name(filename: str) -> str:
    stem = filename.removeprefix("__grp__").split(".")[0]
    return stem or "kernel"
