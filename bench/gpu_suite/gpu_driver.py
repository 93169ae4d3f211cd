"""The CUDA driver as the GPU checks ask it: through cuda-bindings, never through abicache.

Each check compares abicache's verdict with what this module gets from the
driver itself, so it must not share abicache's code paths.
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

import numpy as np


class DriverAnswer(NamedTuple):
    ok: bool
    code: str  # "CUDA_SUCCESS", "CUDA_ERROR_NO_BINARY_FOR_GPU", ...
    module: Any = None


def available() -> str | None:
    """None when a driver and a GPU answer; else why not (said in the table)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"no NVIDIA driver (libcuda.so.1: {exc})"
    try:
        from cuda.bindings import driver as cu
    except ImportError as exc:
        return f"cuda-bindings is not installed ({exc})"
    err, = cu.cuInit(0)
    if err != cu.CUresult.CUDA_SUCCESS:
        return f"cuInit: {err.name} (no driver or no GPU)"
    err, count = cu.cuDeviceGetCount()
    if err != cu.CUresult.CUDA_SUCCESS or count == 0:
        return "the driver sees no GPU"
    return None


def _cu():
    from cuda.bindings import driver as cu

    return cu


def _check(result: tuple) -> Any:
    cu = _cu()
    err, *rest = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(err.name)
    return rest[0] if len(rest) == 1 else rest


_context: Any = None


def context() -> None:
    """The primary context of device 0, current in this thread."""
    global _context
    cu = _cu()
    if _context is None:
        _check(cu.cuInit(0))
        device = _check(cu.cuDeviceGet(0))
        _context = _check(cu.cuDevicePrimaryCtxRetain(device))
    _check(cu.cuCtxSetCurrent(_context))


def driver_version() -> int:
    return _check(_cu().cuDriverGetVersion())


def compute_capability() -> str:
    cu = _cu()
    context()
    device = _check(cu.cuDeviceGet(0))
    major = _check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device))
    minor = _check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device))
    return f"sm_{major}{minor}"


def load(image: bytes) -> DriverAnswer:
    """cuModuleLoadData on these bytes (PTX needs its terminating NUL)."""
    cu = _cu()
    context()
    buffer = np.frombuffer(image + b"\0", dtype=np.uint8)
    err, module = cu.cuModuleLoadData(buffer.ctypes.data)
    return DriverAnswer(err == cu.CUresult.CUDA_SUCCESS, err.name, module if err == cu.CUresult.CUDA_SUCCESS else None)


def launch_scale(module: Any, name: str = "scale", n: int = 1 << 16, factor: float = 3.0) -> float:
    """Run `scale(float* x, float a, int n)` (x[i] *= a); the largest error against numpy."""
    cu = _cu()
    context()
    function = _check(cu.cuModuleGetFunction(module, name.encode()))
    host = np.arange(n, dtype=np.float32)
    nbytes = host.nbytes
    device = _check(cu.cuMemAlloc(nbytes))
    try:
        _check(cu.cuMemcpyHtoD(device, host.ctypes.data, nbytes))
        args = [ctypes.c_void_p(int(device)), ctypes.c_float(factor), ctypes.c_int(n)]
        params = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
        _check(cu.cuLaunchKernel(function, (n + 255) // 256, 1, 1, 256, 1, 1, 0, 0, ctypes.addressof(params), 0))
        _check(cu.cuCtxSynchronize())
        out = np.empty_like(host)
        _check(cu.cuMemcpyDtoH(out.ctypes.data, device, nbytes))
    finally:
        cu.cuMemFree(device)
    return float(np.max(np.abs(out - host * np.float32(factor))))


def unload(module: Any) -> None:
    _cu().cuModuleUnload(module)
