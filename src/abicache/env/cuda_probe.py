"""CUDA facts without a subprocess: runtime major, driver version, GPU archs.

cuda.runtime: the highest libcudart major found, searching in order
  1. a libcudart already loaded in this process,
  2. pip wheels (nvidia/cu13/lib, nvidia/cuda_runtime/lib),
  3. $CUDA_HOME, $CUDA_PATH, /usr/local/cuda (lib64, lib),
  4. the system library directories.
cuda.driver / gpu.arch: asked of libcuda.so.1 through ctypes (cuDriverGetVersion,
  cuDeviceGetAttribute); cuda.driver is None where there is no driver. gpu.arch
  also lists the AMD GPUs present (amd_probe.py: KFD's topology in sysfs); it is
  `none` where the machine surely has no GPU (no libcuda.so.1 to load, or a
  driver that reports no device) and None where that is not known (a driver
  that failed otherwise): only a known none meets `gpu.arch ~= ...`.
  Asking the driver means cuInit (10 ms a process, 180 ms the first time after a
  boot, measured on an H200), so the answer is remembered under the store's tools/
  while nothing that decides it moved (_seen): the boot, the kernel module's
  version, the GPUs it drives (PCI addresses), the device nodes, the variables
  that choose the visible devices and the user-space driver's search path.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..values.archs import NO_GPU
from .probes import CUDA_FACTS  # noqa: F401  (what probe() answers)
from . import cuda_premise
from .sonames import highest_major

_CUDART = re.compile(r"libcudart\.so\.(\d+)")
_SYSTEM_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/lib")
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CUDA_ERROR_NO_DEVICE = 100  # cuInit's answer where the driver sees no device (or none is visible)


def probe(memo_dir: Path | None = None) -> dict[str, str | None]:
    from . import amd_probe

    driver, archs = _driver_remembered(memo_dir)
    # gpu.arch: every GPU present, NVIDIA's (from the driver) and AMD's (from KFD's sysfs)
    present = ([archs] if archs not in (None, NO_GPU) else []) + amd_probe.gpu_archs()
    gpus = ",".join(present) or (NO_GPU if archs == NO_GPU else None)
    return {"cuda.runtime": runtime_major(), "cuda.driver": driver, "gpu.arch": gpus}


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
    return cuda_premise.loaded_cudart() or highest_major(_CUDART, runtime_dirs())


def _seen() -> tuple[object, ...] | None:
    """Everything the driver's answer depends on (cuda_premise.py, which a hit record's check reads too)."""
    return cuda_premise.seen()


def _driver_remembered(memo_dir: Path | None) -> tuple[str | None, str | None]:
    """_driver(), remembered while _seen() holds. Only a GPU found is remembered: a driver that
    failed or found none (a passing error, a device being reset) is asked again by the next
    process."""
    seen = _seen()
    if seen is None or memo_dir is None:
        return _driver()
    from . import toolid

    what = cuda_premise.REMEMBERED
    try:
        driver, archs = json.loads(toolid.recall_by(seen, what, memo_dir) or "null")
        if isinstance(driver, str) and isinstance(archs, str):
            return driver, archs
    except (ValueError, TypeError):
        pass  # none, or one we cannot read: asked again, never believed
    driver, archs = _driver()
    if driver is not None and archs not in (None, NO_GPU):
        toolid.remember_by(seen, what, json.dumps([driver, archs]), memo_dir)
    return driver, archs


def _driver() -> tuple[str | None, str | None]:
    """(driver version, NVIDIA devices): the devices are NO_GPU where there surely are none for
    this process (no driver library to load: neither can CUDA; the driver says no device), None
    where the driver failed otherwise (not known)."""
    import ctypes

    try:
        cuda = ctypes.CDLL(cuda_premise.DRIVER)
    except OSError:
        return None, NO_GPU
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
        return None, None
    driver = f"{version.value // 1000}.{(version.value % 1000) // 10}"
    init = cuda.cuInit(0)
    if init == CUDA_ERROR_NO_DEVICE:
        return driver, NO_GPU
    count = ctypes.c_int(0)
    if init != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return driver, None
    if count.value == 0:
        return driver, NO_GPU
    archs = set()
    for device in range(count.value):
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        cuda.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
        archs.add(f"sm_{major.value}{minor.value}")
    return driver, ",".join(sorted(archs)) or None
