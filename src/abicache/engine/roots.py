"""Folders whose contents the key already covers, so the files a compiler
reads there are not recorded as dependencies.

- only with ABICACHE_SLOPPINESS=system_headers: the compiler's own search
  list (`cc -E -v` with the build's flags, without the folders CPATH and its
  kind add), as ccache's sloppiness of that name — except /usr/local/include,
  where users install third-party headers (a CUTLASS checkout, say), which
  are recorded like project headers. By default system headers are recorded
  like any other: a distribution's -dev package upgraded is a miss;
- roots a frontend names because their identity is in its key: the torch
  install's include folder (torch.build), the CUDA toolkit's (cuda.nvcc),
  Python's (python.abi).

Search order: the frontend's roots, then (only with ABICACHE_SLOPPINESS=
system_headers) the compiler's list, asked with the build's own flags and
environment; every path is made absolute (normal()), never resolved through
links, to match what depfiles name.
"""

from __future__ import annotations

from _thread import allocate_lock  # threading.Lock itself, without importing threading on a hit
import json
import os
from pathlib import Path

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Sequence

#: never covered, though compilers search them: users put their own headers there
_UNCOVERED = ("/usr/local/include",)
_memo: dict[tuple[str, ...], tuple[str, ...]] = {}


#: variables that add folders to the search list: those folders are the user's, never the compiler's
_USER_PATHS = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "OBJCPLUS_INCLUDE_PATH")
#: flags that name include folders of the user's (left out of the probe)
_USER_DIRS = ("-I", "-isystem", "-iquote", "-idirafter", "--include-path")


def sloppy_system_headers() -> bool:
    from ..settings import config

    # through config, not os.environ: the user's config file sets it too (a store's may only clear it)
    return "system_headers" in config.text("ABICACHE_SLOPPINESS").replace(",", " ").split()


def compiler_dirs(compiler: Sequence[str], lang: str = "c++", memo_dir: Path | None = None,
                  flags: Sequence[str] = ()) -> tuple[str, ...]:
    """The compiler's system include folders for these flags: memoized per
    process, and under memo_dir (the store's tools/) by the compiler binary's
    stat, the flags and the environment that moves them, so a build does not
    pay a compiler process for them (30 ms a build)."""
    return compiler_dirs_later(compiler, lang, memo_dir, flags)()


def compiler_dirs_later(compiler: Sequence[str], lang: str = "c++", memo_dir: Path | None = None,
                        flags: Sequence[str] = ()) -> Callable[[], tuple[str, ...]]:
    """compiler_dirs, for later: the compiler process it may need is started
    now and read when the result is asked for, so the build engine runs it
    beside its first compiles (10 ms before them otherwise), with no thread."""
    from . import steer

    probe_flags = _system_flags(flags)
    key = (*compiler, lang, *probe_flags, "\0", *map(str, steer.fingerprint("GCC_EXEC_PREFIX")))
    if key in _memo:
        return lambda: _memo[key]
    from ..env import toolid

    path = toolid.which(compiler[0]) if compiler else None
    what = "include search list " + "\0".join(key)
    known = _parsed(toolid.recall(path, what, memo_dir)) if path is not None and memo_dir is not None else None
    if known is not None:
        _memo[key] = known
        return lambda: known
    asking = _start([*compiler, *probe_flags], lang)
    lock = allocate_lock()

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


def _system_flags(flags: Sequence[str]) -> tuple[str, ...]:
    """The flags that may move the compiler's own folders (-nostdinc, --sysroot,
    -stdlib=, -B, -specs=, -m32 ...), without the user's include folders."""
    out: list[str] = []
    skip = False
    for flag in flags:
        if skip:
            skip = False
        elif flag in _USER_DIRS:
            skip = True
        elif not flag.startswith(_USER_DIRS) and not flag.startswith(("-D", "-U", "-W", "-O", "-f", "-g")):
            out.append(flag)
    return tuple(out)


def _start(compiler: Sequence[str], lang: str) -> Any:
    import subprocess  # only when something is built

    env = {k: v for k, v in os.environ.items() if k not in _USER_PATHS}
    try:
        return subprocess.Popen([*compiler, f"-x{lang}", "-E", "-v", "-"], stdin=subprocess.DEVNULL, env=env,
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
    """Absolute, without '.' parts and repeated or trailing slashes. '..'
    stays: the kernel resolves it through the links it meets, and collapsing
    it on the string names another file where the folder before it is a link."""
    if path[:1] == "/" and "/." not in path and "//" not in path and path[-1:] != "/":
        return path  # already normal (what depfiles mostly hold)
    if path[:1] != "/":
        path = f"{cwd or os.getcwd()}/{path}"
    return "/" + "/".join(part for part in path.split("/") if part and part != ".")


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
