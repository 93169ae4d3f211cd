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
                   modules, which differ per Python version.

   It is safe because libtriton.so is built from the sources its version names:
   a release wheel's version says which, and a source build's version carries
   its git hash (`3.9.0+git1234abcd`). What Triton adds after triton_key() —
   the source hash, the backend hash (ptxas version and target), the options
   and the cache-invalidating environment variables — stays as Triton computes
   it. The result is memoized on disk by the stat of the hashed files and ptxas.

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
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

from .cache import Artifact, Cache, default_cache
from .errors import AbicacheError

KIND = "triton"
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


def _ptxas(root: Path) -> list[Path]:
    return sorted(p for p in (root / "backends").rglob("ptxas*") if p.is_file() and os.access(p, os.X_OK))


def codegen_key(memo_dir: Path | None = None) -> str:
    """Triton's code-generation identity, without libtriton.so's bytes; memoized
    (in memory and under memo_dir) while no hashed file's stat changes."""
    from .env import toolid

    root = triton_root()
    files, tools = _sources(root), _ptxas(root)
    stamp = tuple((str(p), st.st_size, st.st_mtime_ns, st.st_ino) for p in files + tools for st in [p.stat()])
    return toolid.memoized_by(stamp, f"triton codegen key {root}", lambda: _compute_key(root, files, tools),
                              memo_dir)


def _compute_key(root: Path, files: list[Path], tools: list[Path]) -> str:
    from importlib import metadata

    from .env import toolid

    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    for ptxas in tools:
        digest.update(toolid.run_tool([str(ptxas), "--version"]).strip().encode())
    return f"{metadata.version('triton')}-abicache-codegen-{digest.hexdigest()}"


def install(cache: Cache | None = None) -> None:
    """Use abicache for Triton's cache and its key in this process."""
    import importlib

    try:
        cache_mod = importlib.import_module("triton.runtime.cache")
        knobs = importlib.import_module("triton").knobs
    except (ImportError, AttributeError) as exc:
        raise AbicacheError(f"this Triton has no cache plug-in interface abicache knows ({exc}); "
                            "abicache.triton supports Triton 3.3 and newer") from None
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
    knobs.cache.manager_class = CacheManager


_cache: Cache | None = None


def _store() -> Cache:
    # The target arch is part of Triton's key: trust it instead of this machine's GPU.
    return (_cache or default_cache()).pinned_by_key({"gpu.arch", "cuda.driver"})


class CacheManager:
    """Triton's CacheManager interface on the abicache store."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        if override or dump:
            raise AbicacheError("abicache.triton.CacheManager serves Triton's cache, not its "
                                "override or dump directories")
        self.key = key
        self.cache = _store()
        self._staged: Dict[str, Path] = {}
        self._scratch: Optional[Path] = None

    def _inputs(self) -> dict[str, Any]:
        return {"extra": {"triton_key": self.key}}

    def _entry(self, name: str) -> Optional[Artifact]:
        return self.cache.lookup(KIND, name, self._inputs())

    def get_file(self, filename: str) -> Optional[str]:
        staged = self._staged.get(filename)
        if staged is not None:
            return str(staged)
        entry = self._entry(_kernel_name(filename))
        return str(entry.path / filename) if entry and filename in entry.files else None

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="abicache-triton-"))
        path = self._scratch / filename
        # As Triton's own manager: bytes as they are, anything else (text, MLIR modules) as str().
        raw = bytes(data) if isinstance(data, (bytes, bytearray, memoryview)) else str(data).encode("utf-8")
        path.write_bytes(raw)
        self._staged[filename] = path
        return str(path)

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        entry = self._entry(_kernel_name(filename))
        if entry is None or GROUP not in entry.files:
            return None
        names = json.loads((entry.path / GROUP).read_text())
        return {name: str(entry.path / name) for name in names if name in entry.files}

    def put_group(self, filename: str, group: Dict[str, str]) -> str:
        """Publish every file Triton wrote as one entry, then point `group` at it."""
        staged = dict(self._staged)
        names = sorted(group)

        def build(out: Path) -> None:
            for name, path in staged.items():
                shutil.copyfile(path, out / name)
            (out / GROUP).write_text(json.dumps(names))

        art = self.cache.get_or_build(KIND, _kernel_name(filename), self._inputs(), build)
        for name in list(group):
            if name in art.files:
                group[name] = str(art.path / name)  # Triton loads the kernel from these paths next
        self._cleanup()
        return str(art.path / GROUP)

    def _cleanup(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        self._scratch, self._staged = None, {}

    def __del__(self) -> None:
        self._cleanup()


def _kernel_name(filename: str) -> str:
    stem = re.sub(r"^__grp__", "", filename).split(".")[0]
    return stem or "kernel"
