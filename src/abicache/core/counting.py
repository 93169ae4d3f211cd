"""What the statistics count of each get_or_build (store/counters.py), and the size cap
applied after builds (ABICACHE_MAX_SIZE, store/gc.keep_under). A mixin of cache.Cache."""

from __future__ import annotations

from pathlib import Path


from ..settings import config
from .artifact import Artifact
from ..errors import BuildError, ConfigError, warn_once
from ..store import counters
from ..store.counters import by_kind
from ..store.manifest import uncached_reason

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any

def error_kind(exc: BaseException) -> str:
    """What `abicache stats` counts a failed call as."""
    from ..errors import BuildForbiddenError, LockTimeout, RemoteError, StoreUnwritableError

    if isinstance(exc, BuildForbiddenError):
        return "build not allowed"  # ABICACHE_BUILD=never, and no store had it
    if isinstance(exc, BuildError):
        return "no compiler" if exc.missing_tool else "build failed"
    for cls, name in ((StoreUnwritableError, "store unwritable"), (LockTimeout, "lock timeout"),
                      (RemoteError, "remote"), (ConfigError, "bad setting"), (OSError, "system error")):
        if isinstance(exc, cls):
            return name
    return "other"


#: entries the build engine asks for on a build's behalf (a unit's object, a precompiled header):
#: not counted in the statistics, which count what the user asked for
INTERNAL_KINDS = frozenset({"cc.object", "torch.pch"})


class Counting:
    store: Any

    def _count(self, kind: str, found: Artifact | None, error: str = "") -> None:
        """Statistics (store/counters.py) of what was asked for: not the unit objects and
        headers the build engine asks for on its own behalf. found None: the call failed
        (error: what kind of failure, errors.error_kind)."""
        if kind in INTERNAL_KINDS:
            return
        if found is None:
            counters.count(self.store, misses=1, errors=1, **{f"errors:{error or 'other'}": 1,
                                                               by_kind(kind, "misses"): 1, by_kind(kind, "errors"): 1})
        elif found.origin == "built":
            why = uncached_reason(found.manifest.deps)
            counters.count(self.store, misses=1, builds=1, build_seconds=found.manifest.build_seconds or 0.0,
                           **{by_kind(kind, "misses"): 1},
                           **({"uncacheable": 1, f"uncacheable:{why[0]}": 1, by_kind(kind, "uncacheable"): 1}
                              if why else {}))
            counters.flush(self.store)  # a miss writes anyway; a hit never does
            self._keep_under_cap(found.path, sum(f.size for f in found.manifest.files))
        else:
            hit = {"remote": "hits_remote", "tier": "hits_read_only"}.get(found.origin, "hits_local")
            counters.count(self.store, seconds_saved=found.manifest.build_seconds or 0.0,
                           **{hit: 1, by_kind(kind, "hits"): 1})

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
