"""Platform floors from symbol versions: glibc, libstdc++ (GLIBCXX, CXXABI),
the machine, and evidence for the C++ string ABI."""

from __future__ import annotations

import re
from typing import Any

from ..values import versions
from .elf import ElfInfo
from .findings import Finding, finding, sample

_FLOORS = {"GLIBC": "platform.glibc", "GLIBCXX": "platform.glibcxx", "CXXABI": "platform.cxxabi"}
_VERSIONED = re.compile(r"^(GLIBC|GLIBCXX|CXXABI)_(\d+(?:\.\d+)+)$")
_NEW_ABI = ("B5cxx11", "St7__cxx11", "NSt7__cxx11")
_OLD_STRING = re.compile(r"(?:^_ZNSs|^_ZNKSs|Ss[^a-z]|Ss$)")


def findings(info: ElfInfo) -> list[Finding]:
    out = [finding(f"platform.machine == {info.machine}", f"ELF machine of {info.bits}-bit {info.elf_type}")]
    best: dict[str, tuple[str, list[str]]] = {}
    for sym in info.imports:
        match = _VERSIONED.match(sym.version or "")
        if match is None:
            continue
        prefix, number = match.groups()
        old = best.get(prefix)
        if old is None or versions.compare(number, old[0]) > 0:
            best[prefix] = (number, [sym.name])
        elif versions.compare(number, old[0]) == 0:
            old[1].append(sym.name)
    if "GLIBC" in best or "libc.so.6" in info.needed:
        out.append(finding("platform.libc == glibc", "links libc.so.6 with GNU symbol versions"))
    for prefix, (number, names) in sorted(best.items()):
        out.append(finding(f"{_FLOORS[prefix]} >= {number}", f"imports {sample(names)} @{prefix}_{number}"))
    return out


def cxx_abi(info: ElfInfo) -> str:
    """'new' (std::__cxx11), 'old' (COW std::string) or 'unknown'.

    Judged from exports and from imports that libstdc++ does not version
    (libstdc++ itself carries both ABIs, so its own symbols say nothing).
    """
    names = list(info.exports) + [s.name for s in info.imports if not (s.version or "").startswith("GLIBCXX")]
    if any(marker in name for name in names for marker in _NEW_ABI):
        return "new"
    if any(_OLD_STRING.search(name) for name in names if name.startswith("_Z")):
        return "old"
    return "unknown"


def summary(info: ElfInfo) -> dict[str, Any]:
    return {
        "machine": info.machine,
        "soname": info.soname,
        "needed": list(info.needed),
        "imports": len(info.imports),
        "exports": len(info.exports),
        "cxx_abi": cxx_abi(info),
    }
