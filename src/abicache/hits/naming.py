"""A hit record's name: everything a lookup depends on that its witnesses do not cover.

The call (frontend, name, sources, flags), the working directory (relative paths), the
store as written, the user and groups (whose store is trusted), the interpreter, the
machine (os.uname: a store on a filesystem several hosts mount), the C library, and the
whole environment (every setting, PATH, $CXX, every variable a compiler reads: a record
is per environment, never judged by the variables a build happened to read). A record of
another name is another record: none is ever taken for a call it was not written for.
"""

from __future__ import annotations

import os
import sys

from .._version import __version__

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any

#: 2: the native check's path; 3: which files are links, the watch's plan; 4: the GPU facts' premise (record.py)
FORMAT = b"abicache-hit 4"
#: os.environ's own table of bytes (POSIX); elsewhere no record is named
_RAW = getattr(os.environ, "_data", None) if os.name == "posix" else None


def call_of(frontend: str, name: str, sources: Any, **args: Any) -> bytes | None:
    """The call as canonical bytes; None where a source or an argument is of a type a
    record does not name (the full lookup serves such calls). An argument: None, a str,
    bool or int, a list or tuple of str, a dict of str to str (its order kept)."""
    single = type(sources) not in (list, tuple)
    parts: list[Any] = [frontend, name]
    for item in [sources] if single else sources:
        if type(item) is str:
            parts.append(("code", item))
        elif hasattr(item, "__fspath__"):
            path = os.fspath(item)
            parts.append(("path", os.fsencode(path)))
        elif isinstance(item, dict) and all(type(k) is str and type(v) is str for k, v in item.items()):
            parts.append(("files", tuple(sorted(item.items()))))
        else:
            return None
    for key in sorted(args):
        value = args[key]
        if isinstance(value, (list, tuple)):
            if not all(type(v) is str for v in value):
                return None
            value = tuple(value)
        elif type(value) is dict:  # cpp_extension's functions={name: docstring}: in its order
            if not all(type(k) is str and type(v) is str for k, v in value.items()):
                return None
            value = ("dict", tuple(value.items()))
        elif value is not None and type(value) not in (str, bool, int):
            return None
        parts.append((key, value))
    return repr(parts).encode("utf-8", "surrogateescape")


def default_root() -> str | None:
    """The default store (ABICACHE_DIR, else the platform's user cache folder) where the
    environment alone says it; None where the user's config file may name another (`dir`)."""
    explicit = os.environ.get("ABICACHE_DIR")
    if explicit:
        return os.path.expanduser(explicit)
    if _config_may_name_dir():
        return None
    if sys.platform != "linux" or hasattr(sys, "getandroidapilevel") or os.environ.get("ANDROID_ROOT"):
        return None  # platformdirs decides there (settings/config.py)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "abicache")
    home = os.environ.get("HOME", "")
    return os.path.join(home, ".cache", "abicache") if os.path.isabs(home) else None


def _config_may_name_dir() -> bool:
    """Whether the user's config file may set `dir`. A TOML key spells "dir" in its bytes
    unless written with \\u escapes: a file with neither cannot set it."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".config")
    try:
        fd = os.open(os.path.join(base, "abicache", "config.toml"),
                     os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        data = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    return b"dir" in data or b"\\u" in data or b"\\U" in data


def name(call: bytes, root: str | os.PathLike[str]) -> str | None:
    """The record's name for this call and store in this process, as it is now."""
    if _RAW is None:
        return None
    try:
        here = os.getcwd()
    except OSError:  # the working directory was removed: the full lookup says what that means
        return None
    env = b"\0".join(sorted(k + b"=" + v for k, v in _RAW.items()))
    uname = os.uname()
    who = f"{os.getuid()} {os.geteuid()} {os.getgid()} {os.getegid()} {sorted(os.getgroups())}"
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    where = "\0".join((who, sys.executable, sys.version, str(sys.implementation.cache_tag), " ".join(uname), libc))
    return _sha256_hex(b"\0\0".join((FORMAT, __version__.encode(), call, os.fsencode(root), os.fsencode(here),
                                     where.encode("utf-8", "surrogateescape"), env)))


def _sha256_hex(data: bytes) -> str:
    """values/digest.py's sha256_hex; where hashlib is loaded already (torch imports it), taken
    from it without importing digest.py and its package: two modules, ~0.3 ms of a torch
    extension's hit after `import torch`. The same digest either way."""
    hashlib = sys.modules.get("hashlib")
    if hashlib is not None:
        return hashlib.sha256(data).hexdigest()
    from ..values.digest import sha256_hex

    return sha256_hex(data)
