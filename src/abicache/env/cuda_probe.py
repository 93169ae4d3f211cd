"""CUDA facts without a subprocess: runtime major, driver version, GPU archs.

cuda.runtime: the highest libcudart major found, searching in order
  1. a libcudart already loaded in this process,
  2. pip wheels (nvidia/cu13/lib, nvidia/cuda_runtime/lib),
  3. $CUDA_HOME, $CUDA_PATH, /usr/local/cuda (lib64, lib),
  4. the system library directories.
cuda.driver / gpu.arch: asked of libcuda.so.1 through ctypes (cuDriverGetVersion,
  cuDeviceGetAttribute); None where there is no driver or no GPU. gpu.arch also
  lists the AMD GPUs present (amd_probe.py: KFD's topology in sysfs).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .sonames import highest_major, loaded_major

CUDA_FACTS = ("cuda.runtime", "cuda.driver", "gpu.arch")
_CUDART = re.compile(r"libcudart\.so\.(\d+)")
_SYSTEM_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/lib")
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


def probe() -> dict[str, str | None]:
    from . import amd_probe

    driver, archs = _driver()
    # gpu.arch: every GPU present, NVIDIA's (from the driver) and AMD's (from KFD's sysfs)
    present = ([archs] if archs else []) + amd_probe.gpu_archs()
    return {"cuda.runtime": runtime_major(), "cuda.driver": driver, "gpu.arch": ",".join(present) or None}


def runtime_dirs() -> list[Path]:
    """Where libcudart is looked for, in order (after the already-loaded copy)."""
    import sysconfig

    purelib = Path(sysconfig.get_paths()["purelib"])
    dirs = [purelib / "nvidia" / "cu13" / "lib", purelib / "nvidia" / "cuda_runtime" / "lib"]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            dirs += [Path(home) / "lib64", Path(home) / "lib"]
    return dirs + [Path(d) for d in _SYSTEM_DIRS]


def runtime_major() -> str | None:
    return loaded_major(_CUDART) or highest_major(_CUDART, runtime_dirs())


def _driver() -> tuple[str | None, str | None]:
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, None
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
        return None, None
    driver = f"{version.value // 1000}.{(version.value % 1000) // 10}"
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return driver, None
    archs = set()
    for device in range(count.value):
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        cuda.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
        archs.add(f"sm_{major.value}{minor.value}")
    return driver, ",".join(sorted(archs)) or None
