"""Find and load libcudart, libnvrtc and the driver across CUDA 11, 12 and 13.

Search order, for each major from the requested one (or newest first):
  1. a copy already loaded in this process,
  2. the explicit override: $ABICACHE_CUDART / $ABICACHE_NVRTC / $ABICACHE_LIBCUDA
     (a file or a folder),
  3. pip wheels: nvidia/cu13/lib (CUDA 13), nvidia/cuda_runtime/lib and
     nvidia/cuda_nvrtc/lib (CUDA 11 and 12),
  4. conda: $CONDA_PREFIX/lib,
  5. $CUDA_HOME, $CUDA_PATH, /usr/local/cuda: lib64, then lib,
  6. the system loader (dlopen by soname: LD_LIBRARY_PATH, ld.so.cache).
The first library that loads wins, and pins its major for the process. NVRTC
is accepted only with its builtins library beside it. When nothing loads, the
error lists every place tried and why it failed.

cuda-pathfinder does much of this for CUDA 12 and 13 but cannot be asked for a
major, nor does it know CUDA 11; the tests compare our choice with its.
"""

from __future__ import annotations

import ctypes
import os
import sysconfig
from pathlib import Path

from ..errors import AbicacheError
from ..native.libload import Attempt, LoadedLibrary, Vetting, first_loadable, loaded_paths, tried

__all__ = ["Attempt", "CudaLibraryNotFound", "LoadedLibrary", "candidates", "describe", "load_library", "locate"]

SONAMES: dict[str, dict[int, str]] = {
    "cudart": {13: "libcudart.so.13", 12: "libcudart.so.12", 11: "libcudart.so.11.0"},
    "nvrtc": {13: "libnvrtc.so.13", 12: "libnvrtc.so.12", 11: "libnvrtc.so.11.2"},
    "cuda": {0: "libcuda.so.1"},  # the driver: one soname for every major
}
OVERRIDES = {"cudart": "ABICACHE_CUDART", "nvrtc": "ABICACHE_NVRTC", "cuda": "ABICACHE_LIBCUDA"}
_WHEEL_DIRS = {"cudart": ("cuda_runtime",), "nvrtc": ("cuda_nvrtc",), "cuda": ()}


class CudaLibraryNotFound(AbicacheError):
    def __init__(self, name: str, majors: list[int], attempts: list[Attempt]) -> None:
        wanted = ", ".join(SONAMES[name][m] for m in majors)
        lines = [f"could not load {wanted}; tried, in order:", *tried(attempts)]
        hint = {"cudart": "pip install nvidia-cuda-runtime (13) or nvidia-cuda-runtime-cu12",
                "nvrtc": "pip install nvidia-cuda-nvrtc (13) or nvidia-cuda-nvrtc-cu12",
                "cuda": "install the NVIDIA driver (it is not on PyPI)"}[name]
        lines.append(f"To fix: {hint}, or point {OVERRIDES[name]} at the file.")
        super().__init__("\n".join(lines))
        self.attempts = tuple(attempts)


_pinned: dict[str, LoadedLibrary] = {}


def load_library(name: str, *, major: int | None = None) -> LoadedLibrary:
    """Load one CUDA library ('cudart', 'nvrtc' or 'cuda'), pinning its major."""
    if name not in SONAMES:
        raise AbicacheError(f"unknown CUDA library {name!r}; use one of {', '.join(SONAMES)}")
    pinned = _pinned.get(name)
    if pinned is not None:
        if major is not None and name != "cuda" and pinned.major != major:
            raise AbicacheError(f"{name} {pinned.major} is already loaded in this process from "
                                f"{pinned.path}; one major per process, so {major} cannot be loaded too")
        return pinned
    majors = [major] if major is not None and name != "cuda" else sorted(SONAMES[name], reverse=True)
    if name != "cuda" and majors[0] not in SONAMES[name]:
        raise AbicacheError(f"CUDA {name} major {majors[0]} is not supported; use one of "
                            f"{', '.join(map(str, sorted(SONAMES[name])))}")
    attempts: list[Attempt] = []
    loaded = first_loadable(name, majors, lambda wanted: candidates(name, wanted), attempts, _vet(name),
                            lambda handle: _major_of(name, handle))
    if loaded is None:
        raise CudaLibraryNotFound(name, majors, attempts)
    if name == "nvrtc":
        _load_builtins_beside(loaded.path, loaded.major)
    _pinned[name] = loaded
    return loaded


def _load_builtins_beside(path: str, major: int) -> None:
    """NVRTC opens libnvrtc-builtins by its soname when it compiles. The CUDA 13.0 wheel's
    libnvrtc (the one torch pins) has no $ORIGIN run path, so that open fails even with the
    file beside it; loaded here first, the dynamic loader finds it by that soname."""
    for builtins in sorted(Path(path).parent.glob(f"libnvrtc-builtins.so.{major}*")):
        if ".alt." not in builtins.name:
            try:
                ctypes.CDLL(str(builtins), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            except OSError:
                continue  # NVRTC says so at the first compile, with its own message
            return


def locate(name: str, major: int | None = None) -> tuple[int, str] | None:
    """(major, file) that load_library would load, found without loading it;
    None when only the system loader could tell (then load to know)."""
    pinned = _pinned.get(name)
    if pinned is not None:
        return pinned.major, pinned.path
    majors = [major] if major is not None and name != "cuda" else sorted(SONAMES[name], reverse=True)
    for wanted in majors:
        for where, path in candidates(name, wanted):
            if "/" not in path:
                return None
            if Path(path).is_file() and not (name == "nvrtc" and not list(
                    Path(path).parent.glob(f"libnvrtc-builtins.so.{wanted}*"))):
                return wanted, path
    return None


def candidates(name: str, major: int) -> list[tuple[str, str]]:
    """(where, path or soname) in search order for one major."""
    soname = SONAMES[name][major]
    out = [("already loaded", p) for p in loaded_paths(soname)]
    override = os.environ.get(OVERRIDES[name])
    if override:
        out.append(("override " + OVERRIDES[name], str(Path(override) / soname) if Path(override).is_dir() else override))
    purelib = Path(sysconfig.get_paths()["purelib"])
    wheel_dirs = [purelib / "nvidia" / "cu13" / "lib"] if major >= 13 else \
        [purelib / "nvidia" / sub / "lib" for sub in _WHEEL_DIRS[name]]
    out += [("pip wheel", str(d / soname)) for d in wheel_dirs]
    if os.environ.get("CONDA_PREFIX"):
        out.append(("conda", str(Path(os.environ["CONDA_PREFIX"]) / "lib" / soname)))
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            out += [(f"${variable}", str(Path(os.environ[variable]) / sub / soname)) for sub in ("lib64", "lib")]
    out += [("/usr/local/cuda", f"/usr/local/cuda/{sub}/{soname}") for sub in ("lib64", "lib")]
    out.append(("system loader", soname))
    return out


def _vet(name: str) -> Vetting | None:
    """NVRTC is loadable only with its builtins library beside it."""
    if name != "nvrtc":
        return None
    return lambda path, major: None if list(Path(path).parent.glob(f"libnvrtc-builtins.so.{major}*")) \
        else f"libnvrtc-builtins.so.{major}.* is not beside it"


def _major_of(name: str, handle: ctypes.CDLL) -> int | None:
    value = ctypes.c_int(0)
    try:
        if name == "cudart":
            ok = handle.cudaRuntimeGetVersion(ctypes.byref(value)) == 0
            return value.value // 1000 if ok and value.value else None
        if name == "nvrtc":
            minor = ctypes.c_int(0)
            ok = handle.nvrtcVersion(ctypes.byref(value), ctypes.byref(minor)) == 0
            return value.value if ok and value.value else None
    except AttributeError:
        return None
    return None


def describe() -> list[dict[str, str]]:
    """For `abicache env`: what loads here, or why not (loads the libraries)."""
    rows = []
    for name in SONAMES:
        try:
            lib = load_library(name)
            rows.append({"library": name, "major": str(lib.major) if name != "cuda" else "-",
                         "path": lib.path, "found via": lib.found_via})
        except CudaLibraryNotFound as exc:
            rows.append({"library": name, "major": "-", "path": "not found",
                         "found via": f"{len(exc.attempts)} places tried"})
    return rows
