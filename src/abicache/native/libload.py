"""Load one versioned shared library (a GPU runtime) from places tried in order,
remembering every place and why it failed: the machinery the CUDA loader
(cuda/loader.py) and the HIP loader (hip/loader.py) share. Each of those
says where to look for which soname, and how to read the major a loaded
library reports; this module tries them and pins the first that loads.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Optional


class Attempt(NamedTuple):
    where: str  # "override", "pip wheel", "system loader", ...
    path: str
    error: str | None  # None: it loaded


class LoadedLibrary(NamedTuple):
    name: str
    major: int
    path: str
    found_via: str
    handle: ctypes.CDLL
    attempts: tuple[Attempt, ...]


#: (where, path or bare soname) in search order
Candidates = Iterable[tuple[str, str]]
#: a reason not to load a file that exists (None: go ahead)
Vetting = Callable[[str, int], Optional[str]]
#: the major a loaded library reports (None: trust the soname's)
MajorOf = Callable[[ctypes.CDLL], Optional[int]]


def first_loadable(name: str, majors: Iterable[int], candidates: Callable[[int], Candidates],
                   attempts: list[Attempt], vet: Vetting | None = None,
                   major_of: MajorOf | None = None) -> LoadedLibrary | None:
    """The first candidate of the first major that loads; every try is appended to attempts."""
    for major in majors:
        for where, path in candidates(major):
            loaded = try_load(name, major, where, path, attempts, vet, major_of)
            if loaded is not None:
                return loaded
    return None


def try_load(name: str, major: int, where: str, path: str, attempts: list[Attempt],
             vet: Vetting | None = None, major_of: MajorOf | None = None) -> LoadedLibrary | None:
    is_file = "/" in path
    if is_file and not Path(path).is_file():
        attempts.append(Attempt(where, path, "no such file"))
        return None
    problem = vet(path, major) if vet is not None and is_file else None
    if problem is not None:
        attempts.append(Attempt(where, path, problem))
        return None
    try:
        handle = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:  # ctypes puts dlerror()'s text in the message
        attempts.append(Attempt(where, path, str(exc)))
        return None
    real = path_of(path)
    attempts.append(Attempt(where, real, None))
    found = major_of(handle) if major_of is not None else None
    return LoadedLibrary(name, found or major, real, where, handle, tuple(attempts))


def loaded_paths(soname: str) -> list[str]:
    """Files of that soname mapped in this process (Linux)."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return sorted({line.split()[-1] for line in maps if line.rstrip().endswith("/" + soname)})
    except OSError:
        return []


def path_of(fallback: str) -> str:
    """The file the loader actually mapped for a soname or path."""
    paths = loaded_paths(Path(fallback).name)
    return paths[0] if len(paths) == 1 else fallback


def tried(attempts: Iterable[Attempt]) -> list[str]:
    return [f"  {a.where}: {a.path}: {a.error}" for a in attempts]
