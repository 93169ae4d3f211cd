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

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

#: never covered, though compilers search them: users put their own headers there
_UNCOVERED = ("/usr/local/include",)
_memo: dict[tuple[str, ...], tuple[str, ...]] = {}


def compiler_dirs(compiler: Sequence[str], lang: str = "c++", memo_dir: Path | None = None) -> tuple[str, ...]:
    """The compiler's system include folders: memoized per process, and under
    memo_dir (the store's tools/) by the compiler binary's stat, as its identity
    is, so a build does not pay a compiler process for them (30 ms a build)."""
    key = (*compiler, lang)
    found = _memo.get(key)
    if found is None:
        found = _memo[key] = _remembered(compiler, lang, memo_dir)
    return found


def _remembered(compiler: Sequence[str], lang: str, memo_dir: Path | None) -> tuple[str, ...]:
    from ..env import toolid

    path = toolid.which(compiler[0]) if compiler else None
    if path is None or memo_dir is None:
        return _ask(compiler, lang)
    what = "include search list " + " ".join([f"-x{lang}", *compiler[1:]])
    text = toolid.memoized(path, what, lambda _: json.dumps(_ask(compiler, lang)), memo_dir)
    try:
        return tuple(str(d) for d in json.loads(text or "[]"))
    except ValueError:
        return _ask(compiler, lang)


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
    if path[:1] == "/" and "/." not in path and "//" not in path and path[-1:] != "/":
        return path  # already normal (what depfiles mostly hold): normpath would return it as it is
    return os.path.normpath(os.path.join(cwd or os.getcwd(), path))


def under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class Within:
    """under(path, roots) for many paths against the same roots: one str.startswith on a tuple."""

    def __init__(self, roots: Iterable[str]) -> None:
        roots = tuple(roots)
        self._exact = frozenset(roots)
        self._prefixes = tuple(r.rstrip("/") + "/" for r in roots)

    def __call__(self, path: str) -> bool:
        return path in self._exact or path.startswith(self._prefixes)
