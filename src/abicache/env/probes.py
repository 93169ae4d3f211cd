"""Probes: each reads one part of the environment and returns named facts.

Cheap probes read the running interpreter. Tool versions need a subprocess;
those go through `toolid`, which memoizes them on disk by the binary's stat.
Nothing here imports torch, triton or a CUDA library.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import toolid

PYTHON_FACTS = ("python.implementation", "python.version", "python.abi", "python.abi3")
PLATFORM_FACTS = ("platform.system", "platform.machine", "platform.libc", "platform.glibc")
LIBSTDCXX_FACTS = ("platform.glibcxx", "platform.cxxabi")
TORCH_FACTS = (
    "torch.version",
    "torch.git",
    "torch.cuda",
    "torch.hip",
    "torch.cxx11abi",
    "torch.build",
    "torch.flavor",
    "torch.root",
)
TRITON_FACTS = ("triton.version",)
TVM_FFI_FACTS = ("tvm_ffi.version",)
CUDA_FACTS = ("cuda.runtime", "cuda.driver", "gpu.arch")  # cuda_probe.py, imported when one is asked


def python() -> dict[str, str | None]:
    impl = sys.implementation.name
    major, minor = sys.version_info[:2]
    flags = getattr(sys, "abiflags", "")
    free_threaded = "t" in flags
    if impl == "cpython":
        abi = f"cp{major}{minor}{flags}"
    else:
        abi = (sys.implementation.cache_tag or impl).replace("-", "_")
    # The limited API (abi3) is offered by GIL-enabled CPython only.
    abi3 = f"{major}.{minor}" if impl == "cpython" and not free_threaded else None
    version = ".".join(str(p) for p in sys.version_info[:3])
    return {
        "python.implementation": impl,
        "python.version": version,
        "python.abi": abi,
        "python.abi3": abi3,
    }


def platform() -> dict[str, str | None]:
    if sys.platform == "win32":
        system, machine = "windows", os.environ.get("PROCESSOR_ARCHITECTURE", "").lower()
    else:
        uname = os.uname()
        system, machine = uname.sysname.lower(), uname.machine.lower()
    libc, glibc = _libc()
    return {
        "platform.system": system,
        "platform.machine": machine,
        "platform.libc": libc,
        "platform.glibc": glibc,
    }


def _libc() -> tuple[str | None, str | None]:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        text = ""
    if text.startswith("glibc "):
        return "glibc", text.split()[1]
    if sys.platform.startswith("linux") and any(Path("/lib").glob("ld-musl-*")):
        return "musl", None
    return None, None


def libstdcxx(memo_dir: Path | None) -> dict[str, str | None]:
    """Highest GLIBCXX_ / CXXABI_ versions the process's libstdc++ defines."""
    path = _libstdcxx_path()
    if path is None:
        return dict.fromkeys(LIBSTDCXX_FACTS)
    found = toolid.memoized(path, "symbol-versions", _symbol_version_floors, memo_dir)
    glibcxx, _, cxxabi = (found or "").partition(";")
    return {"platform.glibcxx": glibcxx or None, "platform.cxxabi": cxxabi or None}


def _libstdcxx_path() -> Path | None:
    from ..native.loaded import libstdcxx_path

    path = libstdcxx_path()
    return None if path is None else Path(path)


def _symbol_version_floors(path: Path) -> str:
    """'GLIBCXX;CXXABI' highest version definitions, read from .gnu.version_d."""
    import mmap

    from ..native import elftables
    from ..values import versions

    best = {"GLIBCXX": "", "CXXABI": ""}
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for name in elftables.ElfFile(data).version_definitions():
            prefix, _, number = name.partition("_")
            # dotted numbers only: CXXABI_TM_1 and CXXABI_FLOAT128 are not versions (and would
            # cost an import of packaging to be told so)
            if prefix in best and number.replace(".", "").isdigit() and versions.is_version(number):
                if not best[prefix] or versions.compare(number, best[prefix]) > 0:
                    best[prefix] = number
    return f"{best['GLIBCXX']};{best['CXXABI']}"


def compiler(variable: str, default: str, memo_dir: Path | None) -> str | None:
    """Identity of $CC / $CXX (or cc / c++): version and target, never the path.
    Behind a wrapper ($CXX="ccache g++"), the compiler it runs."""
    words = toolid.command(variable, default)
    path = toolid.which(words[toolid.compiler_at(words)])
    if path is None:
        return None
    return toolid.memoized(path, "compiler -v", _compiler_identity, memo_dir)


#: the name each family's identity is remembered under (toolid.memoized's `what`)
IDENTITY_MEMO = {"gcc": "compiler -v", "nvcc": "nvcc --version"}


def identity(path: Path, family: str, memo_dir: Path | None) -> str | None:
    """The identity of the compiler at path, of a family (launcher/command.family: "gcc"
    for gcc and clang's drivers, "nvcc"): version and target, remembered by its stat."""
    compute = _nvcc_identity if family == "nvcc" else _compiler_identity
    return toolid.memoized(path, IDENTITY_MEMO[family], compute, memo_dir)


def _compiler_identity(path: Path) -> str:
    text = toolid.run_tool([str(path), "-v"])
    version = target = ""
    for line in text.splitlines():
        if line.startswith("Target:"):
            target = line.split(":", 1)[1].strip()
        elif " version " in line and not version:
            version = line.strip()
    lines = text.strip().splitlines()
    return f"{version} target={target}" if version else lines[0] if lines else f"{path.name}: -v printed nothing"


def nvcc_path() -> Path | None:
    """nvcc on PATH, else under $CUDA_HOME, $CUDA_PATH or /usr/local/cuda."""
    return toolid.which("nvcc") or _cuda_home_tool("nvcc")


def nvcc(memo_dir: Path | None) -> str | None:
    path = nvcc_path()
    if path is None:
        return None
    return toolid.memoized(path, IDENTITY_MEMO["nvcc"], _nvcc_identity, memo_dir)


def _cuda_home_tool(name: str) -> Path | None:
    return next((path for path in cuda_home_tools(name) if path.is_file()), None)


def cuda_home_tools(name: str) -> list[Path]:
    """Where a CUDA tool is looked for when PATH has none, in order (a hit record witnesses
    each: hits/writer.py)."""
    return [Path(home) / "bin" / name for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                                                   "/usr/local/cuda") if home]


def _nvcc_identity(path: Path) -> str:
    text = toolid.run_tool([str(path), "--version"])
    lines = [ln.strip() for ln in text.splitlines() if ln.startswith(("Cuda", "Build"))]
    return " ".join(lines) or text.strip()


def torch() -> dict[str, str | None]:
    """torch's build identity from torch/version.py, without importing torch."""
    info = _live_torch() or _torch_version_file()
    if info is None:
        return dict.fromkeys(TORCH_FACTS)
    info["torch.build"] = "/".join(
        [info["torch.version"] or "unknown"]
        + [f"{k}={info[f'torch.{k}'] or 'none'}" for k in ("git", "cuda", "hip", "cxx11abi")]
    )
    info["torch.flavor"] = _torch_flavor(info)
    return info


def _torch_flavor(info: dict[str, str | None]) -> str:
    """cuda, rocm, xpu or cpu: which device shims this torch exports."""
    if info.get("torch.cuda"):
        return "cuda"
    if info.get("torch.hip"):
        return "rocm"
    local = (info.get("torch.version") or "").partition("+")[2]
    return "xpu" if local.startswith("xpu") else "cpu"


def _live_torch() -> dict[str, str | None] | None:
    mod = sys.modules.get("torch")
    version = getattr(mod, "version", None)
    if version is None:
        return None
    abi = getattr(getattr(mod, "_C", None), "_GLIBCXX_USE_CXX11_ABI", None)
    return {
        "torch.version": str(version.__version__),
        "torch.git": getattr(version, "git_version", None),
        "torch.cuda": getattr(version, "cuda", None),
        "torch.hip": getattr(version, "hip", None),
        "torch.cxx11abi": None if abi is None else str(int(bool(abi))),
        "torch.root": str(Path(mod.__file__).parent),
    }


def _torch_version_file() -> dict[str, str | None] | None:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    scope: dict[str, object] = {}
    try:
        exec(compile((root / "version.py").read_text(), str(root / "version.py"), "exec"), scope)
    except (OSError, SyntaxError, Exception):  # a broken install is "no torch", not a crash
        return None

    def text(name: str) -> str | None:
        value = scope.get(name)
        return None if value is None else str(value)

    return {
        "torch.version": text("__version__"),
        "torch.git": text("git_version"),
        "torch.cuda": text("cuda"),
        "torch.hip": text("hip"),
        "torch.cxx11abi": _torch_cxx11abi(root),
        "torch.root": str(root),
    }


def _torch_cxx11abi(root: Path) -> str | None:
    # torch >= 2.7 is built with the new ABI only; older wheels say so in their libc10.
    lib = root / "lib" / "libc10.so"
    if not lib.is_file():
        return None
    return toolid.memoized(lib, "cxx11abi", _scan_cxx11, None)


def _scan_cxx11(path: Path) -> str:
    with open(path, "rb") as fh:
        return "1" if b"__cxx11" in fh.read() else "0"


def triton() -> dict[str, str | None]:
    from importlib import metadata

    try:
        return {"triton.version": metadata.version("triton")}
    except metadata.PackageNotFoundError:
        return {"triton.version": None}


def tvm_ffi() -> dict[str, str | None]:
    from importlib import metadata

    try:
        return {"tvm_ffi.version": metadata.version("apache-tvm-ffi")}
    except metadata.PackageNotFoundError:
        return {"tvm_ffi.version": None}
