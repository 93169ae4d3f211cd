"""Finding an entry that holds here: the local store's variants of a key, the entry of
what was asked for where a tool is absent (asked.py), the read-only stores (tiers.py)
and the remote; each checked (requirements, recorded files, owners, bytes) before use,
and a damaged one moved aside. The Cache's lookup half (a mixin of cache.Cache)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from ..settings import config
from .artifact import Artifact, artifact_of
from .counting import INTERNAL_KINDS
from ..errors import AbicacheWarning, ManifestError
from ..store import Manifest
from ..store import deps as depcheck, transient
from ..store.manifest import preference

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping, Sequence


class Finding:
    """Lookups of cache.Cache: it has store, facts, remote, verify_age, touch_interval, _checked."""

    store: Any
    facts: Any
    remote: Any
    verify_age: float
    touch_interval: float
    _checked: Callable[..., Any]

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
        """The variants the key's link names first (no listing of a folder of every key of
        its prefix: a hit does not grow with the store); the listing where none holds."""
        hinted = self.store.hinted_variant_dirs(kind, key)
        if hinted is not None:
            found = self._pick(hinted, verify, bases)
            if found is not None:
                return found
        return self._pick(self.store.variant_dirs(kind, key), verify, bases)

    def _pick(self, vdirs: Iterable[Path], verify: str, bases: Mapping[str, str],
              wanted: Callable[[Manifest], bool] = lambda m: True) -> Artifact | None:
        """The preferred of these variants that is wanted, holds here and verifies."""
        usable = []
        for vdir in vdirs:
            manifest = self._manifest(vdir)
            if manifest is not None and wanted(manifest) and self.usable(manifest):
                usable.append((vdir, manifest))
        if len(usable) > 1:  # ranking asks for the devices: only where there is a choice
            usable.sort(key=lambda vm: (vm[1].requirements.gpu_rank(self.facts), *preference(vm[1])), reverse=True)
        for vdir, manifest in usable:
            if manifest.recorded and self.store.deps_changed(vdir, manifest, bases) is not None:
                continue  # built from other bytes of a header: not a hit, not damage
            if self._verified(vdir, manifest, verify):
                self.store.touch(vdir, self.touch_interval)
                return artifact_of(vdir, manifest, "local")
        return None

    def _find_asked(self, kind: str, name: str, described: Mapping[str, Any], verify: str,
                    bases: Mapping[str, str]) -> Artifact | None:
        """Where a tool of the key is absent here, the entry of what was asked for (asked.py)."""
        from ..store import asked  # a miss's: a hit imports neither asked nor tiers

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
        from ..shipping import tiers

        for tier in tiers.tiers():
            got = tier.find(kind, name, key, described, self.usable, bases, self.facts, self.store)
            if got is not None:
                return artifact_of(*got, "tier")
        return None

    def _manifest(self, vdir: Path) -> Manifest | None:
        """A variant's manifest, or None (a bad one is quarantined)."""
        try:
            return self.store.read_manifest(vdir)
        except FileNotFoundError:
            if os.path.lexists(vdir) and not self.store.has_manifest(vdir):
                # publish and removal move whole folders: this never heals
                self._reject(vdir, "no manifest (neither manifest.json nor its names)")
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
        from ..store import asked
        from ..shipping import replicate, tiers

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
        return artifact_of(got.vdir, got.manifest, "remote") if got else None

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

    def _log_miss(self, kind: str, name: str, described: dict[str, Any], key: str,
                  bases: Mapping[str, str]) -> None:
        from .explain import explain, record_miss

        if kind not in INTERNAL_KINDS:
            record_miss(self.store, kind, name, key, described)  # for `abicache explain --last`
        if not config.flag("ABICACHE_EXPLAIN"):
            return
        import logging

        # With no logging configured, logging's last-resort handler prints to stderr.
        text = str(explain(self.store, self.facts, kind, name, described, key, bases))
        logging.getLogger("abicache").warning("abicache miss: %s", text)
