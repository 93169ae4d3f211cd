"""Why a lookup missed: the nearest entries for the same kind and name, and
exactly which inputs or facts differ."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from ..shipping import tiers
from ..errors import ManifestError
from ..store import Manifest, Store
from ..store.local import children

if TYPE_CHECKING:
    from ..values.requirements import FactSource


@dataclass(frozen=True)
class Difference:
    what: str  # "flags", "sources.x.c", "tools.compiler.cxx", "requirement"
    entry: str  # in the cached entry
    wanted: str  # in this lookup / environment

    def __str__(self) -> str:
        return f"{self.what}: {self.entry} -> {self.wanted}"


@dataclass(frozen=True)
class Candidate:
    manifest: Manifest
    differences: tuple[Difference, ...]


@dataclass(frozen=True)
class Explanation:
    kind: str
    name: str
    key: str | None
    hit: bool
    candidates: tuple[Candidate, ...]
    #: a past miss: how many entries of its kind and name the cache held then (None: unknown)
    there_then: int | None = None

    def lines(self) -> list[str]:
        head = f"{self.kind} {self.name!r}: " + ("hit" if self.hit else "miss")
        if self.key:
            head += f" (key {self.key[:16]})"
        out = [head]
        if not self.candidates and self.there_then:
            one = self.there_then == 1
            out.append(f"  {self.there_then} other {'entry' if one else 'entries'} with this kind and name "
                       f"{'was' if one else 'were'} in the cache when it missed; none is now (evicted or removed "
                       "since), so what differed cannot be shown")
        elif not self.candidates:
            out.append("  no other entry with this kind and name is in the cache")
        for cand in self.candidates[:3]:
            m = cand.manifest
            out.append(f"  nearest: key {m.key[:16]} variant {m.variant}, "
                       f"{len(cand.differences)} difference(s)")
            out.extend(f"    {d}" for d in cand.differences)
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "key": self.key,
            "hit": self.hit,
            "there_then": self.there_then,
            "candidates": [
                {
                    "key": c.manifest.key,
                    "variant": c.manifest.variant,
                    "created": c.manifest.created,
                    "differences": [d.__dict__ for d in c.differences],
                }
                for c in self.candidates
            ],
        }


def _short(value: Any) -> str:
    return "(none)" if value is None else str(value)


def _mapping_diff(what: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Difference]:
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a != b:
            if what == "sources":
                a, b = (a and a[:12] + "...") or "(absent)", (b and b[:12] + "...") or "(absent)"
            out.append(Difference(f"{what}.{name}", _short(a), _short(b)))
    return out


def _flags_diff(old: Sequence[str], new: Sequence[str]) -> list[Difference]:
    if list(old) == list(new):
        return []
    # Multisets: a default -O2 plus a user -O2 is two flags, and dropping one is a change.
    removed = list((Counter(old) - Counter(new)).elements())
    added = list((Counter(new) - Counter(old)).elements())
    if not removed and not added:
        return [Difference("flags", " ".join(old), " ".join(new) + " (order)")]
    return [Difference("flags", " ".join(removed) or "(none)", " ".join(added) or "(none)")]


def input_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Difference]:
    """What differs between two described-inputs documents."""
    diffs = _mapping_diff("sources", old.get("sources", {}), new.get("sources", {}))
    diffs += _flags_diff(old.get("flags", []), new.get("flags", []))
    diffs += _mapping_diff("tools", old.get("tools", {}), new.get("tools", {}))
    diffs += _mapping_diff("extra", old.get("extra", {}), new.get("extra", {}))
    return diffs


def dependency_differences(old: Manifest, new: Manifest | None, bases: Mapping[str, str] | None) -> list[Difference]:
    """Which files the compiler read differ: against another entry's record
    (`new`), or against the files as they are now under `bases`."""
    if new is not None:
        a = {(d.base, d.path): d.sha256 for d in old.deps} | {("env", n): v for n, v in old.env} \
            | {("system", g.folder): g.sha256 for g in old.system}
        b = {(d.base, d.path): d.sha256 for d in new.deps} | {("env", n): v for n, v in new.env} \
            | {("system", g.folder): g.sha256 for g in new.system}
        return [Difference(f"dependency {base}/{path}", _digest(a.get((base, path))), _digest(b.get((base, path))))
                for base, path in sorted(set(a) | set(b)) if a.get((base, path)) != b.get((base, path))]
    from ..store import deps as depcheck

    out = []
    for dep in old.deps:
        path = depcheck.resolve(dep, bases or {})
        try:
            sha = depcheck.digest(path, depcheck.witness(os.stat(path)), {}, "") if path else None
        except OSError:
            sha = None
        if sha != dep.sha256:
            out.append(Difference(f"dependency {dep.base}/{dep.path}", _digest(dep.sha256),
                                  _digest(sha) if path else "(base not given)"))
    variable = depcheck.env_changed(old.env)
    if variable is not None:
        now = depcheck.env_digest(variable.path)
        out.append(Difference(f"environment variable {variable.path}", _value(variable.sha256), _value(now)))
    group = depcheck.system_changed(old.system, {}, {}, 0)
    if group is not None:
        out.append(Difference(f"system files in {group.path}", "(as built)", "(changed: a package upgraded?)"))
    appeared = depcheck.absent_changed(old.absent, bases or {}, {}, 0)
    if appeared is not None:
        out.append(Difference(f"missing when built: {appeared.base}/{appeared.path}", "(absent)", "(there now)"))
    return out


def _value(digest: str) -> str:
    return "(unset)" if digest == "unset" else f"sha256 {digest[:12]}..."


def _digest(sha: str | None) -> str:
    return "(absent)" if sha is None else sha[:12] + "..."


def requirement_differences(manifest: Manifest, facts: FactSource) -> list[Difference]:
    return [
        Difference(f"requirement {u.requirement}", u.requirement.value,
                   _short(facts.get(u.requirement.name)))
        for u in manifest.requirements.unmet(facts)
    ]


def explain(
    store: Store,
    facts: FactSource,
    kind: str,
    name: str,
    wanted: Mapping[str, Any] | None,
    key: str | None,
    bases: Mapping[str, str] | None = None,
    before: float | None = None,
) -> Explanation:
    """Compare what a lookup wanted (or, without it, the newest entry) with the
    others; entries of the same key also by the files the compiler read. before:
    only the entries made before then (a past miss, compared with what was there)."""
    manifests = [m for m in _manifests(store, kind, name) if before is None or m.created < before]
    newest = None
    hit = False
    candidates = []
    if wanted is None and manifests:
        newest = max(manifests, key=lambda m: m.created)
        wanted, key = newest.inputs, newest.key
        manifests = [m for m in manifests if m is not newest]
        # the newest entry is what a lookup with its inputs finds: a hit here if it may load here
        unmet = requirement_differences(newest, facts)
        hit = not unmet
        if unmet:
            candidates.append(Candidate(newest, tuple(unmet)))
    for m in manifests:
        diffs = input_differences(m.inputs, wanted or {}) + requirement_differences(m, facts)
        if m.key == key and m.recorded:
            diffs += dependency_differences(m, newest, bases)
        if not diffs and m.key == key:
            hit = True
            continue
        candidates.append(Candidate(m, tuple(diffs)))
    candidates.sort(key=lambda c: (len(c.differences), -c.manifest.created))
    return Explanation(kind, name, key, hit, tuple(candidates))


def _manifests(store: Store, kind: str, name: str) -> list[Manifest]:
    out = []
    for key in store.keys_named(kind, name):
        for vdir in store.variant_dirs(kind, key):
            try:
                out.append(store.read_manifest(vdir))
            except (OSError, ManifestError):
                continue
    return out


# ---- the last misses ---------------------------------------------------------

#: log/misses.jsonl: a line per miss of what was asked for, so `abicache explain --last`
#: can say later why each missed (bounded as every log is: store/logs.py).
MISSES_LOG = "misses"


def record_miss(store: Store, kind: str, name: str, key: str, wanted: Mapping[str, Any]) -> None:
    """Note a miss, and how many keys of its name were there (a miss builds: one appended
    line and one read of the name's index cost nothing beside that; listing each key's
    variants would be a folder listing per key before the compile starts)."""
    import json
    import time

    there = sum(1 for _ in itertools.islice(store.keys_named(kind, name), 256))
    line = json.dumps({"time": time.time(), "kind": kind, "name": name, "key": key, "wanted": dict(wanted),
                       "there": there}, sort_keys=True, separators=(",", ":"), default=str)
    store.log_event(MISSES_LOG, line)


def last_misses(store: Store, count: int) -> list[dict[str, Any]]:
    """The last `count` misses recorded, the newest last (lines that do not parse are skipped)."""
    import json

    lines = store.read_events(MISSES_LOG)[-count:]
    out = []
    for line in lines[-count:] if count > 0 else []:
        try:
            doc = json.loads(line)
            if all(isinstance(doc.get(k), str) for k in ("kind", "name", "key")) and isinstance(doc.get("wanted"),
                                                                                                 dict):
                out.append(doc)
        except (ValueError, AttributeError):
            continue
    return out


def explain_miss(store: Store, facts: FactSource, miss: Mapping[str, Any]) -> Explanation:
    """Why a recorded miss missed: what was asked for, against the entries there were then."""
    found = explain(store, facts, miss["kind"], miss["name"], miss["wanted"], miss["key"],
                    before=float(miss.get("time") or 0.0) or None)
    there = miss.get("there")
    return dataclasses.replace(found, there_then=there) if isinstance(there, int) else found


# ---- nothing fits ----------------------------------------------------------------


def _variants(kind: str | None, name: str, local: Store | None) -> Iterator[tuple[str, Manifest]]:
    """(where, manifest) of every variant of (kind, name) in the local store (if given) and the
    read-only stores; kind None: of every kind. At most 64 a store and kind."""
    stores = ([("the local store", local)] if local is not None else []) + [(str(t.root), t.store)
                                                                            for t in tiers.tiers()]
    for where, store in stores:
        kinds = [kind] if kind else sorted(p.name for p in children(store.layout.entries))
        for each in kinds:
            for vdir in itertools.islice(store.iter_name_variants(each, name), 64):
                try:
                    yield where, store.read_manifest(vdir)
                except (OSError, ManifestError):
                    continue


def _lacking(manifest: Manifest, unmet: Callable[[Manifest], list[Any]]) -> str:
    return "; ".join(str(u) for u in unmet(manifest))


def no_fit(kind: str, name: str, local: Store, unmet: Callable[[Manifest], list[Any]],
           described: Mapping[str, Any] | None = None) -> str:
    """Where a build cannot run (no compiler): the variants of (kind, name) the local store
    and the read-only stores hold, and what each needs that this environment lacks (described:
    the call's inputs, to tell a variant of these very inputs from one of others)."""
    lines = [f"  {where}: variant {m.variant} " + _verdict(m, name, unmet, described)
             for where, m in _variants(kind, name, local)]
    if not lines:
        return (f"No prebuilt {kind} {name!r} is in the local store or a read-only store (ABICACHE_READ_STORES, "
                "the abicache.stores entry points of installed packages).")
    return f"No prebuilt {kind} {name!r} fits this environment:\n" + "\n".join(lines)


def _verdict(m: Manifest, name: str, unmet: Callable[[Manifest], list[Any]],
             described: Mapping[str, Any] | None) -> str:
    lacking = _lacking(m, unmet)
    if lacking:
        return f"needs {lacking}"
    from ..store.asked import asked

    # the same inputs but for the tools' identities (none here: no compiler to name)
    if described is not None and asked(m.inputs) == asked(described):
        from ..settings import config

        if config.build_mode() == "always":
            return "fits here, of these very inputs: ABICACHE_BUILD=always builds anyway (auto loads it)"
        return "fits here, of these very inputs"
    return f"was built from other inputs (abicache explain {name})"


def tier_variants(kind: str | None, name: str, unmet: Callable[[Manifest], list[Any]]) -> list[dict[str, str]]:
    """Every variant of (kind, name) the read-only stores hold, and whether it loads here or the
    requirements it lacks: the trace `abicache explain NAME` shows beside the local entries."""
    return [{"store": where, "kind": m.kind, "variant": m.variant, "key": m.key,
             "verdict": f"needs {_lacking(m, unmet)}" if _lacking(m, unmet) else "loads here"}
            for where, m in _variants(kind, name, None)]


def forbidden(kind: str, name: str, local: Store, unmet: Callable[[Manifest], list[Any]],
              facts: FactSource, described: Mapping[str, Any] | None = None) -> str:
    """The error of a miss where ABICACHE_BUILD=never: every variant there is and what it needs,
    and this environment's facts that the variants' requirements name."""
    from ..env.facts import FACT_NAMES

    named = {r.name for _, m in _variants(kind, name, local) for r in m.requirements} \
        or {"platform.machine", "python.abi", "torch.version", "gpu.arch"}
    here = ", ".join(f"{n}={facts.get(n)}" for n in FACT_NAMES if n in named)
    return (f"{kind} {name!r} is in no store, and ABICACHE_BUILD=never forbids building it here.\n"
            f"{no_fit(kind, name, local, unmet, described)}\nThis environment: {here}.\n"
            "Ship a variant for it (abicache bundle --check --env ... shows which), or let it build "
            "(ABICACHE_BUILD=auto).")
