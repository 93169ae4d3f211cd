"""Folders whose contents the key already covers, so the files a compiler
reads there are not recorded as dependencies.

- the compiler's own search list (`cc -E -v`), whose contents come with the
  compiler and the platform it identifies — except /usr/local/include, where
  users install third-party headers (a CUTLASS checkout, say), which are
  recorded like project headers;
- roots a frontend names because their identity is in its key: the torch
  install's include folder (torch.build), the CUDA toolkit's (cuda.nvcc),
  Python's (python.abi).

Search order: the frontend's roots, then the compiler's list; every path is
normalized (os.path.normpath of the absolute path), never resolved through
links, to match what depfiles name.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

#: never covered, though compilers search them: users put their own headers there
_UNCOVERED = ("/usr/local/include",)
_memo: dict[tuple[str, ...], tuple[str, ...]] = {}


def compiler_dirs(compiler: Sequence[str], lang: str = "c++") -> tuple[str, ...]:
    """The compiler's system include folders (memoized per command, per process:
    this runs only when something is built)."""
    key = (*compiler, lang)
    found = _memo.get(key)
    if found is None:
        found = _memo[key] = _ask(compiler, lang)
    return found


def _ask(compiler: Sequence[str], lang: str) -> tuple[str, ...]:
    import subprocess  # only when something is built

    try:
        done = subprocess.run([*compiler, f"-x{lang}", "-E", "-v", "-"], input="", capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    dirs, inside = [], False
    for line in done.stderr.splitlines():
        if line.startswith("#include <...> search starts here"):
            inside = True
        elif line.startswith("End of search list"):
            break
        elif inside and line.startswith(" "):
            folder = normal(line.strip().removesuffix(" (framework directory)"))
            if folder not in _UNCOVERED:
                dirs.append(folder)
    return tuple(dirs)


def normal(path: str, cwd: str | None = None) -> str:
    return os.path.normpath(os.path.join(cwd or os.getcwd(), path))


def under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)
