"""The HIP runtime (AMD GPUs): find and load libamdhip64 across ROCm majors."""

from .loader import HipLibraryNotFound, candidates, describe, load_library, locate

__all__ = ["HipLibraryNotFound", "candidates", "describe", "load_library", "locate"]
