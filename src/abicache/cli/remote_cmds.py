"""Commands of the remote tier: push, pull, remote (check), keys."""

from __future__ import annotations

import argparse
import re
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from ..settings import config
from ..core.cache import Cache
from ..errors import AbicacheWarning, ConfigError
from ..store import Manifest
from . import render
from .commands import manifests_of


def _cache(args: argparse.Namespace) -> Cache:
    remote: Any = args.remote if getattr(args, "remote", None) else None
    if remote is None and config.text("ABICACHE_REMOTE"):
        from ..remote import RemoteSettings

        remote = RemoteSettings.from_env()  # a bad setting is this command's error, said once (not "ignored")
    cache = Cache(args.root, remote=remote) if args.root else Cache(remote=remote)
    if cache.remote is None:
        raise ConfigError("no remote is configured: set ABICACHE_REMOTE (e.g. s3://bucket/prefix?endpoint=URL "
                          "or redis://host:6379/0) or pass --remote URL")
    cache.store.ensure()
    return cache


def _wanted(args: argparse.Namespace) -> Callable[[Manifest], bool]:
    return lambda m: (not args.kind or m.kind == args.kind) and (not args.name or m.name == args.name)


def _report(args: argparse.Namespace, cache: Cache, title: str, rows: list[dict[str, str]]) -> int:
    failed = sum(r["result"] in ("failed", "refused") for r in rows)
    if args.json:
        render.emit_json({"remote": cache.remote.name, "entries": rows, "stats": dict(cache.remote.stats),
                          "down": cache.remote.down})
    else:
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["result"]] = counts.get(r["result"], 0) + 1
        render.table(f"{title} {cache.remote.name}", ["kind", "name", "key", "variant", "result"],
                     [(r["kind"], r["name"], r["key"][:12], r["variant"][:8], r["result"]) for r in rows])
        render.say(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing to do")
        for why, n in sorted(_refusal_kinds(rows, cache.remote.name).items(), key=lambda kv: -kv[1]):
            render.say(f"[yellow]refused {n} {'entry' if n == 1 else 'entries'}[/]: {why}")
        if cache.remote.down:
            render.say(f"[red]the remote failed: {cache.remote.down}[/]")
    return 1 if failed or cache.remote.down else 0


def _refusal_kinds(rows: list[dict[str, str]], remote: str) -> dict[str, int]:
    """Refusals by kind of reason (the entry named in each left out): one line per kind, not per entry.
    The remote's name is cut off as it is (a folder's may hold spaces)."""
    kinds: dict[str, int] = {}
    for row in rows:
        for reason in filter(None, row.get("why", "").split("; ")):
            text = reason.removeprefix(f"refused from remote {remote}: ")
            text = re.sub(r"^remote manifest \S+:? ", "remote manifest ", text)
            kinds[text] = kinds.get(text, 0) + 1
    return kinds


def _parallel(jobs: int, items: list[Any], fn: Callable[[Any], Any], bar: render.Progress) -> list[Any]:
    """fn over items on `jobs` threads (transfers wait on the network); results in order."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item: Any) -> Any:
        try:
            return fn(item)
        finally:
            bar.advance()

    with ThreadPoolExecutor(max(1, min(jobs, len(items) or 1)), thread_name_prefix="abicache-remote") as pool:
        return list(pool.map(one, items))


def cmd_push(args: argparse.Namespace) -> int:
    """Upload local entries (e.g. a CI job after building everything), args.jobs at once."""
    from ..shipping import replicate

    cache = _cache(args)
    chosen = [(v, m) for v, m in manifests_of(cache) if _wanted(args)(m)]

    def push(item: tuple[Path, Manifest]) -> dict[str, str]:
        vdir, m = item
        result = replicate.publish(cache.remote, cache.store, vdir, m)
        status = result.status
        if status == "exists":
            status = "present" if result.winner.files == m.files else "remote has other bytes"
        return _row(m, status)

    with render.Progress("pushing", len(chosen)) as bar:
        rows = _parallel(args.jobs, chosen, push, bar)
    return _report(args, cache, "pushed to", rows)


def cmd_pull(args: argparse.Namespace) -> int:
    """Fetch the remote's entries that can load here (e.g. a node before a job), args.jobs at once."""
    from ..shipping import replicate

    cache = _cache(args)
    listed = [(k, key) for k, key in cache.remote.call(lambda b: sorted(b.entries())) or [] if _named(k, key)]
    if args.kind:
        listed = [(k, key) for k, key in listed if k == args.kind]
    rows = []
    with render.Progress("pulling", len(listed)) as bar, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", AbicacheWarning)  # gathered into the table and one summary
        found = _parallel(args.jobs, listed, lambda kk: _pull_one(cache, replicate, kk[0], kk[1], _wanted(args)),
                          bar)
        refusals = [str(w.message).removeprefix("abicache: ") for w in said
                    if str(w.message).startswith("abicache: refused from remote")]
        for part in found:  # refusals come from threads in any order: each row names its own key
            rows += [{**r, "why": "; ".join(w for w in refusals if r["key"][:16] in w)}
                     if r["result"] == "refused" else r for r in part]
    for w in said:  # anything else abicache warned about, in its own words
        if not str(w.message).startswith("abicache: refused from remote"):
            render.say(f"[yellow]{w.message}[/]")
    return _report(args, cache, "pulled from", rows)


def _named(kind: str, key: str) -> bool:
    """Whether a listed entry has an abicache kind and key: anything else under the prefix
    (another tool's object, a planted name) is skipped, not parsed into a traceback."""
    from ..store.layout import check_hex, check_kind

    try:
        check_kind(kind)
        check_hex(key, "key")
    except ValueError:
        return False
    return len(key) == 64


def _pull_one(cache: Cache, replicate: Any, kind: str, key: str, wanted: Callable[[Manifest], bool]) -> list[dict[str, str]]:
    if cache.find(kind, key) is not None:
        return []  # already usable here
    refused = cache.remote.stats["refused"]
    got = replicate.fetch(cache.remote, cache.store, kind, key, lambda m: wanted(m) and cache.usable(m))
    if got is not None:
        return [_row(got.manifest, "fetched")]
    if cache.remote.stats["refused"] > refused:  # its manifest was refused unread: no name to show
        return [{"kind": kind, "name": "-", "key": key, "variant": "", "result": "refused"}]
    return []  # nothing there that can load here (or the remote failed: the report says so)


def _row(m: Manifest, result: str) -> dict[str, str]:
    return {"kind": m.kind, "name": m.name, "key": m.key, "variant": m.variant, "result": result}


def cmd_remote(args: argparse.Namespace) -> int:
    """abicache remote [check|stats|prune]."""
    if args.action == "stats":
        return _remote_stats(args)
    if args.action == "prune":
        return _remote_prune(args)
    given = [f"--{o.replace('_', '-')}" for o in ("max_age", "max_size", "grace", "dry_run") if getattr(args, o)]
    if given:
        raise ConfigError(f"{', '.join(given)}: for `abicache remote prune`, not `abicache remote {args.action}`")
    from ..shipping import replicate

    cache = _cache(args)
    tier = cache.remote
    start = time.perf_counter()
    answered = tier.call(lambda b: b.variant_list("abicache.ping", "0" * 64, 1))
    seconds = time.perf_counter() - start
    settings = tier.settings
    doc = {
        "remote": tier.name, "mode": settings.mode, "timeout": settings.timeout,
        "writable": tier.writable, "reachable": answered is not None, "latency_ms": round(seconds * 1e3, 2),
        "error": tier.down, "signing_key": str(settings.signing_key or ""),
        "trusted_keys": [k.key_id for k in settings.trusted],
        "refusals_logged": replicate.refusal_count(cache.store),
    }
    if args.json:
        render.emit_json(doc)
    else:
        render.table(f"remote {tier.name}", ["setting", "value"], [(k, v) for k, v in doc.items()])
    return 0 if answered is not None else 1


def _inventory(args: argparse.Namespace) -> tuple[Cache, Any, Any]:
    """The remote's whole inventory (a ConfigError naming the failure if the remote fails)."""
    from ..errors import RemoteError
    from ..remote import prune

    cache = _cache(args)
    try:
        with render.Progress("reading manifests", None) as bar:
            inv = prune.inventory(cache.remote.backend(), bar.advance)
    except RemoteError as exc:
        raise ConfigError(f"remote {cache.remote.name}: {exc}") from None
    return cache, prune, inv


def _remote_stats(args: argparse.Namespace) -> int:
    from ..errors import RemoteError

    cache, prune, inv = _inventory(args)
    try:  # leases: builds in flight on the fleet (remote/lease.py), or left by a killed builder
        leases = sum(1 for _ in cache.remote.backend().leases())
    except RemoteError as exc:
        raise ConfigError(f"remote {cache.remote.name}: {exc}") from None
    doc = {"remote": cache.remote.name, **prune.stats(inv), "build_leases": leases}
    if args.json:
        render.emit_json(doc)
        return 0
    render.table(f"remote {cache.remote.name}", ["", "count"],
                 [(k, render.human_size(v) if k.endswith("bytes") else v) for k, v in doc.items()
                  if k not in ("remote", "kinds")])
    render.table("by kind", ["kind", "variants", "bytes"],
                 [(k, v["variants"], render.human_size(v["bytes"])) for k, v in sorted(doc["kinds"].items())])
    return 0


def _remote_prune(args: argparse.Namespace) -> int:
    from ..errors import RemoteError

    cache, prune, inv = _inventory(args)
    if not cache.remote.writable and not args.dry_run:
        raise ConfigError(f"remote {cache.remote.name} is read-only here (ABICACHE_REMOTE_MODE=read, or trusted "
                          "keys without a signing key): prune needs write access; --dry-run shows the plan")
    now = time.time()
    todo = prune.plan(inv, now=now, max_age=args.max_age, max_size=args.max_size,
                      grace=prune.GRACE if args.grace is None else args.grace)
    raced = 0
    if not args.dry_run:
        try:
            raced = prune.apply(cache.remote.backend(), todo, inv, now=now)
        except RemoteError as exc:
            raise ConfigError(f"remote {cache.remote.name}: pruning stopped: {exc}; nothing unsafe was left: "
                              "run it again") from None
    doc = {"remote": cache.remote.name, "dry_run": args.dry_run,
           "deleted_entries": [{"kind": v.kind, "name": v.manifest.name if v.manifest else "-", "key": v.key,
                                "variant": v.variant, "why": why} for v, why in todo.delete],
           "deleted_blobs": len(todo.delete_blobs), "freed_bytes": todo.freed,
           "marked_blobs": len(todo.mark), "unmarked_blobs": len(todo.unmark),
           "published_meanwhile_removed": raced}
    if args.json:
        render.emit_json(doc)
        return 0
    render.table(f"{'would prune' if args.dry_run else 'pruned'} {cache.remote.name}",
                 ["kind", "name", "key", "variant", "why"],
                 [(e["kind"], e["name"], e["key"][:12], e["variant"][:8], e["why"]) for e in doc["deleted_entries"]])
    from .commands import _count

    render.say(f"{_count(len(todo.delete), 'entry')}, {_count(len(todo.delete_blobs), 'blob')} "
               f"({render.human_size(todo.freed)}) {'would be ' if args.dry_run else ''}deleted; "
               f"{len(todo.mark)} blobs no entry names marked (deleted by a prune after the grace period)")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from ..remote import keys

    if args.action == "generate":
        public = keys.write_pair(Path(args.path))
        doc = {"private": str(args.path), "public": f"{args.path}.pub", "key_id": public.key_id,
               "public_key": str(public)}
        if args.json:
            render.emit_json(doc)
        else:
            render.say(f"wrote {args.path} (private: keep it in CI secrets) and {args.path}.pub")
            render.say(f"key id {public.key_id}")
            render.say(f"builders:  export ABICACHE_SIGNING_KEY={args.path}")
            render.say(f"the fleet: export ABICACHE_TRUSTED_KEYS={public}")
        return 0
    path = keys.signing_key_from_env()
    signer = keys.load_signer(path) if path else None
    doc = {"signing_key": str(path or ""), "signing_key_id": signer.public.key_id if signer else "",
           "trusted": [{"key_id": k.key_id, "public_key": str(k)} for k in keys.trusted_from_env()]}
    if args.json:
        render.emit_json(doc)
    else:
        render.say(f"signing key: {doc['signing_key'] or '(none: uploads are unsigned)'}"
                   + (f" (id {doc['signing_key_id']})" if signer else ""))
        render.table("trusted keys (ABICACHE_TRUSTED_KEYS)", ["key id", "public key"],
                     [(k["key_id"], k["public_key"]) for k in doc["trusted"]])
    return 0
