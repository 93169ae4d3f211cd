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
    from typing import Any, Mapping

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


#: the facts a torch call's record names (env/probes.py TORCH_FACTS)
TORCH_NAMED = ("torch.version", "torch.git", "torch.cuda", "torch.hip", "torch.cxx11abi", "torch.build", "torch.flavor",
               "torch.root")


def torch_facts() -> dict[str, str | None] | None:
    """The torch facts of the torch module this process imported, as env/probes.py reads them,
    or None where none is imported. A torch extension is keyed on the installed torch's build
    (torch.build: version, git, CUDA/HIP, C++ ABI) and found at its root: facts a C library's
    record does not name. Loading one imports torch anyway, so its record's name holds them as
    the live torch module gives them (the full lookup reads the same ones: env/probes.py
    _live_torch; tests/test_torch_hits.py keeps the two equal); a record is written only where
    the facts its lookup used are these (writer.py), and the files the lookup read of that
    torch beyond them are its witnesses (frontends/torch_lines.py files)."""
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


def torch_call(frontend: str, name: str, sources: Any, args: Mapping[str, Any]
               ) -> tuple[bytes, dict[str, str | None]] | None:
    """(a torch call as a record names it, the torch facts it names), or None where no record
    may stand for it: no torch imported, a build folder to copy into on every call
    (build_directory), a verbose call, an argument of a type a record does not name. Here,
    with the rest of a name: a torch extension's hit imports this module anyway, and each
    module more costs it ~0.1 ms (issue 49)."""
    if args.get("build_directory") is not None or args.get("verbose"):
        return None  # a copy made on every call; what a verbose call says of its lookup
    named = torch_facts()
    if named is None:
        return None
    made = call_of(frontend, name, sources, torch=repr(sorted(named.items())),
                   **{k: v for k, v in args.items() if k != "cache"})
    return None if made is None else (made, named)


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
