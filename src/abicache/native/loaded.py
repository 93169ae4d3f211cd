"""Which file a library the process loads by its soname comes from: the C++ runtime a
process runs with decides where a C++ library may load (platform.glibcxx, platform.cxxabi:
env/probes.py reads its versions; a hit record, hits/record.py, witnesses the file)."""

from __future__ import annotations

import os
import sys

LIBSTDCXX = "libstdc++.so.6"


def libstdcxx_path() -> str | None:
    """The libstdc++ this process loads (or loaded already: one a library brought in first
    is the one it keeps), or None where it has none (not Linux, no C++ runtime)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    from _ctypes import dlopen  # the handle alone: a CDLL object costs ~0.1 ms to make

    try:
        handle = dlopen(LIBSTDCXX, ctypes.DEFAULT_MODE)
    except OSError:
        return None
    loaded = loaded_path(handle)
    if loaded is not None:
        return loaded
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            path = line.rstrip("\n").split(None, 5)[-1]
            if "/libstdc++.so" in path:
                return path
    return None


def loaded_path(handle: int) -> str | None:
    """The file a dlopen handle loaded, from dlinfo's link map (<link.h>:
    l_addr, then l_name); a third of the time of reading /proc/self/maps."""
    import ctypes

    try:
        dlinfo = ctypes.pythonapi.dlinfo  # the process's symbols, made once by ctypes: no CDLL made a call
    except AttributeError:  # glibc before 2.34 keeps it in libdl
        return None
    link_map = ctypes.c_void_p()
    if dlinfo(ctypes.c_void_p(handle), 2, ctypes.byref(link_map)) != 0 or not link_map.value:  # RTLD_DI_LINKMAP
        return None
    name = ctypes.c_char_p.from_address(link_map.value + ctypes.sizeof(ctypes.c_void_p)).value
    return os.fsdecode(name) if name and name.startswith(b"/") else None
