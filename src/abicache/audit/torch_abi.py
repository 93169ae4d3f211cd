"""PyTorch dependence from imports: exact build, stable ABI (torch >= X.Y), or none.

- Any import of an unstable C++ symbol (c10::, at::, torch:: other than
  torch::stable / torch::headeronly, caffe2::, pybind11::) ties the binary to
  the exact torch build it was compiled against.
- Only C shims (aoti_torch_*, torch_*) mean the LibTorch stable ABI: the binary
  needs a torch at least as new as the newest shim it uses. Each shim's first
  version comes from the installed headers' `#if TORCH_FEATURE_VERSION >=
  TORCH_VERSION_X_Y_Z` guards; unguarded shims date from 2.9, the first stable
  ABI release (the headers say "Minimum compatible version: PyTorch 2.9").
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..values import versions
from ..env import toolid
from ..values.requirements import Requirements
from .elf import ElfInfo, Symbol
from .findings import Finding, demangle, finding, sample

if TYPE_CHECKING:
    from ..values.requirements import FactSource

UNGUARDED_FLOOR = "2.9"
_UNSTABLE = re.compile(r"^_Z(?:N[KRVO]*|T[VIST]N)(3c10|2at|5torch|6caffe2|8pybind11)(?!6stable|10headeronly)")
_SHIM = re.compile(r"^(?:aoti_torch|torch)_[A-Za-z0-9_]+$")
_GUARD = re.compile(r"#\s*if\s+TORCH_FEATURE_VERSION\s*>=\s*TORCH_VERSION_(\d+)_(\d+)_(\d+)")
_DECL = re.compile(r"\b((?:aoti_torch|torch)_[A-Za-z0-9_]+)\s*\(")
_FLAVORS = (("_cuda", "cuda"), ("_hip", "rocm"), ("_xpu", "xpu"), ("_mps", "mps"))
SHIM_HEADERS = ("csrc/stable/c", "csrc/inductor/aoti_torch/c", "csrc/inductor/aoti_torch/generated")


def unstable_imports(info: ElfInfo) -> list[str]:
    return [s.name for s in info.imports if _UNSTABLE.match(s.name)]


def shim_imports(info: ElfInfo) -> list[str]:
    return [s.name for s in info.imports if _SHIM.match(s.name)]


def parse_shim_headers(include: Path) -> dict[str, str]:
    """Shim name -> first torch version that has it, from the version guards."""
    table: dict[str, str] = {}
    for folder in SHIM_HEADERS:
        for header in sorted((include / "torch" / folder).glob("*.h")):
            _scan_header(header.read_text(errors="replace"), table)
    return table


def _scan_header(text: str, table: dict[str, str]) -> None:
    stack: list[str | None] = []  # one entry per open #if: its version guard or None
    pending = 0  # lines left in which the name after AOTI_TORCH_EXPORT may appear
    for line in text.splitlines():
        stripped = line.strip()
        guard = _GUARD.match(stripped)
        if guard:
            major, minor, patch = guard.groups()
            stack.append(f"{major}.{minor}" if patch == "0" else f"{major}.{minor}.{patch}")
        elif re.match(r"#\s*if", stripped):
            stack.append(None)
        elif re.match(r"#\s*endif", stripped) and stack:
            stack.pop()
        elif re.match(r"#\s*el", stripped) and stack:
            stack[-1] = None  # the #else of a version guard is for older targets
        elif "AOTI_TORCH_EXPORT" in line or pending:
            pending = 3 if "AOTI_TORCH_EXPORT" in line else pending - 1
            match = _DECL.search(line)
            if match:
                pending = 0
                active = [v for v in stack if v is not None]
                floor = max(active, key=versions.sort_key) if active else UNGUARDED_FLOOR
                old = table.get(match.group(1))
                if old is None or versions.compare(floor, old) < 0:
                    table[match.group(1)] = floor


def shim_table(facts: FactSource, memo_dir: Path | None = None) -> dict[str, str]:
    root = facts.get("torch.root")
    if not root:
        return {}
    include = Path(root) / "include"
    stamp = include / "torch" / "csrc" / "stable" / "c" / "shim.h"
    if not stamp.is_file():
        return {}
    text = toolid.memoized(stamp, "shim-versions-v1",
                           lambda _: json.dumps(parse_shim_headers(include)), memo_dir)
    return json.loads(text or "{}")


def audit(info: ElfInfo, claims: Requirements, facts: FactSource, memo_dir: Path | None = None,
          built_here: bool = False) -> tuple[list[Finding], list[str], dict[str, Any]]:
    """built_here: the binary was just compiled against the torch in `facts`
    (the cache's case); otherwise its torch build is unknown and its imports
    are checked against the installed torch instead."""
    unstable, shims = unstable_imports(info), shim_imports(info)
    declared_min = next((r.value for r in claims if r.name == "torch.version" and r.op == ">="), None)
    summary = {"torch_unstable_imports": len(unstable), "torch_shim_imports": len(shims)}
    own = _part_of_installed_torch(info.path, facts)  # libtorch_python.so in its own torch: that build
    if unstable:
        found, problems = _exact(unstable, declared_min, facts if built_here or own else None)
        if own:
            found = [f._replace(evidence=f.evidence + "; part of the installed torch, so built with it")
                     for f in found]
        if not built_here:
            problems += _stale(unstable, facts, memo_dir)
        return found, problems, summary
    if shims:
        return _stable(shims, declared_min, facts, memo_dir) + (summary,)
    return [], [], summary


def _part_of_installed_torch(path: str, facts: FactSource) -> bool:
    root = facts.get("torch.root") if facts is not None else None
    if not root:
        return False
    try:
        return Path(path).resolve().is_relative_to(Path(root).resolve())
    except OSError:
        return False


def _exact(unstable: list[str], declared_min: str | None,
           facts: FactSource | None) -> tuple[list[Finding], list[str]]:
    readable = demangle(unstable[:5])
    evidence = f"imports {sample(readable)} ({len(unstable)} unstable torch C++ symbols)"
    problems = []
    if declared_min is not None:
        problems.append(f"declared for the stable ABI (torch >= {declared_min}) but imports "
                        f"{len(unstable)} unstable torch C++ symbols: {sample(demangle(unstable[:8]), 8)}")
    build = (facts.get("torch.build") if facts is not None else None) or "unknown"
    if facts is None:
        evidence += "; the exact build is not recorded in the binary"
    return [finding(f"torch.build == {build}", evidence)], problems


def _stale(unstable: list[str], facts: FactSource, memo_dir: Path | None) -> list[str]:
    """Imports the installed torch cannot satisfy: built against another torch."""
    if not facts.get("torch.root"):
        return []
    missing = missing_in_installed(unstable, facts, memo_dir)
    if not missing:
        return []
    return [f"imports {len(missing)} torch symbols that the installed torch {facts.get('torch.version')} "
            f"does not export, e.g. {sample(demangle(missing[:3]))}: it was built against another torch"]


def _stable(shims: list[str], declared_min: str | None, facts: FactSource,
            memo_dir: Path | None) -> tuple[list[Finding], list[str]]:
    table = shim_table(facts, memo_dir)
    installed = _release(facts.get("torch.version"))
    needs: dict[str, list[str]] = {}
    for shim in shims:
        version = table.get(shim) or installed or UNGUARDED_FLOOR
        needs.setdefault(version, []).append(shim)
    floor = max(needs, key=versions.sort_key)
    unknown = [s for s in shims if s not in table]
    evidence = (f"imports only C shims ({len(shims)}); the newest, {sample(needs[floor])}, "
                f"appeared in torch {floor}")
    if unknown:
        evidence += f"; not in the installed headers: {sample(unknown)}"
    problems = []
    if declared_min is not None and versions.compare(floor, declared_min) > 0:
        problems.append(f"targets torch {declared_min} but uses shims added later: "
                        + "; ".join(f"{sample(n, 6)} ({v})" for v, n in sorted(needs.items())
                                    if versions.compare(v, declared_min) > 0))
    out = [finding(f"torch.version >= {floor}", evidence)]
    for marker, flavor in _FLAVORS:
        flavored = [s for s in shims if marker in s]
        if flavored:
            out.append(finding(f"torch.flavor in {flavor}", f"imports {sample(flavored)}"))
    return out, problems


def _release(version: str | None) -> str | None:
    if not version:
        return None
    match = re.match(r"\d+\.\d+", version)
    return match.group(0) if match else None


def missing_in_installed(imports: list[str], facts: FactSource, memo_dir: Path | None = None) -> list[str]:
    """Unstable torch imports that the installed torch's libraries do not export."""
    exported = installed_exports(facts, memo_dir)
    return [name for name in imports if name not in exported]


def installed_exports(facts: FactSource, memo_dir: Path | None = None) -> frozenset[str]:
    from . import elf

    root = facts.get("torch.root")
    if not root:
        return frozenset()
    names: set[str] = set()
    for lib in sorted((Path(root) / "lib").glob("lib*.so*")):
        text = toolid.memoized(lib, "exports-v2", lambda p: "\n".join(elf.parse(p).exports), memo_dir)
        names.update((text or "").split("\n"))
    return frozenset(names)


__all__ = ["Symbol", "audit", "missing_in_installed", "parse_shim_headers", "shim_table"]
