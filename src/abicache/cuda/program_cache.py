"""cuda.core's program cache, backed by abicache: one argument to switch.

    from cuda.core import Program, ProgramOptions
    from abicache.cuda.program_cache import ProgramCache

    cache = ProgramCache()                       # the default store (ABICACHE_DIR)
    obj = Program(src, "c++", ProgramOptions(arch="sm_90")).compile("cubin", cache=cache)

cuda.core (>= 1.2) derives the key (`make_program_cache_key`: the code, the
options, the target type, the NVRTC / linker versions) and hands the cache raw
bytes. abicache keeps each program as an entry of kind `cuda_core.program`
named after that key, so it gets what every entry gets:

  * requirements read from the binary (a cubin's SM, a PTX file's ISA and the
    driver it needs), checked against this machine on every lookup: a cubin
    copied from an sm_90 fleet to an sm_80 laptop is a miss, not a launch error;
  * a crash-proof publish (a reader sees a whole program or none) and a check
    on every hit (a changed byte is never returned: rebuilt instead);
  * the remote tier (ABICACHE_REMOTE) and its signatures, statistics, a size
    cap and gc.

`target` judges requirements for another machine (ProgramCache(target=
{"gpu.arch": "sm_90"})). Without it, they are judged for this one: a machine
without a GPU runs no GPU code and keeps what it compiles (a compile-only CI
job); a program that cannot run on this machine's GPUs is not kept (cuda.core
still returns it) and a warning says what to pass.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any, Mapping

from ..core.cache import Cache, default_cache
from ..errors import AbicacheWarning, BuildError, MissingExtraError

try:
    from cuda.core.utils import ProgramCacheResource  # the base class cuda.core checks `cache=` against
except ImportError:
    raise MissingExtraError("abicache.cuda.program_cache needs cuda.core 1.2 or later, which is not installed; "
                            "install it with: pip install 'abicache[cuda-core]'") from None
from ..store import counters

KIND = "cuda_core.program"


class ProgramCache(ProgramCacheResource):
    """A cuda.core ProgramCacheResource whose entries live in an abicache store."""

    def __init__(self, cache: Cache | None = None, *, target: Mapping[str, str | None] | None = None) -> None:
        base = cache or default_cache()
        self._cache = base.for_target(target) if target else base
        self._warned = False

    @property
    def cache(self) -> Cache:
        return self._cache

    def __getitem__(self, key: bytes | str) -> bytes:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        name, inputs = _entry(key)
        art = self._cache.lookup(KIND, name, inputs)
        if art is None:
            return default  # the miss is counted by the store that follows it (get_or_build)
        counters.count(self._cache.store, seconds_saved=art.manifest.build_seconds or 0.0,
                       **{"hits_remote" if art.origin == "remote" else "hits_local": 1})
        return art.file().read_bytes()

    def __setitem__(self, key: bytes | str, value: Any) -> None:
        from cuda.core.utils._program_cache._abc import _extract_bytes  # bytes of bytes or an ObjectCode

        data = _extract_bytes(value)
        name, inputs = _entry(key)
        filename = "program" + _suffix(data)
        try:
            self._cache.get_or_build(KIND, name, inputs, lambda out: (out / filename).write_bytes(data))
        except BuildError as exc:
            if "cannot be loaded here" not in str(exc):
                raise
            if not self._warned:
                self._warned = True
                warnings.warn(f"abicache: a cuda.core program was not cached: {exc.args[0]}. To cache programs "
                              "for another machine, pass its facts: ProgramCache(target={'gpu.arch': 'sm_90'})",
                              AbicacheWarning, stacklevel=2)

    def __delitem__(self, key: bytes | str) -> None:
        name, inputs = _entry(key)
        entry, _ = self._cache.key_for(KIND, name, self._cache_inputs(inputs))
        folders = list(self._cache.store.variant_dirs(KIND, entry))
        if not folders:
            raise KeyError(key)
        for folder in folders:
            self._cache.store.remove_tree(folder)

    def __len__(self) -> int:
        return sum(1 for _ in self._variant_dirs())

    def clear(self) -> None:
        for folder in list(self._variant_dirs()):
            self._cache.store.remove_tree(folder)

    def _variant_dirs(self) -> Any:
        self._cache.store.ensure()
        return self._cache.store.iter_kind(KIND)

    @staticmethod
    def _cache_inputs(inputs: Mapping[str, Any]) -> Any:
        from ..core.key import Inputs

        return Inputs.make(**inputs)


def _entry(key: bytes | str) -> tuple[str, dict[str, Any]]:
    """The entry's name and inputs for a cuda.core key (bytes, or str as UTF-8, as cuda.core says)."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"cache keys must be bytes or str, got {type(key).__name__}")
    digest = hashlib.sha256(bytes(key)).hexdigest()
    return f"program-{digest[:16]}", {"extra": {"cuda_core.key": digest}}


def _suffix(data: bytes) -> str:
    """The file's extension by its content, so tools (and the audit) know it."""
    if data.startswith(b"\x7fELF"):
        return ".cubin"
    head = data[:4096]
    if b".version" in head and b".target" in head:
        return ".ptx"
    return ".bin"

