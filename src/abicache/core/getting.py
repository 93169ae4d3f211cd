"""get_or_build: key -> memo -> lookup -> lock -> re-check -> build -> audit -> publish;
and the rest an opened Cache does with its store (lookup, views, the fallback store,
explain). A mixin of the OpenCache that cache.py makes a Cache at its first use: a
process whose hits its hit records serve (hits/) never imports it.

The cache knows no compiler: a frontend describes the inputs and passes a
`build(out_dir)` callable; the cache decides whether to call it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ..settings import checked, config
from . import key as keys
from .artifact import Artifact, BuildResult, as_inputs  # noqa: F401  (Artifact, BuildResult: re-exported)
from .counting import INTERNAL_KINDS, error_kind
from ..env import Facts
from ..errors import BuildError, UsageError, unwritable_store
from .making import check_name, refuse_unmet
from ..values.requirements import Requirement, Requirements
from ..store import Store
from ..store import deps as depcheck, transient
from ..store.manifest import FILENAME as MANIFEST_FILE  # noqa: F401  (what a variant folder holds)
from ..settings.owners import group_setting

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping

if TYPE_CHECKING:
    from .artifact import Builder
    from .explain import Explanation
    from ..remote import RemoteSettings, Tier


class Getting:
    """get_or_build and the rest of cache.py's OpenCache (with Finding, SingleFlight, Making,
    Counting): it has what _open sets."""

    given_settings: tuple[str, ...]
    _find: Any
    _find_asked: Any
    _from_tiers: Any
    _fetch: Any
    _count: Any
    _miss: Any
    _build: Any
    _lookups: Any
    _log_miss: Any
    _default_audit: Any
    _unmet: Any

    def _open(self, root: str | os.PathLike[str] | None, settings: Mapping[str, Any]) -> None:
        """The store, the settings and the facts, as Cache(root, **settings) asked (cache.py)."""
        checked.check_once()  # every setting parsed here, hit or miss: one error naming each bad one
        get = settings.get
        self.root = Path(root) if root is not None else config.default_root()
        shared = get("shared")
        group = group_setting(config.text("ABICACHE_SHARED") if shared is None else shared)
        self.store = Store(self.root, group=group)
        facts = get("facts")
        self.facts = facts if facts is not None else Facts(memo_dir=self.store.layout.tools)
        self.verify_age = _seconds(get("verify_age"), "ABICACHE_VERIFY_AGE")
        self.touch_interval = _seconds(get("touch_interval"), "ABICACHE_TOUCH_INTERVAL")
        self.lock_timeout = _seconds(get("lock_timeout"), "ABICACHE_LOCK_TIMEOUT")
        self.audit = get("audit") or self._default_audit
        self.remote: Tier | None = _remote_tier(get("remote"))
        self.key_pins: frozenset[str] = frozenset()
        self._memo: dict[tuple[Any, ...], Artifact] = {}
        self._fallen: Getting | None = None  # where misses build if this store cannot be written
        self._fallback_of: Path | None = None  # the store this one stands in for
        self._as_opened = self._settings_now()

    def _settings_now(self) -> tuple[Any, ...]:
        return (self.store, self.facts, self.verify_age, self.touch_interval, self.audit, self.remote,
                self.key_pins, self._fallback_of)

    def as_opened(self) -> bool:
        """Whether nothing a lookup depends on was set on this Cache since it was opened from
        its settings alone (a hit record, hits/, stands only for such a Cache)."""
        return not self.given_settings and all(a is b for a, b in zip(self._as_opened, self._settings_now()))

    def _described_or_none(self, kind: str, name: str, inputs: keys.Inputs) -> dict[str, Any] | None:
        try:
            return self.key_for(kind, name, inputs)[1]
        except Exception:  # noqa: BLE001  a hint's detail: the error it is added to is the news
            return None

    def pinned_by_key(self, names: Iterable[str]) -> Getting:
        """The same store, trusting the key for these requirement names: a frontend
        whose key already encodes them (Triton's key includes the target arch)
        does not have them checked against this machine."""
        return self._view(key_pins=self.key_pins | frozenset(names))

    def _checked(self, requirements: Requirements) -> Requirements:
        if not self.key_pins:
            return requirements
        return Requirements(tuple(r for r in requirements if r.name not in self.key_pins))

    def for_target(self, overrides: Mapping[str, str | None]) -> Getting:
        """The same store, with requirements judged for another environment:
        a cross build (a cubin for sm_90 compiled on a machine without that GPU)."""
        return self._view(facts=self.facts.with_overrides(overrides))

    def unaudited(self, kind: str) -> Getting:
        """The same store for files only a linker reads (object files): no audit, no requirements
        (their key holds the compiler's identity and target); the audit summary names `kind`."""
        views = self.__dict__.setdefault("_unaudited", {})
        view = views.get(kind)
        if view is None:
            view = views[kind] = self._view(audit=lambda stage, paths, declared, facts: (Requirements(),
                                                                                          {"kind": kind}))
        return view

    def _view(self, **changes: Any) -> Getting:
        import copy

        view = copy.copy(self)
        view.__dict__.update(changes)
        view._memo = {}  # memo entries were judged under other facts or pins
        view._fallen = None  # a fallback store, too, judges with the view's facts and pins
        return view

    # ---- keys and lookup -------------------------------------------------

    def key_for(self, kind: str, name: str, inputs: keys.Inputs) -> tuple[str, dict[str, Any]]:
        described = inputs.describe(self.facts)
        return keys.compute(kind, name, described), described

    def lookup(
        self, kind: str, name: str, inputs: keys.Inputs | Mapping[str, Any], *, verify: str = "quick",
        bases: Mapping[str, str] | None = None,
    ) -> Artifact | None:
        """The entry for these inputs, if one holds here (never builds); bases
        as for get_or_build, for entries that recorded dependencies."""
        self.store.ensure()
        key, described = self.key_for(kind, name, as_inputs(inputs))
        bases = {"cwd": os.getcwd(), **(bases or {})}  # the base every build has (engine/tree.py)
        found = (self._find(kind, key, verify, bases) or self._find_asked(kind, name, described, verify, bases)
                 or self._from_tiers(kind, name, key, described, bases)
                 or self._fetch(kind, key, bases, None, name, described))
        if found is not None:
            return found
        from . import fallback  # a miss's, as every use of it

        other = self._fallback(fallback.unwritable(self.store.root))
        return None if other is None else other.lookup(kind, name, inputs, verify=verify, bases=bases)

    def _fallback(self, error: int | None) -> Getting | None:
        """The store a miss builds into where this one cannot be written (fallback.py):
        None for other errors (a full disk), or where this cache is a fallback itself."""
        from . import fallback

        if error not in fallback.READ_ONLY or self._fallback_of is not None:
            return None
        if self._fallen is None:
            root = fallback.root_for(self.root)
            if root is None:
                return None
            view = self._view(root=root, store=Store(root), _fallback_of=self.root, _fallen=None)
            if self.audit == self._default_audit:
                view.audit = view._default_audit  # its memo in the store it writes
            self._fallen = view
        fallback.say(error, self.root, self._fallen.root)
        return self._fallen


    # ---- get_or_build ----------------------------------------------------

    def get_or_build(
        self,
        kind: str,
        name: str,
        inputs: keys.Inputs | Mapping[str, Any],
        build: Builder,
        requires: Iterable[Requirement | str] | Requirements = (),
        *,
        verify: str = "quick",
        bases: Mapping[str, str] | None = None,
    ) -> Artifact:
        """The cached artifact for these inputs, building it once if needed.

        verify: "quick" (owners, modes, sizes and stamps; a file its stamp cannot
        vouch for is hashed) or "full" (sha256 of every file).
        bases: where the folders named by recorded dependencies are now
        ({"src": "/path/to/project/csrc", ...}); an entry whose dependencies
        no longer hold their bytes there is not a hit (see BuildResult).
        """
        if verify not in ("quick", "full"):
            raise UsageError(f"verify must be 'quick' or 'full', not {verify!r}")
        inputs = as_inputs(inputs)
        declared = Requirements.of(requires)
        bases = bases or {}
        memo_key = (kind, name, inputs, declared, verify, tuple(sorted(bases.items())) if bases else ())
        found = self._memo.get(memo_key)
        if found is not None and os.path.isdir(found.path) and found.current():
            self._count(kind, found)
            return found
        check_name(name)
        refuse_unmet(kind, name, self._checked(declared).unmet(self.facts))
        for attempt in range(transient.TRIES):
            try:
                found = self._get_or_build(kind, name, inputs, build, declared, verify, bases)
                break
            except KeyboardInterrupt:  # Ctrl-C: the build stopped and left nothing; its frames are noise
                raise KeyboardInterrupt from None
            except BuildError as exc:  # the compiler's message is the news: not twenty frames of ours
                self._count(kind, None, error_kind(exc))
                # no compiler: say which prebuilt variants exist of what was asked for (a unit's object
                # is the engine's: the library's call, further out, names the library)
                if exc.missing_tool and not exc.hint and kind not in INTERNAL_KINDS:
                    from .explain import no_fit

                    exc.hint = no_fit(kind, name, self.store, self._unmet, self._described_or_none(kind, name, inputs))
                raise exc.with_traceback(None) from None
            except OSError as exc:  # a failed try leaves nothing behind, as a killed build does
                if attempt + 1 == transient.TRIES or not transient.in_store(exc, self.store.root):
                    full = unwritable_store(exc, self.store.root)  # one line naming the store and the fix
                    other = self._fallback(full.errno) if full is not None else None
                    if other is not None:  # a read-only store: the miss builds into the user's own
                        rebound = getattr(build, "for_cache", None)  # the engine's objects go there too
                        found = other.get_or_build(kind, name, inputs, rebound(other) if rebound else build,
                                                   declared, verify=verify, bases=bases)
                        self._memo[memo_key] = found._replace(hit=True, origin="local")
                        return found
                    self._count(kind, None, error_kind(full or exc))
                    if full is not None:
                        raise full from None
                    raise
                transient.pause(attempt)
            except Exception as exc:
                self._count(kind, None, error_kind(exc))
                raise
        self._count(kind, found)
        if found.manifest.recorded:  # later calls ask whether what it read still holds
            if found.origin == "built":  # stamp the witnesses now: the next hit stats, and writes nothing
                self.store.deps_changed(found.path, found.manifest, bases)
            m = found.manifest
            recall = functools.partial(self.store.remembered_deps, found.path)  # the stamp just checked or written
            found = found._replace(bases=bases, watch=depcheck.Current(m.deps, bases, m.absent, m.env, m.system,
                                                                       recall))
        self._memo[memo_key] = found._replace(hit=True, origin="local")  # later calls in this process find it
        return found


    def _get_or_build(self, kind: str, name: str, inputs: keys.Inputs, build: Builder, declared: Requirements,
                      verify: str, bases: Mapping[str, str]) -> Artifact:
        self.store.ensure()
        key, described = self.key_for(kind, name, inputs)
        found = (self._find(kind, key, verify, bases) or self._find_asked(kind, name, described, verify, bases)
                 or self._from_tiers(kind, name, key, described, bases))
        if found is None:
            self._log_miss(kind, name, described, key, bases)
            lookups = self._lookups()
            local = lambda: self._find(kind, key, verify, bases)  # noqa: E731
            here = lambda: local() or self._fetch(kind, key, bases, lookups, name, described)  # noqa: E731
            found = self._miss(kind, name, key, local, here,
                               lambda: self._build(kind, name, key, described, build, declared))
        return found


    # ---- explaining ------------------------------------------------------

    def explain(
        self, kind: str, name: str, inputs: keys.Inputs | Mapping[str, Any] | None = None,
        bases: Mapping[str, str] | None = None,
    ) -> Explanation:
        """Why (kind, name) with these inputs hits or misses (with bases, also
        which recorded header changed); without inputs, the newest entry
        compared with the others."""
        from .explain import explain

        self.store.ensure()
        if inputs is None:
            return explain(self.store, self.facts, kind, name, None, None)
        key, described = self.key_for(kind, name, as_inputs(inputs))
        return explain(self.store, self.facts, kind, name, described, key, bases)


def _seconds(given: float | None, variable: str) -> float:
    return config.seconds(variable) if given is None else given


def _remote_tier(remote: str | RemoteSettings | bool | None) -> Tier | None:
    if remote is False or (remote is None and not config.text("ABICACHE_REMOTE")):
        return None  # the common case imports nothing of the remote tier
    from ..remote.tier import tier_from

    return tier_from(remote)
