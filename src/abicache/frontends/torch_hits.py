"""What a torch extension's hit record is named by: the call, and the torch this process runs.

A torch extension is keyed on the installed torch's build (torch.build: version, git,
CUDA/HIP, C++ ABI) and found at its root, facts a C library's record does not name
(hits/naming.py). Loading one imports torch anyway, so the record's call holds those
facts as the live torch module gives them (the full lookup reads the same ones then:
env/probes.py _live_torch; tests/test_torch_hits.py keeps the two equal); a record is
written only where the facts its lookup used are these (hits/writer.py), and the files the
lookup read of that torch beyond them (cpp_extension.py, whose build lines are memoized,
and the stable ABI's version.h) are its witnesses. Nothing here imports more than os and
sys: a hit served by its record imports no plan, store or engine module.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Mapping

#: the facts a torch call's record names (env/probes.py TORCH_FACTS)
NAMED = ("torch.version", "torch.git", "torch.cuda", "torch.hip", "torch.cxx11abi", "torch.build", "torch.flavor",
         "torch.root")
#: torch_lines.py's memo of cpp_extension.py
LINES_MEMO = "cpp_extension build lines v1"


def facts() -> dict[str, str | None] | None:
    """The torch facts of the torch module this process imported (as env/probes.py reads
    them), or None where none is imported."""
    mod = sys.modules.get("torch")
    version = getattr(mod, "version", None)
    where = getattr(mod, "__file__", None)
    if version is None or not where:
        return None
    abi = getattr(getattr(mod, "_C", None), "_GLIBCXX_USE_CXX11_ABI", None)
    found: dict[str, str | None] = {
        "torch.version": str(version.__version__),
        "torch.git": getattr(version, "git_version", None),
        "torch.cuda": getattr(version, "cuda", None),
        "torch.hip": getattr(version, "hip", None),
        "torch.cxx11abi": None if abi is None else str(int(bool(abi))),
        "torch.root": os.path.dirname(where),
    }
    found["torch.build"] = "/".join([found["torch.version"] or "unknown"] + [
        f"{k}={found[f'torch.{k}'] or 'none'}" for k in ("git", "cuda", "hip", "cxx11abi")])
    local = (found["torch.version"] or "").partition("+")[2]
    found["torch.flavor"] = ("cuda" if found["torch.cuda"] else "rocm" if found["torch.hip"]
                             else "xpu" if local.startswith("xpu") else "cpu")
    return found


def files(named: Mapping[str, str | None]) -> list[tuple[str, str | None]]:
    """The files of this torch a lookup reads beyond its facts, each with the name of its
    memo under the store's tools/ (None: read, not memoized)."""
    root = named.get("torch.root") or ""
    return [(os.path.join(root, "utils", "cpp_extension.py"), LINES_MEMO),
            (os.path.join(root, "include", "torch", "csrc", "stable", "version.h"), None)]


def call(frontend: str, name: str, sources: Any, args: Mapping[str, Any]) -> tuple[bytes, dict[str, str | None]] | None:
    """(the call as a record names it, the torch facts it names), or None where no record
    may stand for it: no torch imported, a build folder to copy into on every call
    (build_directory), a verbose call, an argument of a type a record does not name."""
    if args.get("build_directory") is not None or args.get("verbose"):
        return None  # a copy made on every call; what a verbose call says of its lookup
    named = facts()
    if named is None:
        return None
    from ..hits import naming

    made = naming.call_of(frontend, name, sources, torch=repr(sorted(named.items())),
                          **{k: v for k, v in args.items() if k != "cache"})
    return None if made is None else (made, named)
