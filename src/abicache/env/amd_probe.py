"""AMD GPUs present, read from the kernel driver's topology in sysfs (no ROCm needed).

Each GPU node of /sys/class/kfd/kfd/topology/nodes/<n>/properties has a line
`gfx_target_version MMmmss` (decimal: major, minor, stepping; CPU nodes have 0):
90402 is gfx942, 90010 is gfx90a (stepping 10 is "a"), 110000 is gfx1100.
$ABICACHE_KFD_TOPOLOGY names another nodes folder (tests, containers with
sysfs mounted elsewhere). XNACK and SRAMECC modes are not reported here: the
device's modes stay unknown, and a target that names one is left to the loader.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DEFAULT = "/sys/class/kfd/kfd/topology/nodes"
HIP_FACTS = ("hip.runtime",)
_HIP = re.compile(r"libamdhip64\.so\.(\d+)")


def gfx_name(version: int) -> str:
    """90402 -> 'gfx942'; each of minor and stepping is one hex digit."""
    major, minor, step = version // 10000, (version // 100) % 100, version % 100
    return f"gfx{major}{minor:x}{step:x}"


def gpu_archs() -> list[str]:
    """The gfx targets of the AMD GPUs present, sorted; empty without any (or without KFD)."""
    nodes = Path(os.environ.get("ABICACHE_KFD_TOPOLOGY") or DEFAULT)
    try:
        entries = list(nodes.iterdir())
    except OSError:
        return []
    found = set()
    for node in entries:
        try:
            text = (node / "properties").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "gfx_target_version" and value.strip().isdigit() and int(value) > 0:
                found.add(gfx_name(int(value)))
    return sorted(found)


def hip_runtime() -> dict[str, str | None]:
    """hip.runtime: the HIP runtime's major (libamdhip64.so.N): a copy already
    loaded in this process, else the one abicache's HIP loader would load (its
    search order, hip/loader.py, without loading it), else the highest major
    in the system library folders."""
    from ..hip import loader
    from .sonames import highest_major, loaded_major

    found = loaded_major(_HIP)
    if found is None:
        located = loader.locate()
        found = str(located[0]) if located else highest_major(_HIP, hip_dirs())
    return {"hip.runtime": found}


def hip_dirs() -> list[Path]:
    homes = [os.environ.get("ROCM_PATH"), os.environ.get("HIP_PATH"), "/opt/rocm"]
    system = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
    return [Path(h) / "lib" for h in homes if h] + [Path(d) for d in system]
