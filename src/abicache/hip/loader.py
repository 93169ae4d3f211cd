"""Find and load the HIP runtime, libamdhip64, across ROCm 5, 6 and 7.

Search order, for each major from the requested one (or newest first):
  1. a copy already loaded in this process (torch +rocm loads its own),
  2. the explicit override: $ABICACHE_LIBAMDHIP64 (a file or a folder),
  3. pip wheels: torch's own lib folder (ROCm builds of torch bundle the
     runtime) and TheRock's rocm-sdk wheels (_rocm_sdk_core/lib),
  4. $ROCM_PATH/lib and $HIP_PATH/lib,
  5. /opt/rocm/lib, then versioned installs /opt/rocm-X.Y.Z/lib, newest first,
  6. the system loader (dlopen by soname: LD_LIBRARY_PATH, ld.so.cache).
The first that loads wins and pins its major for the process; its major is
read back with hipRuntimeGetVersion (ROCm 6.2.4 reports 60241134: major
first). When nothing loads, the error lists every place tried and why.
"""

from __future__ import annotations

import ctypes
import os
import re
import sysconfig
from pathlib import Path

from ..errors import AbicacheError
from ..native.libload import Attempt, LoadedLibrary, first_loadable, loaded_paths, tried

SONAMES = {7: "libamdhip64.so.7", 6: "libamdhip64.so.6", 5: "libamdhip64.so.5"}
OVERRIDE = "ABICACHE_LIBAMDHIP64"

_pinned: list[LoadedLibrary] = []


class HipLibraryNotFound(AbicacheError):
    def __init__(self, majors: list[int], attempts: list[Attempt]) -> None:
        wanted = ", ".join(SONAMES[m] for m in majors)
        lines = [f"could not load {wanted}; tried, in order:", *tried(attempts),
                 f"To fix: install ROCm (its lib folder is /opt/rocm/lib), or point {OVERRIDE} at the file."]
        super().__init__("\n".join(lines))
        self.attempts = tuple(attempts)


def load_library(*, major: int | None = None) -> LoadedLibrary:
    """Load libamdhip64, pinning its major for this process."""
    if _pinned:
        pinned = _pinned[0]
        if major is not None and pinned.major != major:
            raise AbicacheError(f"the HIP runtime {pinned.major} is already loaded in this process from "
                                f"{pinned.path}; one major per process, so {major} cannot be loaded too")
        return pinned
    majors = _majors(major)
    attempts: list[Attempt] = []
    loaded = first_loadable("amdhip64", majors, candidates, attempts, major_of=_major_of)
    if loaded is None:
        raise HipLibraryNotFound(majors, attempts)
    _pinned.append(loaded)
    return loaded


def locate(major: int | None = None) -> tuple[int, str] | None:
    """(major, file) that load_library would load, without loading it; None
    when only the system loader could tell."""
    if _pinned:
        return _pinned[0].major, _pinned[0].path
    for wanted in _majors(major):
        for _, path in candidates(wanted):
            if "/" not in path:
                return None
            if Path(path).is_file():
                return wanted, path
    return None


def candidates(major: int) -> list[tuple[str, str]]:
    """(where, path or soname) in search order for one major."""
    soname = SONAMES[major]
    out = [("already loaded", p) for p in loaded_paths(soname)]
    override = os.environ.get(OVERRIDE)
    if override:
        out.append((f"override {OVERRIDE}", str(Path(override) / soname) if Path(override).is_dir() else override))
    purelib = Path(sysconfig.get_paths()["purelib"])
    out += [("pip wheel", str(purelib / sub / "lib" / soname)) for sub in ("torch", "_rocm_sdk_core")]
    for variable in ("ROCM_PATH", "HIP_PATH"):
        if os.environ.get(variable):
            out.append((f"${variable}", str(Path(os.environ[variable]) / "lib" / soname)))
    out.append(("/opt/rocm", f"/opt/rocm/lib/{soname}"))
    out += [(str(folder), str(folder / "lib" / soname)) for folder in _versioned_installs()]
    out.append(("system loader", soname))
    return out


def _majors(major: int | None) -> list[int]:
    if major is None:
        return sorted(SONAMES, reverse=True)
    if major not in SONAMES:
        raise AbicacheError(f"HIP runtime major {major} is not supported; use one of "
                            f"{', '.join(map(str, sorted(SONAMES)))}")
    return [major]


def _versioned_installs(root: Path = Path("/opt")) -> list[Path]:
    """/opt/rocm-6.4.1 and the like, the newest version first."""
    try:
        found = [p for p in root.iterdir() if re.fullmatch(r"rocm-\d+(\.\d+)*", p.name)]
    except OSError:
        return []
    return sorted(found, key=lambda p: tuple(int(x) for x in p.name[5:].split(".")), reverse=True)


def _major_of(handle: ctypes.CDLL) -> int | None:
    value = ctypes.c_int(0)
    try:
        ok = handle.hipRuntimeGetVersion(ctypes.byref(value)) == 0
    except AttributeError:
        return None
    return value.value // 10_000_000 if ok and value.value >= 10_000_000 else None


def describe() -> list[dict[str, str]]:
    """For `abicache env`: what loads here, or why not (loads the library)."""
    try:
        lib = load_library()
    except HipLibraryNotFound as exc:
        return [{"library": "amdhip64", "major": "-", "path": "not found",
                 "found via": f"{len(exc.attempts)} places tried"}]
    return [{"library": "amdhip64", "major": str(lib.major), "path": lib.path, "found via": lib.found_via}]
