"""What this process's CUDA facts stand on, read with os alone: the premise under which the
driver's answer is remembered (cuda_probe.py) and the CUDA runtime already loaded.

A hit record of GPU code (hits/cuda_witness.py) compares these in the served call, where
importing cuda_probe (re, pathlib, json, the arch model) would cost more than the rest of
the hit; cuda_probe reads them through here, so the two can never read them differently.
"""

from __future__ import annotations

import os

#: the name the driver's answer is remembered by under the store's tools/ (env/toolid.py)
REMEMBERED = "cuda driver and gpus"
#: what decides the visible NVIDIA devices and the user-space driver, besides /proc and /dev
CHOOSING = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
            "LD_PRELOAD")
BOOT_ID = "/proc/sys/kernel/random/boot_id"
MODULE = "/proc/driver/nvidia/version"  # the kernel module's version line
GPUS = "/proc/driver/nvidia/gpus"  # a folder per GPU the module drives, named by PCI address
DEV = "/dev"
LD_CACHE = "/etc/ld.so.cache"  # where the loader finds libcuda.so.1 when no variable says
DRIVER = "libcuda.so.1"
_CUDART = b"libcudart.so."


def seen() -> tuple[object, ...] | None:
    """Everything the driver's answer depends on, read without the driver; None where the
    kernel module is not there to be read (the driver is then asked each time: it is cheap
    to find absent)."""
    try:
        with open(BOOT_ID) as f:
            boot = f.read().strip()
        with open(MODULE) as f:
            module = f.read()
        gpus = sorted(os.listdir(GPUS))
        nodes = sorted(n for n in os.listdir(DEV) if n.startswith("nvidia"))
        cache = os.stat(LD_CACHE)
    except OSError:
        return None
    return (boot, module, tuple(gpus), tuple(nodes), (cache.st_ino, cache.st_mtime_ns, cache.st_ctime_ns),
            tuple(os.environ.get(name) for name in CHOOSING))


def loaded_cudart() -> str | None:
    """The major of the first libcudart.so.N mapped into this process (/proc/self/maps, in
    its order), or None: none is loaded, or not Linux."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            data = maps.read()
    except OSError:
        return None
    at = data.find(_CUDART)
    while at >= 0:
        start = end = at + len(_CUDART)
        while end < len(data) and 48 <= data[end] <= 57:  # ASCII digits
            end += 1
        if end > start:
            return data[start:end].decode()
        at = data.find(_CUDART, end)
    return None


def driver_loads() -> bool:
    """Whether this process can load the driver library (cuda_probe.py asks nothing of a GPU
    where it cannot: there is none for CUDA here)."""
    import ctypes

    try:
        ctypes.CDLL(DRIVER)
    except OSError:
        return False
    return True
