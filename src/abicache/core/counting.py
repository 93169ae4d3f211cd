"""What the statistics count of each get_or_build (store/counters.py), and the size cap
applied after builds (ABICACHE_MAX_SIZE, store/gc.keep_under). A mixin of cache.Cache."""

from __future__ import annotations

from pathlib import Path

from typing import Any

from ..settings import config
from .artifact import Artifact
from ..errors import ConfigError, warn_once
from ..store import counters

#: entries the build engine asks for on a build's behalf (a unit's object, a precompiled header):
#: not counted in the statistics, which count what the user asked for
INTERNAL_KINDS = frozenset({"cc.object", "torch.pch"})


class Counting:
    store: Any

    def _count(self, kind: str, found: Artifact | None) -> None:
        """Statistics (store/counters.py) of what was asked for: not the unit objects and
        headers the build engine asks for on its own behalf. found None: a build failed."""
        if kind in INTERNAL_KINDS:
            return
        if found is None:
            counters.count(self.store, misses=1, errors=1)
        elif found.origin == "built":
            counters.count(self.store, misses=1, builds=1, build_seconds=found.manifest.build_seconds or 0.0)
            counters.flush(self.store)  # a miss writes anyway; a hit never does
            self._keep_under_cap(found.path, sum(f.size for f in found.manifest.files))
        else:
            counters.count(self.store, seconds_saved=found.manifest.build_seconds or 0.0,
                           **{"hits_remote" if found.origin == "remote" else "hits_local": 1})

    def _keep_under_cap(self, built: Path, added: int) -> None:
        """ABICACHE_MAX_SIZE: evict down to it after a build, before the call returns
        (store/gc.keep_under), never the entry just built (about to be loaded)."""
        try:
            cap = config.size("ABICACHE_MAX_SIZE")
        except ConfigError as exc:
            warn_once(f"abicache: ABICACHE_MAX_SIZE is ignored: {exc}")
            return
        if cap is not None:
            from ..store.gc import keep_under

            keep_under(self.store, cap, built, added)
