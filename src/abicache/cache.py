"""get_or_build: key -> memo -> lookup -> lock -> re-check -> build -> audit -> publish.

The cache knows no compiler: a frontend describes the inputs and passes a
`build(out_dir)` callable; the cache decides whether to call it.
"""

from __future__ import annotations

import itertools
import os
import time
import warnings
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from . import asked, config, fallback, key as keys, tiers
from ._version import __version__
from .env import Facts
from .errors import (AbicacheError, AbicacheWarning, BuildError, BuildForbiddenError, ConfigError, ManifestError,
                     UsageError, unwritable_store)
from .requirements import Requirement, Requirements
from .store import Manifest, Store
from .store import counters, deps as depcheck, transient
from .store.manifest import FILENAME as MANIFEST_FILE, Absent, Dependency, System, check_text, preference, variant_id
from .store.trust import group_setting

if TYPE_CHECKING:
    from .explain import Explanation
    from .remote import RemoteSettings, Tier

# build(out_dir) writes the artifact's files; it may return requirements it
# learned while building (e.g. the torch version a stable op resolved to) as a
# Requirements or a list/tuple of requirement strings, or a BuildResult with
# requirements and the dependencies the compiler read. Any other return value
# (a lambda's write_text() count, say) is ignored.
Builder = Callable[[Path], Any]
#: waits for the fleet's lease before a miss builds without one (the lease changed hands each time)
_FLEET_ROUNDS = 3
#: entries the build engine asks for on a build's behalf (a unit's object, a precompiled header):
#: not counted in the statistics, which count what the user asked for
_INTERNAL_KINDS = frozenset({"cc.object", "torch.pch"})


class BuildResult(NamedTuple):
    """What a builder learned: requirements, and the files it read that the
    key does not cover (checked on every lookup, see store/deps.py)."""

    requirements: Requirements | Sequence[str] = ()
    deps: Sequence[Dependency] = ()
    absent: Sequence[Absent] = ()  # paths looked for and not found, which must stay missing
    env: Sequence[tuple[str, str]] = ()  # (variable read, sha256 of its value or "unset")
    system: Sequence[System] = ()  # files read in system folders, a group a folder
# (stage, files, declared, facts) -> (detected requirements, audit summary)
Auditor = Callable[[Path, Sequence[str], Requirements, Any], "tuple[Requirements, dict[str, Any]]"]


class Artifact(NamedTuple):
    key: str
    variant: str
    kind: str
    name: str
    path: Path  # the variant directory
    files: tuple[str, ...]
    requirements: Requirements
    manifest: Manifest
    hit: bool
    origin: str = "local"  # "local" (a hit here), "tier" (a read-only store's), "remote" (fetched), "built"
    bases: Mapping[str, str] = {}  # where its dependencies were found current
    watch: Any = None  # store.deps.Current over them

    def current(self) -> bool:
        """Whether the files it was compiled from (its dependencies) still hold
        the bytes it was built from; microseconds once asked (store/watch.py)."""
        return not self.manifest.recorded or (self.watch is not None and self.watch())

    def file(self, name: str | None = None) -> Path:
        """The path of one file; without a name, the only file (or an error)."""
        if name is None:
            if len(self.files) != 1:
                raise AbicacheError(f"{self.name} has {len(self.files)} files; name the one you want")
            name = self.files[0]
        if name not in self.files:
            raise AbicacheError(f"{self.name} has no file {name!r}; it has {', '.join(self.files)}")
        return self.path / name


def _artifact(vdir: Path, manifest: Manifest, origin: str) -> Artifact:
    return Artifact(
        key=manifest.key,
        variant=manifest.variant,
        kind=manifest.kind,
        name=manifest.name,
        path=vdir,
        files=tuple(f.path for f in manifest.files),
        requirements=manifest.requirements,
        manifest=manifest,
        hit=origin != "built",
        origin=origin,
    )


def _as_inputs(inputs: keys.Inputs | Mapping[str, Any]) -> keys.Inputs:
    if isinstance(inputs, keys.Inputs):
        return inputs
    return keys.Inputs.make(**inputs)


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
        self.root = Path(root) if root is not None else config.default_root()
        group = group_setting(config.text("ABICACHE_SHARED") if shared is None else shared)
        self.store = Store(self.root, group=group)
        self.facts = facts if facts is not None else Facts(memo_dir=self.store.layout.tools)
        self.verify_age = config.seconds("ABICACHE_VERIFY_AGE") if verify_age is None else verify_age
        self.touch_interval = (
            config.seconds("ABICACHE_TOUCH_INTERVAL") if touch_interval is None else touch_interval
        )
        self.lock_timeout = (
            config.seconds("ABICACHE_LOCK_TIMEOUT") if lock_timeout is None else lock_timeout
        )
        self.audit = audit or self._default_audit
        self.remote: Tier | None = _remote_tier(remote)
        self.key_pins: frozenset[str] = frozenset()
        self._memo: dict[tuple[Any, ...], Artifact] = {}
        self._fallen: Cache | None = None  # where misses build if this store cannot be written
        self._fallback_of: Path | None = None  # the store this one stands in for

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r})"

    def pinned_by_key(self, names: Iterable[str]) -> Cache:
        """The same store, trusting the key for these requirement names: a frontend
        whose key already encodes them (Triton's key includes the target arch)
        does not have them checked against this machine."""
        return self._view(key_pins=self.key_pins | frozenset(names))

    def _checked(self, requirements: Requirements) -> Requirements:
        if not self.key_pins:
            return requirements
        return Requirements(tuple(r for r in requirements if r.name not in self.key_pins))

    def for_target(self, overrides: Mapping[str, str | None]) -> Cache:
        """The same store, with requirements judged for another environment:
        a cross build (a cubin for sm_90 compiled on a machine without that GPU)."""
        return self._view(facts=self.facts.with_overrides(overrides))

    def _view(self, **changes: Any) -> Cache:
        import copy

        view = copy.copy(self)
        view.__dict__.update(changes)
        view._memo = {}  # memo entries were judged under other facts or pins
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
        key, described = self.key_for(kind, name, _as_inputs(inputs))
        bases = {"cwd": os.getcwd(), **(bases or {})}  # the base every build has (engine/tree.py)
        found = (self._find(kind, key, verify, bases) or self._find_asked(kind, name, described, verify, bases)
                 or self._from_tiers(kind, name, key, described, bases)
                 or self._fetch(kind, key, bases, None, name, described))
        other = self._fallback(fallback.unwritable(self.store.root)) if found is None else None
        return found if other is None else other.lookup(kind, name, inputs, verify=verify, bases=bases)

    def _fallback(self, error: int | None) -> Cache | None:
        """The store a miss builds into where this one cannot be written (fallback.py):
        None for other errors (a full disk), or where this cache is a fallback itself."""
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

    def _find(self, kind: str, key: str, verify: str, bases: Mapping[str, str] = {}) -> Artifact | None:
        """The local entry that holds here; a lookup that keeps meeting a
        shared filesystem's transient errors (store/transient.py) is a miss."""
        for attempt in range(transient.TRIES):
            try:
                return self._find_once(kind, key, verify, bases)
            except OSError as exc:
                if not transient.in_store(exc, self.store.root):
                    raise
                transient.pause(attempt)
        return None

    def _find_once(self, kind: str, key: str, verify: str, bases: Mapping[str, str]) -> Artifact | None:
        return self._pick(self.store.variant_dirs(kind, key), verify, bases)

    def _pick(self, vdirs: Iterable[Path], verify: str, bases: Mapping[str, str],
              wanted: Callable[[Manifest], bool] = lambda m: True) -> Artifact | None:
        """The preferred of these variants that is wanted, holds here and verifies."""
        usable = []
        for vdir in vdirs:
            manifest = self._manifest(vdir)
            if manifest is not None and wanted(manifest) and self.usable(manifest):
                usable.append((vdir, manifest))
        usable.sort(key=lambda vm: (vm[1].requirements.gpu_rank(self.facts), *preference(vm[1])), reverse=True)
        for vdir, manifest in usable:
            if manifest.recorded and self.store.deps_changed(vdir, manifest, bases) is not None:
                continue  # built from other bytes of a header: not a hit, not damage
            if self._verified(vdir, manifest, verify):
                self.store.touch(vdir, self.touch_interval)
                return _artifact(vdir, manifest, "local")
        return None

    def _find_asked(self, kind: str, name: str, described: Mapping[str, Any], verify: str,
                    bases: Mapping[str, str]) -> Artifact | None:
        """Where a tool of the key is absent here, the entry of what was asked for (asked.py)."""
        if not asked.tools_absent(described):
            return None
        want = asked.asked(described)
        return self._pick(asked.candidates(self.store, kind, name), verify, bases,
                          lambda manifest: asked.asked(manifest.inputs) == want)

    def _from_tiers(self, kind: str, name: str, key: str, described: Mapping[str, Any],
                    bases: Mapping[str, str]) -> Artifact | None:
        """The entry a read-only store (a package's prebuilt kernels) holds for what was asked (tiers.py);
        none where ABICACHE_BUILD=always."""
        if config.build_mode() == "always":
            return None
        for tier in tiers.tiers():
            got = tier.find(kind, name, key, described, self.usable, bases, self.facts, self.store)
            if got is not None:
                return _artifact(*got, "tier")
        return None

    def _manifest(self, vdir: Path) -> Manifest | None:
        """A variant's manifest, or None (a bad one is quarantined)."""
        try:
            return self.store.read_manifest(vdir)
        except FileNotFoundError:
            if os.path.lexists(vdir) and not os.path.lexists(vdir / MANIFEST_FILE):
                # publish and removal move whole folders: this never heals
                self._reject(vdir, "no manifest.json")
                return None
            if os.path.lexists(vdir):
                raise  # there after all: a shared filesystem's passing error, tried again
            return None  # removed by gc or quarantined by another process just now
        except OSError as exc:
            if transient.in_store(exc, self.store.root):
                raise  # tried again (_find); never a reason to quarantine
            self._reject(vdir, f"unreadable manifest: {exc}")
            return None
        except ManifestError as exc:
            self._reject(vdir, f"unreadable manifest: {exc}")
            return None

    def find(self, kind: str, key: str) -> Artifact | None:
        """The local entry for a key that holds here, if any (no remote, no build)."""
        self.store.ensure()
        return self._find(kind, key, "quick")

    def _unmet(self, manifest: Manifest) -> list[Any]:
        return self._checked(manifest.requirements).unmet(self.facts)

    def usable(self, manifest: Manifest) -> bool:
        """Whether an entry's requirements hold in this cache's environment."""
        return self._checked(manifest.requirements).satisfied_by(self.facts)

    def _fetch(self, kind: str, key: str, bases: Mapping[str, str] = {}, lookups: Any = None,
               name: str | None = None, described: Mapping[str, Any] | None = None) -> Artifact | None:
        """The remote's entry for this key, verified into the local store (lookups: what the
        earlier lookups of this miss read, replicate.Lookups). With name and described: where
        no tool of the key is here, or the remote is only read (a channel prebuilt entries are
        shipped through), else the entry of what was asked for, as a read-only store's (tiers.py)."""
        if self.remote is None or self.remote.down or config.build_mode() == "always":
            return None
        from . import replicate

        def current(manifest: Manifest) -> bool:
            return self.usable(manifest) and depcheck.first_changed(manifest.deps, bases, {}, manifest.absent,
                                                                    manifest.env, manifest.system)[0] is None

        rank = lambda manifest: manifest.requirements.gpu_rank(self.facts)  # noqa: E731
        got = replicate.fetch(self.remote, self.store, kind, key, current, lookups, rank)
        if got is None and name is not None and described is not None and (
                asked.tools_absent(described) or self.remote.settings.mode == "read"):
            want = asked.asked(described)
            got = replicate.fetch_asked(self.remote, self.store, kind, name, key, lambda m: self.usable(m) and (
                asked.asked(m.inputs) == want and tiers.project_files_hold(m, bases)), lookups, rank)
        return _artifact(got.vdir, got.manifest, "remote") if got else None

    def _verified(self, vdir: Path, manifest: Manifest, verify: str) -> bool:
        found = self.store.check(vdir, manifest, full=verify == "full", max_age=self.verify_age)
        if found is not None and ": sha256 " not in found[0]:
            # Not a wrong byte: a missing file or folder may be a shared filesystem's passing
            # error (store/transient.py). Quarantine only what a second look confirms.
            transient.pause(0)
            found = self.store.check(vdir, manifest, full=verify == "full", max_age=self.verify_age)
        if found is not None:
            reason, damaged, offender = found
            self._reject(offender, reason, damaged)
            return False
        return True

    def _reject(self, vdir: Path, reason: str, damaged: Sequence[str] = ()) -> None:
        where = self.store.quarantine(vdir, reason, damaged)
        if where is not None:
            warnings.warn(
                f"abicache: quarantined {vdir} ({reason}); it will be rebuilt. Moved to {where}",
                AbicacheWarning,
                stacklevel=4,
            )

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
        inputs = _as_inputs(inputs)
        declared = Requirements.of(requires)
        bases = bases or {}
        memo_key = (kind, name, inputs, declared, verify, tuple(sorted(bases.items())) if bases else ())
        found = self._memo.get(memo_key)
        if found is not None and os.path.isdir(found.path) and found.current():
            self._count(kind, found)
            return found
        _check_name(name)
        _refuse_unmet(kind, name, self._checked(declared).unmet(self.facts))
        for attempt in range(transient.TRIES):
            try:
                found = self._get_or_build(kind, name, inputs, build, declared, verify, bases)
                break
            except KeyboardInterrupt:  # Ctrl-C: the build stopped and left nothing; its frames are noise
                raise KeyboardInterrupt from None
            except BuildError as exc:  # the compiler's message is the news: not twenty frames of ours
                self._count(kind, None)
                if exc.missing_tool and not exc.hint:  # no compiler: say which prebuilt variants exist
                    from .explain import no_fit

                    exc.hint = no_fit(kind, name, self.store, self._unmet)
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
                    self._count(kind, None)
                    if full is not None:
                        raise full from None
                    raise
                transient.pause(attempt)
            except Exception:
                self._count(kind, None)
                raise
        self._count(kind, found)
        if found.manifest.recorded:  # later calls ask whether what it read still holds
            if found.origin == "built":  # stamp the witnesses now: the next hit stats, and writes nothing
                self.store.deps_changed(found.path, found.manifest, bases)
            m = found.manifest
            found = found._replace(bases=bases, watch=depcheck.Current(m.deps, bases, m.absent, m.env, m.system))
        self._memo[memo_key] = found._replace(hit=True, origin="local")  # later calls in this process find it
        return found

    def _count(self, kind: str, found: Artifact | None) -> None:
        """Statistics (store/counters.py) of what was asked for: not the unit objects and
        headers the build engine asks for on its own behalf. found None: a build failed."""
        if kind in _INTERNAL_KINDS:
            return
        if found is None:
            counters.count(self.store, misses=1, errors=1)
        elif found.origin == "built":
            counters.count(self.store, misses=1, builds=1, build_seconds=found.manifest.build_seconds or 0.0)
            counters.flush(self.store)  # a miss writes anyway; a hit never does
            self._keep_under_cap()
        else:
            counters.count(self.store, seconds_saved=found.manifest.build_seconds or 0.0,
                           **{"hits_remote" if found.origin == "remote" else "hits_local": 1})

    def _keep_under_cap(self) -> None:
        """ABICACHE_MAX_SIZE: evict down to it after builds (store/gc.keep_under: amortised)."""
        try:
            cap = config.size("ABICACHE_MAX_SIZE")
        except ConfigError as exc:
            _warn_once(f"abicache: ABICACHE_MAX_SIZE is ignored: {exc}")
            return
        if cap is not None:
            from .store.gc import keep_under

            keep_under(self.store, cap)

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

    def _miss(self, kind: str, name: str, key: str, local: Callable[[], Artifact | None],
              here: Callable[[], Artifact | None], make: Callable[[], Artifact]) -> Artifact:
        """here() (this store, then the remote) once another process or machine has it,
        else make() under the key's local lock and, with a remote, the fleet's lease."""
        from . import progress
        from .store.lock import key_lock  # only on a miss

        lock = self.store.layout.lock_file(key)
        self.store.make_dir(lock.parent)
        locked = lambda: key_lock(lock, f"{kind} {name}", self.lock_timeout, progress.note,  # noqa: E731
                                  self.store.trust.file_mode)
        fleet = self._fleet()
        if fleet is None:
            with locked():
                return here() or make()  # another process may have built it meanwhile
        what, known = f"{kind} {name}", self._known_seconds(kind, name)
        machine = fleet.machine_id(str(self.store.root))
        for _ in range(_FLEET_ROUNDS):
            # Another machine may be building it: wait for its upload holding no local
            # lock, so this machine's other processes wait beside us, not behind us.
            outcome = fleet.wait(self.remote, kind, key, what, here, known, self.lock_timeout, progress.note,
                                 machine)
            if outcome.found is not None:
                return outcome.found  # type: ignore[no-any-return]
            with locked():  # the remote was looked at just now (the wait), and is again once the lease is ours
                found = local() or fleet.build(self.remote, kind, key, what, here, make, outcome, known, machine)
            if found is not None:
                return found  # type: ignore[no-any-return]
        with locked():
            return here() or make()  # the lease changed hands every round: build without one

    def _lookups(self) -> Any:
        """One miss's remote lookups share their bounds (replicate.Lookups); None without a remote."""
        if self.remote is None or self.remote.down:
            return None
        from .replicate import Lookups

        return Lookups(self.remote.settings.lookup_bytes, self.remote.settings.max_variants)

    def _fleet(self) -> Any:
        """remote/lease.py where this cache has a remote up and leases on, else None."""
        if self.remote is None or self.remote.down or self.remote.settings.lease <= 0:
            return None
        from .remote import lease

        return lease

    def _known_seconds(self, kind: str, name: str) -> float:
        """How long this name took to build here last (any key): it bounds how long
        a machine waits for another's build of it (remote/lease.py)."""
        seconds = 0.0
        for vdir in itertools.islice(self.store.iter_name_variants(kind, name), 8):
            with suppress(OSError, ManifestError):
                seconds = max(seconds, self.store.read_manifest(vdir).build_seconds or 0.0)
        return seconds

    def _build(
        self,
        kind: str,
        name: str,
        key: str,
        described: dict[str, Any],
        build: Builder,
        declared: Requirements,
    ) -> Artifact:
        if config.build_mode() == "never":
            from .explain import forbidden

            raise BuildForbiddenError(forbidden(kind, name, self.store, self._unmet, self.facts))
        with self.store.stage() as stage:
            start = time.perf_counter()
            try:
                learned = build(stage)
            except OSError as exc:
                transient.mark_not_ours(exc)  # the builder's own failure is raised, never retried
                raise
            seconds = time.perf_counter() - start
            declared = declared | _learned(learned)
            found_deps = tuple(sorted(set(learned.deps))) if isinstance(learned, BuildResult) else ()
            absent = tuple(sorted(set(learned.absent))) if isinstance(learned, BuildResult) else ()
            env = tuple(sorted(set(learned.env))) if isinstance(learned, BuildResult) else ()
            system = tuple(sorted(set(learned.system))) if isinstance(learned, BuildResult) else ()
            paths = self.store.collect(stage)
            try:
                detected, summary = self.audit(stage, paths, declared, self.facts)
            except AbicacheError as exc:
                passing = transient.underlying(exc, self.store.root)
                if passing is not None:
                    raise passing from exc  # the store's file was busy or stale, not the build wrong
                raise
            reqs = declared | detected
            unmet = self._checked(reqs).unmet(self.facts)
            if unmet:
                raise BuildError(
                    f"{kind} {name!r} was built, but cannot be loaded here: "
                    + "; ".join(str(u) for u in unmet)
                )
            manifest = Manifest(
                key=key,
                variant=variant_id(reqs, found_deps, absent, env, system),
                kind=kind,
                name=name,
                files=self.store.ingest(stage, paths),
                requirements=reqs,
                declared=declared,
                detected=detected,
                inputs=described,
                facts=self.facts.snapshot(),
                audit=summary,
                builder=_builder_record(build),
                abicache_version=__version__,
                created=time.time(),
                build_seconds=round(seconds, 6),
                deps=found_deps,
                absent=absent,
                env=env,
                system=system,
            )
            adopted = self._share(stage, manifest)
            if adopted is not None:
                return adopted
            return self._commit(stage, manifest, "built")

    def _commit(self, stage: Path, manifest: Manifest, origin: str) -> Artifact:
        """Commit; if another process committed this variant first, its entry
        is used only after the same checks as any hit (else it is quarantined
        and ours takes its place)."""
        for _ in range(3):
            vdir, won = self.store.commit(stage, manifest)
            if won:
                return _artifact(vdir, manifest, origin)
            theirs = self._manifest(vdir)
            if theirs is not None and self.usable(theirs) and self._verified(vdir, theirs, "quick"):
                return _artifact(vdir, theirs, origin)
            if theirs is not None and os.path.isdir(vdir):
                self._reject(vdir, "not usable here, yet filed under this variant")
        raise BuildError(f"could not publish {manifest.kind} {manifest.name!r}: {vdir} keeps coming back")

    def _share(self, stage: Path, manifest: Manifest) -> Artifact | None:
        """Publish to the remote before committing locally. If another machine
        published this variant first, the fleet uses its files: ours are dropped
        and its entry fetched (verified), so every machine loads the same bytes."""
        if self.remote is None or not self.remote.writable:
            return None
        from . import replicate

        winner = replicate.publish(self.remote, self.store, stage, manifest).winner
        if winner is None:
            return None
        if winner.files == manifest.files:  # a reproducible build: same bytes, keep the signed manifest
            return self._commit(stage, winner, "built")
        got = replicate.download(self.remote, self.store, winner)
        return _artifact(got.vdir, got.manifest, "remote") if got else None

    def _default_audit(self, stage: Path, paths: Sequence[str], declared: Requirements,
                       facts: Any) -> tuple[Requirements, dict[str, Any]]:
        from . import audit  # the ELF reader and abi3info load only when something is built

        return audit.detect(stage, paths, declared, facts, memo_dir=self.store.layout.tools)

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
        key, described = self.key_for(kind, name, _as_inputs(inputs))
        return explain(self.store, self.facts, kind, name, described, key, bases)

    def _log_miss(self, kind: str, name: str, described: dict[str, Any], key: str,
                  bases: Mapping[str, str]) -> None:
        from .explain import explain, record_miss

        if kind not in _INTERNAL_KINDS:
            record_miss(self.store, kind, name, key, described)  # for `abicache explain --last`
        if not config.flag("ABICACHE_EXPLAIN"):
            return
        import logging

        # With no logging configured, logging's last-resort handler prints to stderr.
        text = str(explain(self.store, self.facts, kind, name, described, key, bases))
        logging.getLogger("abicache").warning("abicache miss: %s", text)


def _remote_tier(remote: str | RemoteSettings | bool | None) -> Tier | None:
    if remote is False or (remote is None and not config.text("ABICACHE_REMOTE")):
        return None  # the common case imports nothing of the remote tier
    from .remote import RemoteSettings, tier_for

    if remote is None or remote is True:
        try:
            settings = RemoteSettings.from_env()
        except ConfigError as exc:  # a bad setting in the environment must not stop local hits
            _warn_once(f"abicache: ABICACHE_REMOTE is ignored, local cache only: {exc}")
            return None
    elif isinstance(remote, str):
        settings = RemoteSettings.from_env(remote)
    else:
        settings = remote
    return tier_for(settings) if settings is not None else None


def _refuse_unmet(kind: str, name: str, unmet: Sequence[Any]) -> None:
    """A declared requirement that does not hold here: nothing built could load, so build nothing."""
    if not unmet:
        return
    example = {u.requirement.name: _satisfying(u.requirement) for u in unmet}
    raise BuildError(f"{kind} {name!r} requires what this environment lacks, so nothing was built: "
                     + "; ".join(str(u) for u in unmet)
                     + f". To build it for another machine, use its facts: Cache().for_target({example}).")


def _satisfying(requirement: Requirement) -> str:
    """A fact value that meets a requirement, for the hint: the device that runs a GPU target
    (sm_90a and compute_90 -> sm_90), the floor of a minimum, the first of a set."""
    first = requirement.values[0]
    if requirement.op == "~=" and first.startswith(("sm_", "compute_")):
        return "sm_" + first.split("_", 1)[1].rstrip("af")
    return first.split(":")[0] if requirement.op == "~=" else first


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, AbicacheWarning, stacklevel=4)


def _learned(returned: Any) -> Requirements:
    """What a builder declared by returning it: a Requirements, or a list or
    tuple of requirement strings. Anything else (a write_text() count, a
    tuple of other things) is not a declaration and is ignored."""
    if isinstance(returned, BuildResult):
        returned = returned.requirements
    if isinstance(returned, Requirements):
        return returned
    if isinstance(returned, (list, tuple)) and returned and all(isinstance(r, (str, Requirement)) for r in returned):
        return Requirements.of(returned)
    return Requirements()


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 1024:
        raise UsageError(f"artifact name {name!r} must be a non-empty string of at most 1024 characters")
    try:
        check_text(name, "artifact name")
    except ManifestError as exc:
        raise UsageError(str(exc)) from None


def _builder_record(build: Builder) -> dict[str, Any]:
    """Who built it, and how to make the same call again where the frontend says (abicache check)."""
    recipe = getattr(build, "recipe", None)
    return {"callable": _qualname(build), **({"recipe": recipe} if isinstance(recipe, dict) else {})}


def _qualname(build: Builder) -> str:
    module = getattr(build, "__module__", "") or ""
    return f"{module}.{getattr(build, '__qualname__', type(build).__name__)}".lstrip(".")


_default: dict[Path, Cache] = {}


def default_cache() -> Cache:
    """The process-wide cache at ABICACHE_DIR (or the user cache dir)."""
    root = config.default_root()
    cache = _default.get(root)
    if cache is None:
        cache = _default[root] = Cache(root)
    return cache


def get_or_build(
    kind: str,
    name: str,
    inputs: keys.Inputs | Mapping[str, Any],
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
