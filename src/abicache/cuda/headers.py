"""CUDA headers of each major: where they are, and the prototypes they declare.

Headers are preprocessed with gcc (the flags that make glibc and CUDA headers
plain C99) and parsed with pycparser. Names are taken *after* macro expansion,
so `cudaGetDeviceProperties` is `cudaGetDeviceProperties_v2` in CUDA 12 and
plain in 13 — the name the real library exports and callers link against.

A signature is compared across majors by its declaration text plus the
definitions of the structs it reaches through typedefs (cudaDeviceProp is 1032
bytes in 12.9 and 1008 in 13.0 under one name); enums are ABI-stable ints and
do not count.
"""

from __future__ import annotations

import copy
import os
import re
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import AbicacheError, missing_extra

HEADERS = {"cudart": "cuda_runtime_api.h", "nvrtc": "nvrtc.h", "cuda": "cuda.h"}
_VERSION = re.compile(r"#define\s+(?:CUDART_VERSION|CUDA_VERSION)\s+(\d+)")
CPP_FLAGS = ["-E", "-P", "-std=c99", "-D__attribute__(x)=", "-D__extension__=", "-D__restrict=",
             "-D__inline__=inline", "-D__inline=inline", "-D__asm__(x)=", "-D__builtin_va_list=void*",
             "-D_Float128=double"]


class Prototype(NamedTuple):
    name: str  # the exported name, after macro expansion
    declaration: str  # C text: "cudaError_t cudaMalloc(void **devPtr, size_t size)"
    return_type: str
    param_types: tuple[str, ...]
    fingerprint: str  # declaration + the structs it reaches: equal means ABI-equal


class HeaderSet(NamedTuple):
    library: str
    major: int
    include: Path

    @property
    def header(self) -> Path:
        return self.include / HEADERS[self.library]


def discover(library: str, extra: dict[int, Path] | None = None) -> dict[int, HeaderSet]:
    """Header folders for each major: explicit ones first, then $ABICACHE_CUDA_HEADERS
    (os.pathsep-separated folders), pip wheels, $CUDA_HOME/$CUDA_PATH, /usr/local/cuda."""
    found: dict[int, HeaderSet] = {}
    for major, folder in (extra or {}).items():
        found[major] = HeaderSet(library, major, Path(folder))
    for folder in _search_dirs(library):
        major = header_major(library, folder)
        if major is not None and major not in found:
            found[major] = HeaderSet(library, major, folder)
    return found


def _search_dirs(library: str) -> list[Path]:
    purelib = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    dirs = [Path(p) for p in os.environ.get("ABICACHE_CUDA_HEADERS", "").split(os.pathsep) if p]
    dirs += [purelib / "cu13" / "include", purelib / "cuda_runtime" / "include", purelib / "cuda_nvrtc" / "include"]
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            dirs.append(Path(os.environ[variable]) / "include")
    dirs.append(Path("/usr/local/cuda/include"))
    return [d for d in dirs if (d / HEADERS[library]).is_file()]


def header_major(library: str, folder: Path) -> int | None:
    """The CUDA major of a header folder, from CUDART_VERSION/CUDA_VERSION or, for
    nvrtc.h (which has none), the libnvrtc.so.N beside it or a runtime header with it."""
    for name in (HEADERS[library], "cuda_runtime_api.h", "cuda.h"):
        try:
            match = _VERSION.search((folder / name).read_text(errors="replace"))
        except OSError:
            continue
        if match:
            return int(match.group(1)) // 1000
    for lib in sorted((folder.parent / "lib").glob("libnvrtc.so.*")):
        match = re.fullmatch(r"libnvrtc\.so\.(\d+)", lib.name)
        if match:
            return int(match.group(1))
    return None


def support_flags() -> list[str]:
    """Wheels of some majors lack crt/host_defines.h (it ships with the compiler):
    take it from any toolkit; it only defines __host__/CUDARTAPI-style decorations."""
    dirs = _search_dirs("cudart") + [Path("/usr/local/cuda/include")]
    return [f"-idirafter{d}" for d in dirs if (d / "crt" / "host_defines.h").is_file()][:1]


def preprocess(hset: HeaderSet) -> str:
    import subprocess

    argv = ["cc", *CPP_FLAGS, f"-I{hset.include}", *support_flags(), str(hset.header)]
    done = subprocess.run(argv, capture_output=True, text=True, errors="replace")
    if done.returncode != 0:
        raise AbicacheError(f"cannot preprocess {hset.header}: {done.stderr.strip()[:800]}")
    return done.stdout


@lru_cache(maxsize=16)
def prototypes(hset: HeaderSet) -> dict[str, Prototype]:
    """Every function the header declares, by exported name."""
    try:
        from pycparser import c_ast, c_generator, c_parser
    except ImportError as exc:
        raise (missing_extra(exc, "reading CUDA headers") or exc) from None

    try:
        tree = c_parser.CParser().parse(preprocess(hset), filename=str(hset.header))
    except Exception as exc:  # pycparser's ParseError names the line
        raise AbicacheError(f"cannot parse {hset.header}: {exc}") from None
    gen = c_generator.CGenerator()
    structs, typedefs = _type_tables(tree, gen)
    out = {}
    for node in tree.ext:
        if isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
            out[node.name] = _prototype(node, gen, structs, typedefs)
    return out


def _type_tables(tree: Any, gen: Any) -> tuple[dict[str, str], dict[str, Any]]:
    from pycparser import c_ast

    structs: dict[str, str] = {}
    typedefs: dict[str, Any] = {}

    class Visitor(c_ast.NodeVisitor):
        def visit_Struct(self, node: Any) -> None:
            if node.name and node.decls is not None:
                structs[node.name] = " ".join(gen.visit(d) + ";" for d in node.decls)
            self.generic_visit(node)

        visit_Union = visit_Struct

        def visit_Typedef(self, node: Any) -> None:
            typedefs[node.name] = node.type
            self.generic_visit(node)

    Visitor().visit(tree)
    return structs, typedefs


def _prototype(node: Any, gen: Any, structs: dict[str, str], typedefs: dict[str, Any]) -> Prototype:
    func = node.type
    params = [p for p in (func.args.params if func.args else []) if not _is_void(p)]
    param_types = tuple(_type_text(p.type, gen) for p in params)
    ret = _type_text(func.type, gen)
    reached = _reached_structs(node, typedefs, structs)
    fingerprint = " ".join(gen.visit(node).split()) + " | " + " | ".join(
        f"{name}{{{structs[name]}}}" for name in sorted(reached))
    return Prototype(node.name, " ".join(gen.visit(node).split()), ret, param_types, fingerprint)


def _is_void(param: Any) -> bool:
    from pycparser import c_ast

    return (isinstance(param, c_ast.Typename) and isinstance(param.type, c_ast.TypeDecl)
            and isinstance(param.type.type, c_ast.IdentifierType) and param.type.type.names == ["void"])


def _type_text(node: Any, gen: Any) -> str:
    """A type without its declarator name: 'void **', 'const char *'."""
    from pycparser import c_ast

    node = copy.deepcopy(node)
    inner = node
    while not isinstance(inner, c_ast.TypeDecl):
        if not hasattr(inner, "type"):
            break
        inner = inner.type
    if isinstance(inner, c_ast.TypeDecl):
        inner.declname = None
    return " ".join(gen.visit(node).split())


def _reached_structs(node: Any, typedefs: dict[str, Any], structs: dict[str, str]) -> set[str]:
    """Struct/union names a declaration reaches through its types and typedefs."""
    from pycparser import c_ast

    seen_types: set[str] = set()
    reached: set[str] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        for child in _walk(current):
            if isinstance(child, (c_ast.Struct, c_ast.Union)) and child.name and child.name in structs:
                if child.name not in reached:
                    reached.add(child.name)
            elif isinstance(child, c_ast.IdentifierType):
                for name in child.names:
                    if name in typedefs and name not in seen_types:
                        seen_types.add(name)
                        pending.append(typedefs[name])
    return reached


def _walk(node: Any):
    yield node
    for _, child in node.children():
        yield from _walk(child)


def extract_wheel_headers(wheel: Path, dest: Path) -> Path:
    """The include/ folder of an nvidia-cuda-* wheel, unpacked without installing it
    (the cu11 and cu12 runtime wheels install into the same folder)."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if "/include/" in member and not member.endswith("/"):
                target = dest / member.split("/include/", 1)[1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(member))
    return dest
