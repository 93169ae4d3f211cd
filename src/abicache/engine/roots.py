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
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

#: never covered, though compilers search them: users put their own headers there
_UNCOVERED = ("/usr/local/include",)
_memo: dict[tuple[str, ...], tuple[str, ...]] = {}


def compiler_dirs(compiler: Sequence[str], lang: str = "c++", memo_dir: Path | None = None) -> tuple[str, ...]:
    """The compiler's system include folders: memoized per process, and under
    memo_dir (the store's tools/) by the compiler binary's stat, as its identity
    is, so a build does not pay a compiler process for them (30 ms a build)."""
    return compiler_dirs_later(compiler, lang, memo_dir)()


def compiler_dirs_later(compiler: Sequence[str], lang: str = "c++",
                        memo_dir: Path | None = None) -> Callable[[], tuple[str, ...]]:
    """compiler_dirs, for later: the compiler process it may need is started
    now and read when the result is asked for, so the build engine runs it
    beside its first compiles (10 ms before them otherwise), with no thread."""
    key = (*compiler, lang)
    if key in _memo:
        return lambda: _memo[key]
    from ..env import toolid

    path = toolid.which(compiler[0]) if compiler else None
    what = "include search list " + " ".join([f"-x{lang}", *compiler[1:]])
    known = _parsed(toolid.recall(path, what, memo_dir)) if path is not None and memo_dir is not None else None
    if known is not None:
        _memo[key] = known
        return lambda: known
    asking = _start(compiler, lang)
    lock = threading.Lock()

    def result() -> tuple[str, ...]:
        with lock:  # the build's worker threads may all ask at once
            if key not in _memo:
                found = _memo[key] = _read(asking)
                if path is not None and memo_dir is not None:
                    toolid.remember(path, what, json.dumps(found), memo_dir)
        return _memo[key]

    return result


def _parsed(text: str | None) -> tuple[str, ...] | None:
    try:
        return None if text is None else tuple(str(d) for d in json.loads(text))
    except (ValueError, TypeError):
        return None


def _start(compiler: Sequence[str], lang: str) -> Any:
    import subprocess  # only when something is built

    try:
        return subprocess.Popen([*compiler, f"-x{lang}", "-E", "-v", "-"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError:
        return None


def _read(asking: Any) -> tuple[str, ...]:
    import subprocess

    if asking is None:
        return ()
    try:
        _, stderr = asking.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        asking.kill()
        asking.communicate()
        return ()
    dirs, inside = [], False
    for line in stderr.splitlines():
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
