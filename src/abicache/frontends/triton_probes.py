"""Triton's per-process probes of its tools, remembered across processes.

Every fresh process that launches a cached kernel still runs, inside Triton's own code:

- `ptxas --version`, twice (once to describe the tool, once more for the backend's
  part of the kernel key: get_ptxas_version), and
- `file <python>` (platform.architecture(), in platform_key(): part of the key of the
  launcher and driver modules Triton compiles with gcc),

10 to 30 ms of subprocesses (measured on an H200 host, bench/gpu) for answers that
change only when those binaries do. abicache.triton.install() wraps both functions:
each answer is Triton's own function's, computed once, then remembered under the
store's tools/ (env/toolid.py: believed only if this user wrote it) by what decides
it: the call's arguments, the stat of the Python executable; for ptxas, the variables
that name a ptxas (Triton's knobs set them too when set in code) and the stat of every
ptxas they and Triton's own bin/ folder hold. Where that cannot be told (a mocked
version, an error) the call goes to Triton's function as before.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ..env import toolid

Stamp = Callable[[tuple, dict], "tuple[Any, ...] | None"]
_PTXAS_VARIABLES = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH", "TRITON_MOCK_PTX_VERSION")


def install(memo_dir: Path, root: Path) -> None:
    """Wrap Triton's probes in this process (again: nothing more)."""
    _wrap("triton.runtime.build", "platform_key", _python_stamp, memo_dir)
    _wrap("triton.backends.nvidia.compiler", "get_ptxas_version", lambda a, k: _ptxas_stamp(a, k, root), memo_dir)


def _wrap(module_name: str, name: str, stamp_of: Stamp, memo_dir: Path) -> None:
    try:
        module = importlib.import_module(module_name)
    except ImportError:  # a Triton without this backend or function: nothing to remember
        return
    original = getattr(module, name, None)
    if original is None or hasattr(original, "abicache_wraps"):
        return
    what = f"triton {module_name}.{name}"
    answered: dict[str, Any] = {}  # in this process, by the arguments: as Triton's own lru_cache

    def remembered(*args: Any, **kwargs: Any) -> Any:
        call = repr((args, sorted(kwargs.items())))
        if call in answered:
            return answered[call]
        try:
            stamp = stamp_of(args, kwargs)
        except OSError:
            stamp = None  # a binary we cannot stat: Triton's function decides, as without abicache
        found = None if stamp is None else toolid.recall_by(stamp, what, memo_dir)
        if found is None:
            found = original(*args, **kwargs)
            if stamp is not None and isinstance(found, str):
                toolid.remember_by(stamp, what, found, memo_dir)
        answered[call] = found
        return found

    remembered.abicache_wraps = original  # type: ignore[attr-defined]
    def cache_clear() -> None:
        answered.clear()
        getattr(original, "cache_clear", lambda: None)()

    remembered.cache_clear = cache_clear  # type: ignore[attr-defined]
    remembered.__name__, remembered.__doc__ = name, getattr(original, "__doc__", None)
    for loaded in list(sys.modules.values()):  # modules that imported it by name
        if getattr(loaded, "__name__", "").startswith("triton") and getattr(loaded, name, None) is original:
            setattr(loaded, name, remembered)


def _python_stamp(args: tuple, kwargs: dict) -> tuple[Any, ...] | None:
    """platform_key(): machine and system, and `file`'s reading of this Python executable."""
    if args or kwargs:
        return None
    st = os.stat(sys.executable)
    uname = os.uname()
    return (sys.executable, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, uname.machine, uname.sysname)


def _ptxas_stamp(args: tuple, kwargs: dict, root: Path) -> tuple[Any, ...] | None:
    """get_ptxas_version(arch): which ptxas answers is decided by the variables and Triton's bin/."""
    named = {name: os.environ.get(name) for name in _PTXAS_VARIABLES}
    if named["TRITON_MOCK_PTX_VERSION"] is not None:
        return None
    binaries = sorted(str(p) for p in (root / "backends" / "nvidia" / "bin").glob("ptxas*"))
    binaries += [path for path in named.values() if path]
    return (repr(args), repr(sorted(kwargs.items())), tuple(named.items()), tuple(_stat(path) for path in binaries))


def _stat(path: str) -> tuple[Any, ...]:
    try:
        st = os.stat(path)
    except OSError:
        return (path, "absent")
    return (path, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
