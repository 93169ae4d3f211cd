"""Making an entry: build into a stage, audit what was built, assemble and sign its manifest,
publish it to the remote first (so a fleet loads the same bytes), then commit it here.
The Cache's build half (a mixin of cache.Cache)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..settings import config
from .. import __version__
from .artifact import Artifact, BuildResult, artifact_of
from ..errors import AbicacheError, BuildError, BuildForbiddenError, ManifestError, UsageError
from ..values.requirements import Requirement, Requirements
from ..store import Manifest, transient
from ..store.manifest import check_text, variant_id

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Sequence
    from .artifact import Builder


class Making:
    """Builds of cache.Cache: it has store, facts, remote, audit, usable, _checked, _verified..."""

    store: Any
    facts: Any
    remote: Any
    audit: Any

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

            raise BuildForbiddenError(forbidden(kind, name, self.store, self._unmet, self.facts, described))
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
                return artifact_of(vdir, manifest, origin)
            theirs = self._manifest(vdir)
            if origin == "built" and theirs is not None and _bytes(theirs) != _bytes(manifest):
                self._superseded(vdir, theirs, manifest, "the entry there")
                continue  # a build never hands back bytes other than the ones it made
            if theirs is not None and self.usable(theirs) and self._verified(vdir, theirs, "quick"):
                return artifact_of(vdir, theirs, origin)
            if theirs is not None and os.path.isdir(vdir):
                self._reject(vdir, "not usable here, yet filed under this variant")
        raise BuildError(f"could not publish {manifest.kind} {manifest.name!r}: {vdir} keeps coming back")

    def _share(self, stage: Path, manifest: Manifest) -> Artifact | None:
        """Publish to the remote before committing locally. If another machine
        published this variant first, the fleet uses its files: ours are dropped
        and its entry fetched (verified), so every machine loads the same bytes."""
        if self.remote is None or not self.remote.writable:
            return None
        from ..shipping import replicate

        winner = replicate.publish(self.remote, self.store, stage, manifest).winner
        if winner is None:
            return None
        if winner.files == manifest.files:  # a reproducible build: same bytes, keep the signed manifest
            return self._commit(stage, winner, "built")
        # Another machine built the same inputs at the same time and published first: the fleet
        # loads one build (its), and the disagreement is recorded.
        self._disagreement(winner, manifest, "the remote's", say=False)
        got = replicate.download(self.remote, self.store, winner)
        return artifact_of(got.vdir, got.manifest, "remote") if got else None

    def _superseded(self, vdir: Path, theirs: Manifest, ours: Manifest, where: str) -> None:
        """A variant of the same key and requirements whose files are other bytes than a build
        made just now: it is replaced by the new build, and the disagreement recorded."""
        self._disagreement(theirs, ours, where)
        self.store.remove_tree(vdir)

    def _disagreement(self, theirs: Manifest, ours: Manifest, where: str, say: bool = True) -> None:
        """Log (log/disagreements.jsonl) and say once: two builds of the same inputs made other
        bytes, so an input that neither the key nor the record holds changed, or the build is not
        reproducible (abicache check rebuilds to tell which)."""
        import json
        import warnings

        from ..errors import AbicacheWarning

        differ = sorted({f.path for f in theirs.files} ^ {f.path for f in ours.files}
                        | {f.path for f in ours.files if f not in theirs.files})
        self.store.log_event("disagreements", json.dumps({
            "time": time.time(), "kind": ours.kind, "name": ours.name, "key": ours.key, "variant": ours.variant,
            "where": where, "files": differ}))
        if not say:
            return
        warnings.warn(f"abicache: {ours.kind} {ours.name!r} was built again and made other bytes than {where} "
                      f"entry of the same inputs and requirements ({', '.join(differ)}): an input abicache does not "
                      "record changed, or the build is not reproducible. The new build is returned"
                      f"{' and kept' if where == 'the entry there' else ''}; `abicache check` rebuilds to tell which "
                      "(log/disagreements.jsonl)", AbicacheWarning, stacklevel=5)

    def _default_audit(self, stage: Path, paths: Sequence[str], declared: Requirements,
                       facts: Any) -> tuple[Requirements, dict[str, Any]]:
        from .. import audit  # the ELF reader and abi3info load only when something is built

        return audit.detect(stage, paths, declared, facts, memo_dir=self.store.layout.tools)


def _bytes(manifest: Manifest) -> list[tuple[str, str, bool]]:
    return sorted((f.path, f.sha256, f.executable) for f in manifest.files)


def refuse_unmet(kind: str, name: str, unmet: Sequence[Any]) -> None:
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


def check_name(name: str) -> None:
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
