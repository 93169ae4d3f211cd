"""One function per subcommand; each returns an exit code."""

from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import time
import warnings
from operator import attrgetter
from pathlib import Path
from typing import Any, Iterable

from ..settings import config
from ..core.cache import Cache
from ..env import FACT_NAMES
from ..errors import AbicacheError, AbicacheWarning, ConfigError, ManifestError, NotFound, UsageError
from ..store import Manifest
from ..store.local import children
from . import observer_line, render, settings_check

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)?\s*$", re.I)


def parse_size(text: str) -> int:
    value = config.parse_size(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use e.g. 500M, 10G or 0")
    return value


def parse_age(text: str) -> float:
    match = _AGE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age; use e.g. 30d, 12h, 90m")
    unit = (match.group(2) or "s").lower()
    scale = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
    return float(match.group(1)) * scale


def _cache(args: argparse.Namespace) -> Cache:
    cache = Cache(args.root) if args.root else Cache()
    cache.store.ensure()
    return cache


def manifests_of(cache: Cache) -> list[tuple[Path, Manifest]]:
    out = []
    for vdir in cache.store.iter_variant_dirs():
        try:
            out.append((vdir, cache.store.read_manifest(vdir)))
        except (OSError, ManifestError):
            continue
    return out


def cmd_env(args: argparse.Namespace) -> int:
    problems = settings_check.problems()  # shown, flagged, rather than refused: this is where one looks
    try:
        with warnings.catch_warnings():  # a bad remote is shown in the table below, not warned about
            warnings.simplefilter("ignore", AbicacheWarning)
            cache = Cache(args.root) if args.root else Cache()
    except ConfigError:
        from ..settings import checked

        checked.accept_current()  # the problems are this command's table, not its failure
        cache = Cache(args.root, shared=False, verify_age=0, touch_interval=0, lock_timeout=0, remote=False)
    facts = cache.facts.probe_all()
    settings = {name: os.environ.get(name) for name in config.VARIABLES}
    from ..cuda import loader
    from ..hip import loader as hip_loader

    from ..shipping import tiers

    libraries, hip = loader.describe(), hip_loader.describe()
    with warnings.catch_warnings(record=True) as skipped:  # a store that is skipped: listed, with why
        warnings.simplefilter("always", AbicacheWarning)
        read_only = [{"root": str(t.root), "from": t.origin} for t in tiers.tiers()]
    read_only += [{"root": "-", "from": str(w.message)} for w in skipped]
    observer = observer_line.status(cache)
    if args.json:
        render.emit_json({"root": str(cache.root), "facts": facts, "settings": settings, "problems": problems,
                          "cuda_libraries": libraries, "hip_libraries": hip, "read_only_stores": read_only,
                          "observer": observer})
        return 1 if problems else 0
    render.table("environment facts", ["fact", "value"],
                 [(n, facts.get(n) if facts.get(n) is not None else "-") for n in FACT_NAMES])
    render.table(f"settings (root: {cache.root})", ["variable", "value", "default", "meaning"],
                 [(n, (settings[n] or "") + (f"  INVALID: {problems[n]}" if n in problems else ""), d, m)
                  for n, (d, m) in config.VARIABLES.items()])
    render.table("GPU runtime libraries (abicache.cuda / abicache.hip load_library)",
                 ["library", "major", "path", "found via"], [tuple(row.values()) for row in libraries + hip])
    if read_only:
        render.table("read-only stores, searched after the local one", ["root", "from"],
                     [(t["root"], t["from"]) for t in read_only])
    render.say(f"observer (what compilers read and looked for): {observer}")
    return 1 if problems else 0



def _size(vdir: Path, m: Manifest) -> int:
    return sum(f.size for f in m.files)


#: the kinds abicache's own frontends write (get_or_build callers may name others)
#: kinds the build engine stores on a build's behalf: `ls` leaves them out unless --all
INTERNAL_KINDS = ("cc.object", "torch.pch")
FRONTEND_KINDS = ("cc.compile", "cc.library", "cc.module", "cc.object", "cuda.cubin", "cuda.fatbin", "cuda.ptx", "torch.classic",
                  "torch.compile", "torch.executable", "torch.pch", "torch.pybind", "torch.stable", "triton",
                  "triton.file", "tvm_ffi.module", "cuda_core.program")


def cmd_ls(args: argparse.Namespace) -> int:
    # a big store's rows are tens of thousands of lists and tuples, none in a cycle: the
    # collector's passes over them only cost (a quarter of parsing the memo)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _ls(args)
    finally:
        if collecting:
            gc.enable()


def _ls(args: argparse.Namespace) -> int:
    from . import listing

    cache = _cache(args)
    entries = str(cache.store.layout.entries)
    present = sorted(os.listdir(entries)) if os.path.isdir(entries) else []
    if args.kind and args.kind not in present and args.kind not in FRONTEND_KINDS:
        raise UsageError(f"no kind {args.kind!r}: this store holds {', '.join(present) or 'no entries'}, and "
                         f"abicache's frontends write {', '.join(FRONTEND_KINDS)}")
    kinds = [args.kind] if args.kind else [k for k in present if args.all or k not in INTERNAL_KINDS]
    store = cache.store
    rows = listing.rows(entries, [k for k in kinds if k in present], os.fspath(store.layout.listing), store.make_dir)
    hidden = 0 if args.kind or args.all else listing.count(entries, [k for k in INTERNAL_KINDS if k in present])
    # by kind and name, the newest first: stable sorts on one attribute each (a key tuple per row
    # costs 5x; one of two attributes, 1.4x)
    rows.sort(key=attrgetter("created"), reverse=True)
    rows.sort(key=attrgetter("name"))
    rows.sort(key=attrgetter("kind"))
    if args.json:
        if len(rows) > render.PLAIN_ROWS:  # as emit_json writes a long list: a line per item
            lists: dict[tuple[str, ...], str] = {}
            lines = ",\n  ".join(r.json_line(lists) for r in rows)
            sys.stdout.write(f"[\n  {lines}\n]\n")
        else:
            render.emit_json([r.summary() for r in rows])
        return 0
    if not rows:
        render.say(f"no entries in {cache.root}" + (f" but {hidden} the build engine keeps for itself (--all lists "
                                                    "them)" if hidden else " (a build or a hit there makes one)"))
        return 0
    now = time.time()
    sizes: dict[int, str] = {}
    needs: dict[tuple[str, ...], str] = {}  # entries of a kind share a few sizes and requirements
    render.table(
        f"{len(rows)} {_plural(len(rows), 'entry')} in {cache.root}",
        ["kind", "name", "key", "variant", "size", "last used", "requirements"],
        [(r.kind, r.name, r.key[:12], r.variant[:8],
          sizes.get(r.size) or sizes.setdefault(r.size, render.human_size(r.size)), render.ago(r.last_used, now),
          needs.get(r.requirements) or needs.setdefault(r.requirements, short_requirements(r.requirements)))
         for r in rows],
        optional=("variant",), whole=("key",),
    )
    if hidden:
        render.say(f"and {hidden} {_plural(hidden, 'entry')} the build engine keeps for itself (a unit's object, "
                   "a precompiled header): --all lists them")
    return 0


def short_requirements(requirements: Iterable[Any]) -> str:
    """For a table row: what tells entries apart (python, torch, gpu...), the platform floors
    every machine of this platform meets only counted ('abicache show' lists them all)."""
    texts = [str(r) for r in requirements]
    floors = [t for t in texts if t.startswith("platform.")]
    rest = "; ".join(t for t in texts if not t.startswith("platform."))
    if not floors:
        return rest or "(none)"
    return f"{rest}; platform ({len(floors)})" if rest else f"platform ({len(floors)})"


def cmd_show(args: argparse.Namespace) -> int:
    cache = _cache(args)
    prefix = args.key.lower()
    every = manifests_of(cache)
    found = [(v, m) for v, m in every if m.key.startswith(prefix)]
    named = [(v, m) for v, m in every if m.name == args.key]
    if not found and named:  # a name: its newest entry (and that key's other variants)
        newest = max(named, key=lambda vm: vm[1].created)[1].key
        found = [(v, m) for v, m in named if m.key == newest]
    if not found:
        raise NotFound(f"no entry has a key starting with {args.key!r}, nor that name; 'abicache ls' lists them")
    if len({m.key for _, m in found}) > 1:
        raise AbicacheError(f"{args.key!r} matches several keys; give more characters")
    if args.json:
        render.emit_json([{**m.to_dict(), "path": str(v)} for v, m in found])
        return 0
    for vdir, m in found:
        render.say(f"[bold]{m.kind} {m.name}[/]  key {m.key}  variant {m.variant}")
        render.say(f"  path: {vdir}")
        render.say(f"  requirements: {m.requirements or '(none: loads anywhere this platform runs)'}")
        render.say(f"  built: {render.ago(m.created)} in {m.build_seconds:.2f} s by abicache {m.abicache_version}")
        render.table("files", ["file", "size", "sha256", "mode"],
                     [(f.path, render.human_size(f.size), f.sha256[:16], f"{f.mode:o}") for f in m.files])
        render.table("inputs", ["input", "value"], _input_rows(m.inputs))
    return 0


def _input_rows(inputs: Any) -> list[tuple[str, str]]:
    rows = [(f"source {n}", h[:16]) for n, h in inputs.get("sources", {}).items()]
    rows.append(("flags", " ".join(inputs.get("flags", []))))
    rows += [(f"tool {n}", str(v)) for n, v in inputs.get("tools", {}).items()]
    rows += [(f"extra {n}", str(v)) for n, v in inputs.get("extra", {}).items()]
    return rows


def cmd_explain(args: argparse.Namespace) -> int:
    cache = _cache(args)
    if args.last is not None:
        return _explain_last(cache, args)
    if args.name is None:
        raise UsageError("abicache explain: name an entry (abicache explain mylib), or ask for the last misses "
                         "(abicache explain --last)")
    from ..core.explain import tier_variants

    kinds = sorted({m.kind for _, m in manifests_of(cache) if m.name == args.name})
    if args.kind:
        kinds = [args.kind]
    shipped = tier_variants(args.kind, args.name, lambda m: cache._checked(m.requirements).unmet(cache.facts))
    if not kinds and not shipped:
        raise NotFound(f"nothing named {args.name!r} is in the cache at {cache.root} nor in a read-only store")
    explanations = [cache.explain(kind, args.name) for kind in kinds]
    if args.json:
        render.emit_json([*(e.to_dict() for e in explanations), *({"read_only": row} for row in shipped)])
    else:
        for e in explanations:
            render.say("\n".join(e.lines()))
        if shipped:
            render.table(f"{args.name} in the read-only stores", ["store", "kind", "variant", "here"],
                         [(r["store"], r["kind"], r["variant"], r["verdict"]) for r in shipped])
    loads = any(r["verdict"] == "loads here" for r in shipped)
    return 0 if all(e.hit for e in explanations) and (explanations or loads) else 1  # a miss exits 1


def _explain_last(cache: Cache, args: argparse.Namespace) -> int:
    """The last misses of every process that used this store, each against the entries of
    its name that were there when it missed (explain.record_miss wrote them)."""
    from ..core.explain import explain_miss, last_misses

    misses = [m for m in last_misses(cache.store, args.last) if args.name in (None, m["name"])
              and args.kind in (None, m["kind"])]
    explained = [(m, explain_miss(cache.store, cache.facts, m)) for m in misses]
    if args.json:
        render.emit_json([{"time": m.get("time"), **e.to_dict()} for m, e in explained])
        return 0
    if not explained:
        render.say(f"no miss is recorded in {cache.root} (since the store was made)")
    for miss, e in explained:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(miss.get("time") or 0)))
        head = f"{when}  {e.kind} {e.name!r} missed (key {str(e.key)[:16]})"
        if e.hit:  # an entry of these very inputs was there: it did not hold then
            head += "; an entry of the same inputs was there, but its files or recorded headers did not hold"
        render.say("\n".join([head, *e.lines()[1:]]))
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    from ..shipping import bundle

    cache = _cache(args)
    if args.bundle_remote:
        cache.store.ensure(writing=True)
        bundle.fetch_named(args.bundle_remote, cache.store, args.names, args.kind)
    chosen = bundle.select(cache.store, args.names, args.kind, args.sources)
    if args.check:
        return _bundle_check(chosen, args)
    if args.out is None:
        raise UsageError("abicache bundle: say where with --out DIR (or ask --check)")
    signer = bundle.signer_from_env()
    if args.wheel:
        args.out.mkdir(parents=True, exist_ok=True)
        made = bundle.write_wheels(chosen, args.wheel, args.out, signer, args.split_by,
                                   bundle.MAX_WHEEL if args.max_size is None else args.max_size)
    else:
        bundle.write_store(chosen, args.out, signer)
        made = [bundle.Bundled(args.out, tuple(m for _, m in chosen))]
    if args.json:
        render.emit_json({"out": str(made[0].out) if not args.wheel else str(args.out), "wheels": [
            {"file": str(b.out), "group": b.group, "tags": b.tag, "size": b.size} for b in made if args.wheel],
            "tag": made[0].tag, "entries": [
                {"kind": m.kind, "name": m.name, "key": m.key, "variant": m.variant, "size": sum(f.size for f in m.files),
                 "wheel": next((str(b.out) for b in made if m in b.entries), None),
                 "requirements": m.requirements.to_list()} for m in (m for _, m in chosen)]})
        return 0
    names = ", ".join(sorted({m.name for _, m in chosen}))
    if not args.wheel:
        render.say(f"{len(chosen)} variants of {names} -> {made[0].out} (ABICACHE_READ_STORES={made[0].out}, or ship it "
                   "in a package: abicache bundle --wheel)")
        return 0
    where = {(m.kind, m.key, m.variant): b.out.name for b in made for m in b.entries}
    render.table(f"{len(chosen)} variants of {names}", ["kind", "name", "variant", "size", "wheel"],
                 sorted((m.kind, m.name, m.variant, render.human_size(sum(f.size for f in m.files)),
                         where.get((m.kind, m.key, m.variant), "")) for _, m in chosen))
    render.table("wheels", ["wheel", "group", "variants", "size"],
                 [(b.out.name, b.group or "(base)", len(b.entries), render.human_size(b.size)) for b in made])
    render.say("pip install the base wheel and the providers a machine needs: abicache finds their stores")
    return 0


def _bundle_check(chosen: list[Any], args: argparse.Namespace) -> int:
    """Which variant loads in each target environment; exit 1 where one would build."""
    from ..shipping import bundle
    from .audit_cmds import assumed_facts

    environments = [(text, assumed_facts([f for f in text.split(",") if f.strip()])) for text in args.env] \
        or [("here", assumed_facts([]))]
    verdicts = bundle.check(chosen, environments)
    if args.json:
        render.emit_json([v._asdict() for v in verdicts])
    else:
        render.table("what a lookup would find", ["environment", "kind", "name", "verdict"],
                     [(v.environment, v.kind, v.name, f"loads variant {v.variant}" if v.variant else
                       f"builds (no compiler: fails): needs {v.needs}") for v in verdicts])
    return 0 if all(v.variant for v in verdicts) else 1


def cmd_gc(args: argparse.Namespace) -> int:
    from ..store.gc import collect_garbage  # here: the other commands start without it
    cache = _cache(args)
    if args.all and args.max_size is not None:
        raise UsageError("abicache gc: --all removes every entry; give it or --max-size, not both")
    cap, cap_from = ((0, "--all") if args.all else (args.max_size, "--max-size") if args.max_size is not None
                     else _configured_cap())
    with render.Progress("evicting", None) as bar:
        report = collect_garbage(cache.store, max_size=cap, max_age=args.max_age,
                                 dry_run=args.dry_run, progress=bar.advance)
    if args.json:
        render.emit_json({**report.__dict__, "max_size_from": cap_from})
        return 0
    verb = "would remove" if args.dry_run else "removed"
    render.say(f"{verb} {report.entries_removed} of {report.entries_before} {_plural(report.entries_before, 'entry')}"
               f", {report.blobs_removed} blobs, {report.leftovers_removed} builder leftovers; "
               f"{render.human_size(report.bytes_before)} -> {render.human_size(report.bytes_after)}"
               + (f" (cap {render.human_size(cap)}, from {cap_from})" if cap is not None else "")
               + (f"; {report.in_use} in use by running builds, left" if report.in_use else ""))
    return 0


def _configured_cap() -> tuple[int | None, str]:
    """(ABICACHE_MAX_SIZE in bytes or None, where it was set)."""
    from ..settings import config

    return config.size("ABICACHE_MAX_SIZE"), config.lookup("ABICACHE_MAX_SIZE")[1]


def _plural(count: int, word: str) -> str:
    return word if count == 1 else ("entries" if word == "entry" else word + "s")


def _count(count: int, word: str) -> str:
    """'1 entry', '2 entries', '1 blob', '0 blobs'."""
    return f"{count} {_plural(count, word)}"


def cmd_check(args: argparse.Namespace) -> int:
    from ..frontends.check import check_entries, log

    cache = _cache(args)
    verdicts = check_entries(cache, args.keys, args.sample)
    if args.log:
        log(cache, verdicts)
    stale = [v for v in verdicts if v.verdict == "stale key"]
    if args.json:
        render.emit_json({"checked": [v.to_dict() for v in verdicts], "stale": len(stale)})
    elif verdicts:
        render.table(f"checked {_count(len(verdicts), 'entry')}: each built again from scratch and compared",
                     ["key", "kind", "name", "verdict", "detail"],
                     [(v.key[:16], v.kind, v.name, v.verdict, v.detail) for v in verdicts])
    else:
        render.say("no entry with a recipe to check (entries of cc.load_library and cc.load_module have one)")
    return 1 if stale else 0


def cmd_verify(args: argparse.Namespace) -> int:
    from ..store.verify import verify_store
    cache = _cache(args)
    total = sum(1 for _ in cache.store.iter_variant_dirs())
    with render.Progress("verifying", total) as bar:
        report = verify_store(cache.store, full=args.full, progress=bar.advance)
    if args.json:
        render.emit_json({**report.__dict__, "problems": [p.__dict__ for p in report.problems],
                          "clean": report.clean, "full": args.full})
    else:
        mode = "full (sha256)" if args.full else "quick (owners, sizes, stamps)"
        render.say(f"verified {_count(report.entries, 'entry')}, {_count(report.blobs, 'blob')}, "
                   f"{render.human_size(report.bytes_hashed)} hashed, {mode}, in {report.seconds:.2f} s")
        if report.leftovers:
            render.say(f"{report.leftovers} leftovers of interrupted builds in tmp/ (harmless; gc removes them)")
        if report.building:
            render.say(f"{report.building} builds in progress (their folders in tmp/ are left alone)")
        if report.problems:
            render.table("quarantined (will be rebuilt on next use)", ["where", "problem"],
                         [(p.where, p.reason) for p in report.problems])
        else:
            render.say("clean: no damage found")
    return 0 if report.clean else 1


def cmd_stats(args: argparse.Namespace) -> int:
    from ..shipping.replicate import REFUSALS_LOG, refusal_count
    from ..store.gc import disk_usage
    from ..core.explain import last_misses
    from ..store import counters

    cache = _cache(args)
    if args.zero:
        counters.zero(cache.store)
        if args.json:
            render.emit_json({"root": str(cache.root), "zeroed": True})
        else:
            render.say(f"{cache.root}: statistics zeroed")
        return 0
    counts = counters.totals(cache.store)
    entries = manifests_of(cache)
    stored, blob_count = disk_usage(cache.store)
    logical = sum(_size(v, m) for v, m in entries)
    by_kind: dict[str, list[int]] = {}
    for vdir, m in entries:
        row = by_kind.setdefault(m.kind, [0, 0])
        row[0] += 1
        row[1] += _size(vdir, m)
    cap, cap_from = _configured_cap()
    doc = {
        "root": str(cache.root), "entries": len(entries), "blobs": blob_count,
        "stored_bytes": stored, "logical_bytes": logical,
        "max_size": cap, "max_size_from": cap_from, "used_fraction": stored / cap if cap else None,
        "quarantined": len([p for p in children(cache.store.layout.quarantine) if p.name != "damaged-blobs"]),
        "leftovers": len(children(cache.store.layout.tmp)),
        "remote_refusals": refusal_count(cache.store),
        "by_kind": {k: {"entries": v[0], "bytes": v[1]} for k, v in sorted(by_kind.items())},
        "counts": counts,
        "last_misses": [{k: m.get(k) for k in ("time", "kind", "name", "key")} for m in last_misses(cache.store, 5)],
    }
    if args.json:
        render.emit_json(doc)
        return 0
    rate = "-" if counts["hit_rate"] is None else f"{counts['hit_rate'] * 100:.1f}%"
    render.table(("zeroed " if counts["zeroed_at"] else "since ")
                 + (time.strftime("%Y-%m-%d %H:%M", time.localtime(counts["since"])) if counts["since"]
                    else "the store was made"),
                 ["hits (local)", "hits (read-only)", "hits (remote)", "misses", "hit rate", "builds", "uncacheable",
                  "build time", "time saved", "errors"],
                 [(counts["hits_local"], counts["hits_read_only"], counts["hits_remote"], counts["misses"], rate,
                   counts["builds"], counts["uncacheable"], f"{counts['build_seconds']:.1f} s",
                   f"{counts['seconds_saved']:.1f} s", counts["errors"])])
    if counts["hits_local"]:
        render.say(f"served by a hit record (no store opened): {counts['hits_record']} of the "
                   f"{counts['hits_local']} local hits")
    for label, field in (("uncacheable builds", "uncacheable_by_reason"), ("errors", "errors_by_kind"),
                         ("full lookups that wrote no hit record", "unrecorded_by_reason")):
        if counts[field]:
            render.say(f"{label}: " + ", ".join(f"{reason} {n}" for reason, n in counts[field].items()))
    if doc["last_misses"]:
        render.say("last misses: " + ", ".join(f"{m['kind']} {m['name']} ({render.ago(float(m['time'] or 0))})"
                                              for m in reversed(doc["last_misses"]))
                   + "; why: abicache explain --last")
    saved = logical - stored
    render.say(f"{cache.root}: {_count(len(entries), 'entry')}, {_count(blob_count, 'blob')}, "
               f"{render.human_size(stored)} on disk for {render.human_size(logical)} of files "
               f"({render.human_size(max(saved, 0))} saved by sharing)")
    render.say(f"{doc['used_fraction'] * 100:.0f}% of the cap, {render.human_size(cap)} (from {cap_from})"
               if cap else "no size cap: set one with `abicache config set max_size 10G`" if cap is None
               else f"a cap of 0 bytes (from {cap_from}): every entry but the last built is evicted")
    if doc["remote_refusals"]:
        render.say(f"[red]{doc['remote_refusals']} downloads from a remote were refused[/] "
                   f"(see {cache.store.layout.log / (REFUSALS_LOG + '.jsonl')})")
    counted = counts["by_kind"]
    if by_kind or counted:
        none = dict.fromkeys(counters.KIND_FIELDS, 0)
        render.table("by kind", ["kind", "entries", "size", "hits", "misses", "uncacheable", "errors"],
                     [(k, by_kind.get(k, [0, 0])[0], render.human_size(by_kind.get(k, [0, 0])[1]),
                       *counted.get(k, none).values()) for k in sorted({*by_kind, *counted})])
    return 0


def cmd_launcher(args: argparse.Namespace) -> int:
    from ..launcher import front

    cache = _cache(args)
    program, why = front.path(cache.store.layout.tools)
    links = program.parent / front.LINKS if program else None
    if args.json:
        render.emit_json({"path": str(program) if program else None, "links": str(links) if links else None,
                          "why": why or None})
    elif program is None:
        sys.stderr.write(f"abicache: the native front cannot be built here: {why}; "
                         "use `abicache` itself as the launcher (every compile then starts Python)\n")
    else:
        print(links if args.links else program)
    return 0 if program else 1


def cmd_keeper(args: argparse.Namespace) -> int:
    """Whether the store's keeper runs (status), or start or stop it; 1 where start left none
    running, or stop one."""
    import os

    from ..hits import keeper

    root = os.path.realpath(_cache(args).store.root)
    if args.action == "stop":
        keeper.stop(root)
    elif args.action == "start":
        keeper.start(root, idle=keeper.idle_setting() or keeper.IDLE_SECONDS)
        keeper.wait_for(root)
    told = keeper.status(root)
    if args.json:
        render.emit_json({"root": root, "running": told is not None, **(told or {})})
    elif told is None:
        print(f"no keeper runs for {root}")
    else:
        print(f"keeper {told['pid']} for {root}: {told['records']} records held, "
              f"exits after {told.get('idle', 0):.0f} s without a question")
    if args.action == "status":
        return 0
    return 0 if (told is None) == (args.action == "stop") else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from . import demo

    return demo.run(args)
