"""CUDA: load CUDA libraries across majors, compile with nvcc or NVRTC through
the cache, and generate lazy-loading stub libraries.

    from abicache import cuda
    rt = cuda.load_library("cudart")                  # newest major found, or major=12
    out = cuda.compile(KERNEL, arch="sm_90", compiler="nvrtc")   # cached cubin bytes
"""

from .compile import Compiled, compile
from .loader import CudaLibraryNotFound, LoadedLibrary, load_library

__all__ = ["CudaLibraryNotFound", "Compiled", "LoadedLibrary", "compile", "load_library"]
