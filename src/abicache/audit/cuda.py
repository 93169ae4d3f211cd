"""CUDA artifacts: cubins (CUDA 12 and 13 encodings), fatbin containers, PTX,
fatbins embedded in host libraries, and the CUDA libraries a host .so needs.

No public library parses these; the encodings below were measured on the
toolchains here (nvcc 12 and 13, cuobjdump), and the tests cross-check the
(kind, arch) lists against cuobjdump where it is installed.
"""

from __future__ import annotations

import re
import struct
from typing import Iterator, NamedTuple

from ..values import archs
from .elf import ElfInfo, sections_named
from .errors import AuditError

FATBIN_MAGIC = 0xBA55ED50
_HEADER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
KINDS = {1: "ptx", 2: "elf", 8: "lto"}
F_LZ4, F_ZSTD, F_ARCH_SPECIFIC, F_FAMILY = 0x2000, 0x8000, 0x100000, 0x200000


class Target(NamedTuple):
    """One piece of device code: a cubin ('elf'), PTX or LTO-IR for an arch."""

    kind: str  # "elf", "ptx" or "lto"
    arch: str  # "sm_90a", "compute_80", ...
    ptx_isa: str | None = None  # "9.0" for PTX
    compression: str | None = None  # "zstd", "lz4" or None
    checked: bool = False  # PTX payload read (decompressed if needed) and found to agree


def cubin_target(info: ElfInfo, data: bytes) -> Target:
    """The arch of a cubin, from e_flags (both encodings), .nv.compat and the tkinfo note."""
    if info.osabi == 0x33 or info.abiversion == 7:
        sm, arch_specific = info.flags & 0xFF, bool(info.flags & 0x800)
    elif info.osabi == 0x41 or info.abiversion == 8:
        sm, arch_specific = (info.flags >> 8) & 0xFF, bool(info.flags & 0x8)
        arch_specific = arch_specific or _compat_attr(data, 0x09) == 1  # CUDA 13 marks 'a' only here
    else:
        raise AuditError(f"{info.path}: unknown cubin encoding (OSABI {info.osabi:#x}, "
                         f"ABI version {info.abiversion})")
    if sm < 20:
        raise AuditError(f"{info.path}: cubin names no usable arch (e_flags {info.flags:#x})")
    suffix = "a" if arch_specific else ("f" if _toolkit_arch(data).endswith("f") else "")
    return Target("elf", f"sm_{sm}{suffix}")


def _compat_attr(data: bytes, attr: int) -> int | None:
    """Records of .nv.compat: (format u8, attribute u8, value u16), format 4 = sized blob."""
    for blob in sections_named(data, ".nv.compat"):
        pos = 0
        while pos + 4 <= len(blob):
            fmt, key, value = blob[pos], blob[pos + 1], int.from_bytes(blob[pos + 2:pos + 4], "little")
            if fmt == 4:
                pos += 4 + value
                continue
            if key == attr:
                return value
            pos += 4
    return None


def _toolkit_arch(data: bytes) -> str:
    """The -arch the toolkit was given, from .note.nv.tkinfo ('sm_100f'); '' if absent."""
    for blob in sections_named(data, ".note.nv.tkinfo"):
        match = re.search(rb"-arch (sm_\d+[af]?)", blob)
        if match:
            return match.group(1).decode()
    return ""


def fatbin_targets(data: bytes, where: str = "fatbin") -> list[Target]:
    """Every entry of one or more concatenated fatbin containers."""
    targets, pos = [], 0
    while pos + _HEADER.size <= len(data):
        magic, _version, header_size, payload = _HEADER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            if pos == 0:
                raise AuditError(f"{where} does not start with the fatbin magic {FATBIN_MAGIC:#x}")
            break  # section padding after the last container
        if header_size < _HEADER.size or pos + header_size + payload > len(data):
            raise AuditError(f"{where}: fatbin container at byte {pos} runs past the end")
        targets.extend(_entries(data, pos + header_size, pos + header_size + payload, where))
        pos += header_size + payload
        pos += -pos % 8  # containers are 8-byte aligned inside .nv_fatbin
    return targets


def _entries(data: bytes, start: int, end: int, where: str) -> Iterator[Target]:
    pos = start
    while pos + _ENTRY.size <= end:
        (kind, _ver, header_size, padded, csize, _u1, minor, major, arch, _noff, _nlen, flags,
         _zero, usize) = _ENTRY.unpack_from(data, pos)
        if header_size < _ENTRY.size or pos + header_size + padded > end or arch <= 0:
            raise AuditError(f"{where}: malformed fatbin entry at byte {pos}")
        name = KINDS.get(kind)
        if name is None:
            raise AuditError(f"{where}: unknown fatbin entry kind {kind} at byte {pos}")
        suffix = "a" if flags & F_ARCH_SPECIFIC else ("f" if flags & F_FAMILY else "")
        prefix = "compute" if name == "ptx" else "sm"
        compression = "zstd" if flags & F_ZSTD else ("lz4" if flags & F_LZ4 else None)
        isa = f"{major}.{minor}" if name == "ptx" else None
        target = Target(name, f"{prefix}_{arch}{suffix}", isa, compression)
        if name == "ptx":
            stored = csize if compression else padded
            payload = bytes(data[pos + header_size:pos + header_size + stored])
            target = _check_ptx(target, payload, usize, f"{where} entry at byte {pos}")
        yield target
        pos += header_size + padded


def _check_ptx(target: Target, payload: bytes, size: int, where: str) -> Target:
    """Read the PTX inside an entry (decompressing it when the optional library is
    installed) and make sure it says what the entry header says."""
    text = _decompress(target.compression, payload, size, where)
    if text is None:
        return target  # no decompressor here: reported from the headers alone
    inner = ptx_target(text.decode("utf-8", errors="replace"), where)
    if (inner.arch.rstrip("af"), inner.ptx_isa) != (target.arch.rstrip("af"), target.ptx_isa):
        raise AuditError(f"{where}: the header says {target.arch} ISA {target.ptx_isa}, "
                         f"the PTX inside says {inner.arch} ISA {inner.ptx_isa}")
    return target._replace(checked=True)


def _decompress(method: str | None, payload: bytes, size: int, where: str) -> bytes | None:
    if method is None:
        return payload.rstrip(b"\0")
    try:
        if method == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().decompress(payload, max_output_size=max(size, 1))
        import lz4.block

        return lz4.block.decompress(payload, uncompressed_size=size)
    except ImportError:
        return None
    except Exception as exc:  # corrupt payload: the library's own error types vary
        raise AuditError(f"{where}: cannot decompress the {method} payload ({exc})") from None


def embedded_fatbins(data: bytes, where: str) -> list[Target]:
    """Device code inside a host shared library's .nv_fatbin sections."""
    out: list[Target] = []
    for blob in sections_named(data, ".nv_fatbin"):
        out.extend(fatbin_targets(blob, f"{where} (.nv_fatbin)"))
    return out


_PTX_VERSION = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)\s*$", re.M)
_PTX_TARGET = re.compile(r"^\s*\.target\s+([\w, ]+)$", re.M)


def looks_like_ptx(data: bytes) -> bool:
    head = data[:4096]
    return b".version" in head and b".target" in head and b"\0" not in head


def ptx_target(text: str, where: str = "PTX") -> Target:
    version, target = _PTX_VERSION.search(text), _PTX_TARGET.search(text)
    if version is None or target is None:
        raise AuditError(f"{where} has no '.version' and '.target' header; is it PTX?")
    arch = target.group(1).split(",")[0].strip()
    try:  # the same rule as every requirement line (a header cut inside its target, `sm_8`, is not one)
        if not re.fullmatch(r"sm_\d+[af]?", arch):
            raise ValueError(arch)
        archs.parse_target(arch.replace("sm_", "compute_"))
    except ValueError:
        raise AuditError(f"{where}: unknown PTX target {arch!r}") from None
    return Target("ptx", arch.replace("sm_", "compute_"), f"{version.group(1)}.{version.group(2)}")


# PTX ISA version -> the CUDA release (and so the minimum driver) that introduced it.
_ISA_RELEASE = {(8, 6): "12.7", (8, 7): "12.8", (8, 8): "12.9", (6, 0): "9.0", (6, 1): "9.1",
                (6, 2): "9.2", (6, 3): "10.0", (6, 4): "10.1", (6, 5): "10.2"}


def driver_for_isa(isa: str) -> str:
    """Minimum driver (as the CUDA version it supports) that can JIT this PTX ISA."""
    major, minor = (int(p) for p in isa.split("."))
    if (major, minor) in _ISA_RELEASE:
        return _ISA_RELEASE[(major, minor)]
    if major >= 9:
        return f"{major + 4}.{minor}"  # ISA 9.0 = CUDA 13.0
    if major == 8:
        return f"12.{minor}"
    if major == 7:
        return f"11.{minor}"
    return "9.0"


_LIB_MAJOR = re.compile(r"^lib(cudart|nvrtc|cublas|cufft|curand|cusparse|cusolver)\.so\.(\d+)")


def cuda_libraries(needed: tuple[str, ...]) -> dict[str, str]:
    """{'cudart': '12', ...} from DT_NEEDED sonames (libcudart.so.11.0 -> 11)."""
    out = {}
    for soname in needed:
        match = _LIB_MAJOR.match(soname)
        if match:
            out[match.group(1)] = match.group(2)
    return out
