"""Whether the observer runs in a store's compiles, as `abicache env` and `doctor` say it."""

from __future__ import annotations

from ..core.cache import Cache
from ..errors import AbicacheError


def status(cache: Cache) -> str:
    """"on (<path>)", or off and why."""
    from ..engine import observe

    try:
        cache.store.ensure(writing=True)
        return observe.status(cache.store.layout.tools, trusted=cache.store.trust.ok)
    except (OSError, AbicacheError) as exc:
        return f"off: the store cannot hold it ({exc})"


def default() -> str:
    """The same for the default store (doctor looks at other tools' caches, and names ours)."""
    try:
        return status(Cache(remote=False))
    except AbicacheError as exc:
        return f"off: no usable store ({exc})"
