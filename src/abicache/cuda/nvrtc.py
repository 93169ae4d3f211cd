"""NVRTC through ctypes, over the loader: compile CUDA C++ to CUBIN or PTX in-process."""

from __future__ import annotations

import ctypes
from typing import Sequence

from ..errors import BuildError
from .loader import LoadedLibrary, load_library


def library(major: int | None = None) -> LoadedLibrary:
    return load_library("nvrtc", major=major)


def identity(major: int | None, memo_dir=None) -> str:
    """'nvrtc 13.5' for the NVRTC that would be used, memoized on disk by the
    library file's stat: a cache hit never has to load NVRTC (~15 ms)."""
    from pathlib import Path

    from ..env import toolid
    from .loader import locate

    found = locate("nvrtc", major)
    if found is None:
        return f"nvrtc {version(library(major))}"
    text = toolid.memoized(Path(found[1]), "nvrtc-version", lambda _: version(library(major)), memo_dir)
    return f"nvrtc {text}"


def version(lib: LoadedLibrary) -> str:
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    lib.handle.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def _error(lib: LoadedLibrary, code: int) -> str:
    fn = lib.handle.nvrtcGetErrorString
    fn.restype = ctypes.c_char_p
    return (fn(code) or b"?").decode()


def compile_source(lib: LoadedLibrary, source: str, name: str, options: Sequence[str],
                   output: str) -> bytes:
    """CUBIN (nvrtcGetCUBIN, preferred) or PTX bytes; BuildError with the program log."""
    nv = lib.handle
    prog = ctypes.c_void_p()
    check = _checker(lib, name)
    check(nv.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None),
          "nvrtcCreateProgram")
    try:
        argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        result = nv.nvrtcCompileProgram(prog, len(options), argv)
        if result != 0:
            raise BuildError(f"NVRTC {version(lib)} could not compile {name}: {_error(lib, result)}",
                             command=("nvrtcCompileProgram", *options), output=_log(nv, prog))
        get_size, get = ("nvrtcGetCUBINSize", "nvrtcGetCUBIN") if output == "cubin" else \
            ("nvrtcGetPTXSize", "nvrtcGetPTX")
        size = ctypes.c_size_t(0)
        check(getattr(nv, get_size)(prog, ctypes.byref(size)), get_size)
        buf = ctypes.create_string_buffer(size.value)
        check(getattr(nv, get)(prog, buf), get)
        data = buf.raw[: size.value]
        return data.rstrip(b"\0") + b"\n" if output == "ptx" else data
    finally:
        nv.nvrtcDestroyProgram(ctypes.byref(prog))


def _checker(lib: LoadedLibrary, name: str):
    def check(code: int, call: str) -> None:
        if code != 0:
            raise BuildError(f"{call} failed for {name}: {_error(lib, code)} (NVRTC {version(lib)} at {lib.path})")
    return check


def _log(nv: ctypes.CDLL, prog: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t(0)
    if nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != 0 or size.value <= 1:
        return ""
    buf = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")
