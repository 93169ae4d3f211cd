"""Hit and miss statistics per store, as `ccache -s` and `sccache --show-stats` keep them.

A hit writes nothing (tests/test_light.py): counts are kept in this process's
memory and appended to log/stats.jsonl as one line (one write with O_APPEND:
lines of concurrent processes never interleave, and no lock is taken) when a
miss writes anyway, and when the process exits. `abicache stats` sums the
lines; `abicache stats --zero` starts them again. A process killed with
SIGKILL loses the counts it had not written yet, never another's.

Counted: hits (local, from a read-only store, from a remote), misses, builds and
their seconds, builds that could not be cached (by reason), the seconds hits saved
(each entry's recorded build time), and errors (by kind).
"""

from __future__ import annotations

from _thread import allocate_lock  # threading.Lock itself, without importing threading on a hit
import atexit
import json
import os
import time
from collections import Counter

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Sequence

if TYPE_CHECKING:
    from .local import Store

LOG = "stats"
FIELDS = ("hits_local", "hits_read_only", "hits_remote", "misses", "builds", "build_seconds", "seconds_saved",
          "uncacheable", "errors", "hits_record")
#: counts by reason and by kind: "uncacheable:<reason>", "errors:<kind>", "unrecorded:<reason>"
#: (a full lookup that wrote no hit record: hits/writer.py); and per kind of entry, as
#: ccache's counters (its direct hits, misses, uncacheable calls): "kind:<kind>:<field>".
#: hits_record: the local hits a hit record served (as ccache's direct hits, a part of hits_local)
BREAKDOWNS = ("uncacheable:", "errors:", "kind:", "unrecorded:")
#: what each kind of entry is counted by
KIND_FIELDS = ("hits", "misses", "uncacheable", "errors")

_pending: dict[str, tuple[Store, Counter[str]]] = {}
#: root -> whether the store's folder was there when it was last counted: one that was, and is
#: gone when the counts are written, was removed since (by its user): it is not made again
_there: dict[str, bool] = {}
_lock = allocate_lock()
_registered = False


def _forget_in_child() -> None:
    """A forked child inherits the counts its parent has not written yet: they are the
    parent's to write (at its exit); the child that also wrote them counted each twice."""
    global _pending, _there, _lock
    _pending, _there, _lock = {}, {}, allocate_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def count(store: Store, **amounts: float) -> None:
    """Add to this process's counts for store (memory only)."""
    global _registered
    with _lock:
        held = _pending.get(str(store.root))
        if held is None:
            held = _pending[str(store.root)] = (store, Counter())
            if not _registered:
                _registered = True
                atexit.register(flush)
        held[1].update(amounts)
        _there[str(store.root)] = os.path.isdir(store.layout.base)


def flush(store: Store | None = None) -> None:
    """Append the counts not yet written (of one store, or of all) as one line each."""
    with _lock:
        roots = [str(store.root)] if store is not None else list(_pending)
        taken = [(_pending[r][0], _pending[r][1]) for r in roots if r in _pending and _pending[r][1]]
        for root in roots:
            if root in _pending:
                _pending[root] = (_pending[root][0], Counter())
    for held, counts in taken:
        if _there.get(str(held.root)) and not os.path.isdir(held.layout.base):
            continue  # removed since it was counted: its counts went with it
        line = {k: round(v, 3) if isinstance(v, float) else v for k, v in counts.items()}
        held.log_event(LOG, json.dumps({"time": round(time.time(), 3), "pid": os.getpid(), **line}), _compact)


def _compact(lines: Sequence[str]) -> list[str]:
    """A stats log moved aside (store/logs.py) becomes one line of its sums: totals survive."""
    sums, since, zeroed = _sums(lines)
    return [json.dumps({"time": since, "pid": 0, **({"zeroed": True} if zeroed else {}),
                        **{k: round(v, 3) for k, v in sums.items()}})]


def _sums(lines: Sequence[str]) -> tuple[Counter[str], Any, bool]:
    """(the counts, the first line's time, whether that line marks a zeroing: `stats -z`)."""
    sums: Counter[str] = Counter()
    since, zeroed = None, False
    for text in lines:
        try:
            line = json.loads(text)
        except ValueError:
            continue  # a line cut by a full disk: the others still count
        if not isinstance(line, dict):
            continue
        if since is None:
            since, zeroed = line.get("time"), line.get("zeroed") is True
        sums.update({k: v for k, v in line.items()
                     if (k in FIELDS or k.startswith(BREAKDOWNS)) and isinstance(v, (int, float))})
    return sums, since, zeroed


def totals(store: Store) -> dict[str, Any]:
    """Every count written so far (and this process's pending ones), and since when."""
    flush(store)
    sums, since, zeroed = _sums(store.read_events(LOG))
    doc: dict[str, Any] = {k: round(sums[k], 3) if k.endswith("seconds") or k == "seconds_saved" else int(sums[k])
                           for k in FIELDS}
    hits = doc["hits_local"] + doc["hits_read_only"] + doc["hits_remote"]
    doc["hit_rate"] = round(hits / (hits + doc["misses"]), 4) if hits + doc["misses"] else None
    for prefix, field in (("uncacheable:", "uncacheable_by_reason"), ("errors:", "errors_by_kind"),
                          ("unrecorded:", "unrecorded_by_reason")):
        doc[field] = {k[len(prefix):]: int(v) for k, v in sorted(sums.items()) if k.startswith(prefix)}
    doc["by_kind"] = _by_kind(sums)
    doc["since"] = since
    doc["zeroed_at"] = since if zeroed else None
    return doc


def by_kind(kind: str, field: str) -> str:
    """The name a count of one kind of entry is kept under (KIND_FIELDS)."""
    return f"kind:{kind}:{field}"


def _by_kind(sums: Counter[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, value in sorted(sums.items()):
        kind, _, field = name[len("kind:"):].rpartition(":")
        if name.startswith("kind:") and kind and field in KIND_FIELDS:
            out.setdefault(kind, dict.fromkeys(KIND_FIELDS, 0))[field] = int(value)
    return out


def zero(store: Store) -> None:
    """Start counting again (this process's pending counts are dropped too)."""
    with _lock:
        if str(store.root) in _pending:
            _pending[str(store.root)] = (store, Counter())
    from . import logs

    logs.remove(store.layout.log, LOG)
    # the first line says when (ccache -s: "stats zeroed"): counting starts there, not at the next build
    store.log_event(LOG, json.dumps({"time": round(time.time(), 3), "pid": os.getpid(), "zeroed": True}), _compact)
