"""`abicache audit FILE...` and `abicache doctor [PATH...]`."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import Any, Iterator

from ..env import Facts
from ..errors import AbicacheError
from . import render

#: JIT caches people already have, with the variable that moves each one.
KNOWN_CACHES = (
    ("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions"),
    ("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi"),
    ("TRITON_CACHE_DIR", "~/.triton/cache"),
    ("FLASHINFER_WORKSPACE_BASE", "~/.cache/flashinfer"),
)
#: how deep below each cache's root one entry's folder is: py311_cu128/<name>, <name>_<hash>,
#: <hash>, <version>/<archs>/cached_ops/<uri>
_ENTRY_DEPTH = {"TORCH_EXTENSIONS_DIR": 2, "TVM_FFI_CACHE_DIR": 1, "TRITON_CACHE_DIR": 1,
                "FLASHINFER_WORKSPACE_BASE": 4}
_BINARY_SUFFIXES = (".so", ".cubin", ".ptx", ".fatbin")
UNKNOWN_TORCH = "torch.build == unknown"
#: requirements whose value the binary does not record: neither met nor refuted, unverifiable
UNVERIFIABLE = (UNKNOWN_TORCH, "python.abi == unknown")


def assumed_facts(assume: list[str]) -> Facts:
    from ..env.facts import FACT_NAMES

    overrides: dict[str, str | None] = {}
    for item in assume or ():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise AbicacheError(f"--assume {item!r}: write it as FACT=VALUE, e.g. gpu.arch=sm_80")
        if name.strip() not in FACT_NAMES:  # a typo would otherwise be accepted and change nothing
            raise AbicacheError(f"--assume {item!r}: no fact is named {name.strip()!r}; the facts are "
                                + ", ".join(FACT_NAMES))
        overrides[name.strip()] = value.strip() or None
    return Facts().with_overrides({**_unknown_with(overrides), **overrides})


#: facts measured together of one install: assuming one says another install, whose other
#: facts this one's are not (torch.version=2.14.0 with this torch 2.13's torch.build "loaded" a
#: 2.13-only extension); those not given are unknown, and a requirement on them is unmet
_ONE_INSTALL = (
    ("torch.version", "torch.git", "torch.cuda", "torch.hip", "torch.cxx11abi", "torch.build", "torch.flavor",
     "torch.root"),
    ("python.implementation", "python.version", "python.abi", "python.abi3"),
)


def _unknown_with(overrides: dict[str, str | None]) -> dict[str, str | None]:
    return {other: None for group in _ONE_INSTALL if any(n in overrides for n in group)
            for other in group if other not in overrides}


def _judge(path: Path, facts: Facts) -> dict[str, Any]:
    from ..audit import AuditError, audit_file

    try:
        audited = audit_file(path, facts=facts)
    except AuditError as exc:
        return {"path": str(path), "kind": "unreadable", "error": str(exc), "requirements": [],
                "problems": [str(exc)], "unmet": []}
    doc = audited.to_dict()
    unmet = {str(u.requirement): u.reason for u in audited.requirements().unmet(facts)}
    for row in doc["requirements"]:
        row["holds_here"] = None if row["requirement"] in UNVERIFIABLE else row["requirement"] not in unmet
    # "torch.build == unknown", "python.abi == unknown": no evidence either way (the binary does
    # not record it); missing symbols, if any, are already a problem.
    doc["unverifiable"] = [f"{k}: {row['evidence']}" for row in doc["requirements"]
                           for k in [row["requirement"]] if k in UNVERIFIABLE]
    doc["unmet"] = [r for k, r in unmet.items() if k not in UNVERIFIABLE]
    return doc


def cmd_audit(args: argparse.Namespace) -> int:
    facts = assumed_facts(args.assume)
    docs = [_judge(Path(f), facts) for f in args.files]
    if args.json:
        render.emit_json(docs)
    for doc in docs if not args.json else ():
        _print_audit(doc)
    if any(d["kind"] in ("unreadable", "data") for d in docs):  # nothing judged is no "fine"
        return 2
    return 1 if any(d["problems"] or d["unmet"] or d.get("unverifiable") for d in docs) else 0


def _print_audit(doc: dict[str, Any]) -> None:
    render.say(f"[bold]{doc['path']}[/]: {doc['kind']}")
    if doc["kind"] == "unreadable":
        render.say(f"  [red]cannot audit[/]: {doc['error']}")
        return
    if doc["kind"] == "data":
        render.say("  not a binary abicache reads (shared library, extension module, executable, cubin, "
                   "fatbin, PTX or AMDGPU code object): nothing to judge")
    elif doc["requirements"]:
        render.table("requirements", ["requirement", "here", "because"],
                     [(r["requirement"], {True: "yes", False: "NO", None: "?"}[r["holds_here"]], r["evidence"])
                      for r in doc["requirements"]])
        if doc.get("unverifiable"):
            render.say("  [yellow]unverifiable[/]: the binary does not record what '?' needs, so abicache "
                       "cannot show that it loads here")
    else:
        render.say("  no requirements: loads anywhere this platform runs")
    for problem in doc["problems"]:
        render.say(f"  [red]problem[/]: {problem}")


def _scan_roots(paths: list[str]) -> list[Path]:
    if paths:
        given = [Path(p).expanduser() for p in paths]
        missing = [str(p) for p in given if not os.path.lexists(p)]
        if missing:  # scanning nothing and saying all is well would be a silent "fine"
            raise AbicacheError(f"doctor: no such file or folder: {', '.join(missing)}; give JIT cache folders or "
                                "binaries to audit (none: the caches abicache knows, where they exist)")
        return given
    roots = []
    for variable, default in KNOWN_CACHES:
        root = Path(os.environ.get(variable) or default).expanduser()
        if root.exists():
            roots.append(root)
    return roots


def _entry_folder(path: Path) -> Path | None:
    """The folder of the cache entry holding path, if it lies in a JIT cache abicache knows;
    None for anything else (an installed package, a user's folder): never suggested for deletion."""
    real = path.resolve()
    for variable, default in KNOWN_CACHES:
        root = Path(os.environ.get(variable) or default).expanduser().resolve()
        try:
            parts = real.relative_to(root).parts
        except ValueError:
            continue
        depth = _ENTRY_DEPTH[variable]
        if len(parts) > depth:  # the file lies inside an entry's folder, not beside the entries
            return root.joinpath(*parts[:depth])
    return None


def _binaries(root: Path) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for folder, _dirs, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(_BINARY_SUFFIXES) or ".so." in name:
                yield Path(folder) / name


def cmd_doctor(args: argparse.Namespace) -> int:
    facts = assumed_facts(args.assume)
    roots = _scan_roots(args.paths)
    files = [p for root in roots for p in _binaries(root)]
    bad, unverifiable = [], []
    with render.Progress("auditing", len(files)) as bar:
        for path in files:
            doc = _judge(path, facts)
            bar.advance()
            reasons = doc["problems"] + doc["unmet"]
            if reasons:
                entry = _entry_folder(path)
                bad.append({"path": str(path), "kind": doc["kind"], "reasons": reasons,
                            "delete": str(entry) if entry else None})
            elif doc.get("unverifiable"):
                unverifiable.append(str(path))
    from .observer_line import default

    observer = default()
    if args.json:
        render.emit_json({"scanned": [str(r) for r in roots], "files": len(files), "unsafe": bad,
                          "unverifiable": unverifiable, "observer": observer})
    else:
        render.say(f"abicache's observer (what compilers read and looked for): {observer}")
        render.say(f"scanned {len(files)} binaries in {len(roots)} caches: "
                   + (", ".join(str(r) for r in roots) or "(none found)"))
        if bad:
            render.table("cannot be safely loaded here", ["file", "why"],
                         [(b["path"], "; ".join(b["reasons"])) for b in bad])
            entries = sorted({b["delete"] for b in bad if b["delete"]})
            if entries:
                render.say("to clean up (each is one cache entry of the tool that built it):")
                for folder in entries:
                    render.say(f"  rm -rf -- {shlex.quote(str(folder))}")  # a name may hold ~, $, spaces
            strays = sum(1 for b in bad if not b["delete"])
            if strays:
                render.say(f"{strays} of these are not inside a cache abicache recognises "
                           f"({', '.join(v for v, _ in KNOWN_CACHES)}): nothing there is suggested for deletion")
        else:
            render.say("nothing found that this environment cannot load")
        if unverifiable:
            render.say(f"{len(unverifiable)} binaries do not record what they need (the torch build a torch "
                       "extension was compiled against, the CPython minor of an untagged module): abicache "
                       "cannot prove them safe. Rebuild them through abicache to have it recorded.")
    return 1 if bad else 0


def cmd_stub(args: argparse.Namespace) -> int:
    from ..cuda import stubs

    functions = [f.strip() for f in args.functions.split(",") if f.strip()]
    majors = [int(m) for m in args.majors.split(",")] if args.majors else None
    stub = stubs.plan(args.library, functions, api_major=args.api_major, guard=args.guard, majors=majors)
    path = stubs.build(args.library, functions, args.out, api_major=stub.api_major, guard=args.guard,
                       soname=args.soname, majors=majors)
    doc = {"library": args.library, "path": str(path), "api_major": stub.api_major,
           "loads": list(stub.majors), "functions": {f.name: list(f.majors) for f in stub.functions},
           "notes": list(stub.notes)}
    if args.json:
        render.emit_json(doc)
        return 0
    render.say(f"built {path} (API of CUDA {stub.api_major}; loads majors {', '.join(map(str, stub.majors))})")
    render.table("functions", ["function", "called on majors"],
                 [(f.name, ", ".join(map(str, f.majors))) for f in stub.functions])
    for note in stub.notes:
        render.say(f"  guarded: {note}")
    return 0
