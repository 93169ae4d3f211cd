"""Cache: what users make, and open at its first use.

`Cache(root)` costs nothing: the store, the settings and the facts are opened the first
time the cache is used (an attribute read, a method called), when the object becomes an
OpenCache (get_or_build and the rest: getting.py, finding.py, making.py, counting.py,
single_flight.py). A fresh process whose call is served
by its hit record (hits/) never opens it: it imports neither pathlib nor the store. A Cache
given any setting (`Cache(root, remote=...)`) opens at once, so that a bad one is an error
where it is written, and so does `Cache()`: the default store is where the settings say
when it is made.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping

    from .artifact import Artifact, Auditor, Builder
    from .key import Inputs
    from ..env import Facts
    from ..remote import RemoteSettings
    from ..values.requirements import Requirement, Requirements

#: names other modules import from here, defined where they live (resolved at first use)
_MOVED = {"Artifact": "artifact", "BuildResult": "artifact", "as_inputs": "artifact", "MANIFEST_FILE": "getting"}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    __import__(f"{__package__}.{module}")
    import sys

    return getattr(sys.modules[f"{__package__}.{module}"], name)


class Cache:
    """A local store plus the facts it checks requirements against.

    shared: the group whose members may write a shared store (ABICACHE_SHARED);
        None reads the environment, False keeps the store private.
    verify_age: seconds after which a hit re-hashes every file, stamped or not
        (ABICACHE_VERIFY_AGE); a file whose stamp no longer matches is re-hashed at once.
    touch_interval: seconds between last-use updates (ABICACHE_TOUCH_INTERVAL).
    lock_timeout: seconds to wait for another builder (ABICACHE_LOCK_TIMEOUT).
    audit: detects requirements from built files (default: abicache.audit.detect).
    remote: a shared store behind the local one: a URL (s3://..., redis://...),
        RemoteSettings, or False for none (default: ABICACHE_REMOTE).

    Its methods (get_or_build, lookup, find, explain, for_target, ...) are OpenCache's
    (getting.py and the mixins beside it): a Cache becomes one at its first use.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        facts: Facts | None = None,
        shared: str | bool | None = None,
        verify_age: float | None = None,
        touch_interval: float | None = None,
        lock_timeout: float | None = None,
        audit: Auditor | None = None,
        remote: str | RemoteSettings | bool | None = None,
    ) -> None:
        settings = {"facts": facts, "shared": shared, "verify_age": verify_age, "touch_interval": touch_interval,
                    "lock_timeout": lock_timeout, "audit": audit, "remote": remote}
        given = {name: value for name, value in settings.items() if value is not None}
        self.given_root = root  # as written: the in-process memos' name for the store
        self.given_settings = tuple(given)  # a hit record is written only for a Cache given none
        if given or root is None:  # Cache(): the default store is where the settings say now
            _open(self, root, given)
        else:
            self._unopened = True  # the hit records (hits/) serve only a Cache(root) not yet used

    def as_opened(self) -> bool:
        """Made as Cache(root), and nothing set on it since: what a hit record (hits/) may stand
        for. An opened one answers as getting.py's Getting.as_opened does."""
        if "_unopened" in self.__dict__:
            return len(self.__dict__) == 3  # given_root, given_settings, _unopened: nothing set by hand
        return super().as_opened()  # type: ignore[misc]  # the next class of an OpenCache: Getting

    def __getattr__(self, name: str) -> Any:
        # Called only for a name the object lacks: before its first use, every name of an
        # OpenCache. Never for dunders (copy and pickle probe for them) nor once opened.
        if name.startswith("__") or "_unopened" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        del self._unopened
        _open(self, self.given_root, {})
        return getattr(self, name)

    def __repr__(self) -> str:
        if "_unopened" in self.__dict__:
            return f"Cache({os.fspath(self.given_root)!r})"
        return f"Cache({str(self.root)!r})"


_opened: dict[type, type] = {}


def _open(cache: Cache, root: str | os.PathLike[str] | None, settings: Mapping[str, Any]) -> None:
    """Turn cache into an OpenCache (of its own subclass, if it is one) and open its store.
    An attribute set before the first use (`cache.audit = ...`) stays as it was set."""
    kind = type(cache)
    opened = _opened.get(kind)
    if opened is None:
        opened = _opened[kind] = _open_class(kind)
    before = dict(cache.__dict__)
    cache.__class__ = opened
    cache._open(root, settings)
    cache.__dict__.update(before)


def _open_class(kind: type) -> type:
    """A Cache class with the methods of an opened one, the mixins of this folder."""
    from .counting import Counting
    from .finding import Finding
    from .getting import Getting
    from .making import Making
    from .single_flight import SingleFlight

    class OpenCache(kind, Getting, Finding, SingleFlight, Making, Counting):  # type: ignore[valid-type,misc]
        __doc__ = Cache.__doc__

    OpenCache.__name__ = OpenCache.__qualname__ = "OpenCache" if kind is Cache else kind.__name__
    OpenCache.__module__ = kind.__module__
    return OpenCache


_default: dict[str, Cache] = {}


def default_cache() -> Cache:
    """The process-wide cache at ABICACHE_DIR (or the user cache dir)."""
    from ..settings import config

    root = config.default_root()
    cache = _default.get(os.fspath(root))
    if cache is None:
        cache = _default[os.fspath(root)] = Cache(root)
    return cache


def get_or_build(
    kind: str,
    name: str,
    inputs: Inputs | Mapping[str, Any],
    build: Builder,
    requires: Iterable[Requirement | str] | Requirements = (),
    cache: Cache | None = None,
    *,
    verify: str = "quick",
    bases: Mapping[str, str] | None = None,
) -> Artifact:
    """Module-level shortcut for (cache or default_cache()).get_or_build(...)."""
    return (cache or default_cache()).get_or_build(kind, name, inputs, build, requires, verify=verify,
                                                   bases=bases)
