"""Which major of a versioned library (libcudart.so.N, libamdhip64.so.N) this
process has loaded, or the highest one installed in a list of folders: the
CUDA and HIP probes both ask it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path


def loaded_major(soname: re.Pattern[str]) -> str | None:
    """The major of a library matching soname (group 1) already loaded in this process."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                match = soname.search(line)
                if match:
                    return match.group(1)
    except OSError:
        pass
    return None


def highest_major(soname: re.Pattern[str], folders: list[Path]) -> str | None:
    """The highest major of the files matching soname in these folders."""
    majors = set()
    for folder in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        majors.update(int(m.group(1)) for m in map(soname.fullmatch, names) if m)
    return str(max(majors)) if majors else None
