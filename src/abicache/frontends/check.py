"""abicache check: prove a cache correct on your own project.

Each entry checked is built again from scratch, with the call that made it
(its recipe, kept in the manifest), in the folder it was made from and into a
scratch store, and the fresh output is compared byte for byte with the
cached one:

- same: the cache serves what a fresh build makes;
- stale key: the bytes differ and the fresh build read an input the entry did
  not record, or with other bytes (a missed input: the entry kept hitting
  when it should have missed) — the inputs are named;
- not reproducible: the bytes differ, but every input the fresh build read is
  the entry's (timestamps, __DATE__, randomness in the build);
- skipped: no recipe (an entry of another frontend, or an internal object),
  or a lookup here would not take it (another key, or an input changed since:
  it would be rebuilt anyway).

ABICACHE_CHECK=N checks one hit in N in the background (off by default, see
cc.Plan.run) and appends each verdict to the store's log/check.jsonl.
"""

from __future__ import annotations

import json
import os
import random
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, NamedTuple, Sequence

from ..errors import AbicacheError, NotFound
from ..store import deps as depcheck

if TYPE_CHECKING:
    from ..core.cache import Artifact, Cache
    from ..store import Manifest

LOG = "check.jsonl"


class Verdict(NamedTuple):
    key: str
    kind: str
    name: str
    verdict: str  # "same", "stale key", "not reproducible", "skipped"
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return self._asdict()


def check_entries(cache: Cache, keys: Sequence[str] = (), sample: int | None = None,
                  rng: random.Random | None = None) -> list[Verdict]:
    """Check the entries named by key prefix, or a sample of those with a recipe (all without one)."""
    chosen = _chosen(cache, keys)
    if not keys:
        chosen = [(v, m) for v, m in chosen if _recipe(m) is not None]
        if sample is not None and sample < len(chosen):
            chosen = (rng or random.Random()).sample(chosen, sample)
    return [check_entry(cache, m) for _, m in chosen]


def _chosen(cache: Cache, keys: Sequence[str]) -> list[tuple[Path, Manifest]]:
    from ..errors import ManifestError

    found = []
    for vdir in cache.store.iter_variant_dirs():
        try:
            manifest = cache.store.read_manifest(vdir)
        except (OSError, ManifestError):
            continue
        if not keys or any(manifest.key.startswith(k) for k in keys):
            found.append((vdir, manifest))
    missing = [k for k in keys if not any(m.key.startswith(k) for _, m in found)]
    if missing:
        raise NotFound(f"no entry with a key starting {', '.join(missing)}; see 'abicache ls'")
    return found


def _recipe(manifest: Manifest) -> Mapping[str, Any] | None:
    recipe = manifest.builder.get("recipe")
    return recipe if isinstance(recipe, dict) and isinstance(recipe.get("cwd"), str) else None


def check_entry(cache: Cache, manifest: Manifest) -> Verdict:
    def verdict(what: str, detail: str = "") -> Verdict:
        return Verdict(manifest.key, manifest.kind, manifest.name, what, detail)

    recipe = _recipe(manifest)
    if recipe is None:
        return verdict("skipped", "no recipe: built by another frontend, or an internal object")
    from .. import cc

    try:
        with _inside(recipe["cwd"]):
            plan = cc.plan_of(recipe)
            key, _ = cache.key_for(plan.kind, plan.name, plan.inputs)
            if key != manifest.key:
                return verdict("skipped", "a build here has another key (the compiler, flags or sources changed)")
            changed, _ = depcheck.first_changed(manifest.deps, plan.bases, {}, manifest.absent, manifest.env,
                                                manifest.system)
            if changed is not None:
                return verdict("skipped", f"{_named(changed)} changed since: a lookup here rebuilds it anyway")
            fresh = _fresh(plan)
    except (AbicacheError, OSError) as exc:
        return verdict("skipped", f"could not build it again: {str(exc).splitlines()[0]}")
    if _files(fresh.manifest) == _files(manifest):
        return verdict("same")
    missed = _missed(manifest, fresh.manifest, plan.bases)
    if missed:
        return verdict("stale key", "read but not recorded (or with other bytes): " + ", ".join(missed[:5])
                       + (f" and {len(missed) - 5} more" if len(missed) > 5 else ""))
    differ = sorted({p for p, sha in _files(fresh.manifest).items() if _files(manifest).get(p) != sha})
    return verdict("not reproducible", "the same inputs made other bytes (timestamps, __DATE__, randomness) in "
                   + ", ".join(differ))


def _fresh(plan: Any) -> Artifact:
    from ..core.cache import Cache
    from ..engine import scratch as scratches

    with scratches.scratch() as scratch:  # swept by a later build where this process is killed
        fresh = plan.run(Cache(Path(scratch) / "store", remote=False, shared=False))
        return fresh._replace(path=Path("/nonexistent"))  # the files go with the scratch store; the manifest stays


def _files(manifest: Manifest) -> dict[str, str]:
    return {f.path: f.sha256 for f in manifest.files}


def _recorded(manifest: Manifest, bases: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for dep in manifest.deps:
        path = depcheck.resolve(dep, bases)
        if path is not None:
            out[path] = dep.sha256
    out.update({f"${name}": digest for name, digest in manifest.env})
    out.update({f"{group.folder}/*": group.sha256 for group in manifest.system})
    return out


def _missed(cached: Manifest, fresh: Manifest, bases: Mapping[str, str]) -> list[str]:
    had, now = _recorded(cached, bases), _recorded(fresh, bases)
    return sorted(path for path, sha in now.items() if had.get(path) != sha)


def _named(dep: Any) -> str:
    if dep.base == "env":
        return f"${dep.path}"
    return f"{dep.base}/{dep.path}" if dep.base != "abs" else dep.path


@contextmanager
def _inside(folder: str) -> Iterator[None]:
    """The recipe's working directory (relative sources and -I mean what they meant)."""
    here = os.getcwd()
    try:
        os.chdir(folder)
    except OSError as exc:
        raise AbicacheError(f"the folder it was built from, {folder}, is gone ({exc.strerror})") from None
    try:
        yield
    finally:
        os.chdir(here)


def log(cache: Cache, verdicts: Sequence[Verdict]) -> Path:
    cache.store.log_events(LOG.removesuffix(".jsonl"), [json.dumps(v.to_dict()) for v in verdicts])
    return cache.store.layout.log / LOG
