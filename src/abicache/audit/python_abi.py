"""Python ABI from imports: none, abi3 >= 3.x, exact cpXY, free-threaded.

Symbols are a lower bound: they can prove a claimed abi3 wrong (a symbol
outside the limited API, or one added after the claimed version), but they
never relax an exact cpXY claim to abi3 (macros leave no symbol behind).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, NamedTuple

from ..values import versions
from ..values.requirements import Requirements
from .elf import ElfInfo
from .findings import Finding, finding, sample

FREE_THREADED = frozenset({"_Py_DecRefShared", "_Py_MergeZeroLocalRefcount", "_Py_IncRefShared",
                           "_Py_ExplicitMergeRefcount", "_Py_BRC_QueueObject"})
_TAG = re.compile(r"\.(?:cpython-(\d)(\d+)([td]*)-[^.]*|abi3)\.so$")


@lru_cache(maxsize=1)
def limited_api() -> dict[str, str]:
    """Limited-API symbol -> the Python version that added it (from abi3info)."""
    import abi3info  # pypa's data on the stable ABI

    out = {}
    for table in (abi3info.FUNCTIONS, abi3info.DATAS):
        for symbol, item in table.items():
            out[symbol.name] = f"{item.added.major}.{item.added.minor}"
    return out


class PythonImports(NamedTuple):
    names: tuple[str, ...]
    outside_limited: tuple[str, ...]
    newest: str | None  # the latest "added" version among limited imports
    newest_names: tuple[str, ...]
    free_threaded: tuple[str, ...]


def classify(info: ElfInfo) -> PythonImports:
    names = tuple(sorted(s.name for s in info.imports if s.name.startswith(("Py", "_Py"))))
    limited = limited_api() if names else {}  # abi3info only for Python extensions
    outside = tuple(n for n in names if n not in limited)
    newest, newest_names = None, []
    for name in names:
        added = limited.get(name)
        if added is None:
            continue
        if newest is None or versions.compare(added, newest) > 0:
            newest, newest_names = added, [name]
        elif added == newest:
            newest_names.append(name)
    return PythonImports(names, outside, newest, tuple(newest_names),
                         tuple(n for n in names if n in FREE_THREADED))


#: the value of a requirement the binary does not record: it can never be shown to hold
UNKNOWN = "unknown"


def claim_from_filename(path: str) -> Requirements:
    """What an extension module's file name promises: cp311, cp313t, or abi3."""
    match = _TAG.search(path)
    if match is None:
        return Requirements()
    if match.group(0) == ".abi3.so":
        return Requirements.of(["python.abi3 >= 3.2"])
    major, minor, flags = match.groups()
    return Requirements.of([f"python.abi == cp{major}{minor}{flags}"])


def audit(info: ElfInfo, claims: Requirements, from_filename: bool = False,
          built_for: str | None = None) -> tuple[list[Finding], list[str], dict[str, Any]]:
    """Findings and problems for the Python side of a host library.

    from_filename: the claim came from an '.abi3.so' name, which says abi3 but
    not from which version: the symbols set the floor instead of contradicting it.
    built_for: the ABI of the interpreter a fresh build was made in (the cache's
    case), which is what an untagged full-API module needs.
    """
    found = classify(info)
    claimed = {r.name: r for r in claims if r.name in ("python.abi", "python.abi3")}
    summary = {"python_imports": len(found.names), "outside_limited_api": len(found.outside_limited),
               "limited_api_floor": found.newest, "free_threaded": bool(found.free_threaded)}
    if not found.names and not claimed:
        return [], [], summary
    if "python.abi3" in claimed:
        floor = claimed["python.abi3"].value
        if from_filename:
            floor = found.newest or floor
        return _abi3(found, floor) + (summary,)
    if "python.abi" in claimed:
        return _exact(found, claimed["python.abi"].value) + (summary,)
    if built_for:
        return _exact(found, built_for)[0], [], summary
    # No tag: the CPython minor it was compiled for is recorded nowhere. Even imports all in the limited
    # API prove nothing: without Py_LIMITED_API, macros read object layouts that change between minors.
    how = (f"built against the full C API ({len(found.outside_limited)} imports outside the limited API, "
           f"e.g. {sample(found.outside_limited)})" if found.outside_limited else
           f"its {len(found.names)} CPython imports ({sample(found.names)}) are in the limited API, but nothing "
           "says it was compiled for it (Py_LIMITED_API, an .abi3.so name), and the full API's macros read "
           "object layouts that change between minors")
    evidence = (f"{how}; no ABI tag in its file name (.cpython-311-x86_64-linux-gnu.so) says for which "
                "CPython: rename it with its tag, or build it with abicache, to have that checked")
    return [finding(f"python.abi == {UNKNOWN}", evidence)], [], summary


def _abi3(found: PythonImports, claimed: str) -> tuple[list[Finding], list[str]]:
    problems = []
    if found.outside_limited:
        problems.append(f"claims abi3 but imports {len(found.outside_limited)} symbols outside the "
                        f"limited API: {sample(found.outside_limited, 8)}")
    if found.newest and versions.compare(found.newest, claimed) > 0:
        problems.append(f"claims abi3 >= {claimed} but imports {sample(found.newest_names)}, "
                        f"in the limited API only since {found.newest}")
    if found.free_threaded:
        problems.append(f"claims abi3 but imports free-threaded internals: {sample(found.free_threaded)}")
    floor = found.newest if found.newest and versions.compare(found.newest, claimed) > 0 else claimed
    evidence = (f"all {len(found.names)} CPython imports are in the limited API"
                + (f", the newest from {found.newest} ({sample(found.newest_names)})" if found.newest else ""))
    return [finding(f"python.abi3 >= {floor}", evidence)], problems


def _exact(found: PythonImports, claimed: str) -> tuple[list[Finding], list[str]]:
    problems = []
    if found.free_threaded and not claimed.endswith("t"):
        problems.append(f"claims {claimed} but imports free-threaded internals "
                        f"({sample(found.free_threaded)}): it is a {claimed}t module")
    evidence = (f"built against the full C API ({len(found.outside_limited)} imports outside the limited API, "
                f"e.g. {sample(found.outside_limited)})" if found.outside_limited
                else "declared for this interpreter's ABI")
    return [finding(f"python.abi == {claimed}", evidence)], problems
