"""Clang offload bundles: how hipcc (and clang -x hip) ship AMD GPU code, in a
host library's .hip_fatbin section or as a file of their own.

An uncompressed bundle (clang's OffloadBundler):
  "__CLANG_OFFLOAD_BUNDLE__", then u64 count, then per entry
  u64 offset, u64 size, u64 triple length, the triple (no NUL);
  offsets count from the bundle's first byte. Triples name the target:
  "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-" (a code object), "host-x86_64-..."
  (empty). Older toolchains wrote "hip-amdgcn-amd-amdhsa-gfx906".
A compressed one ("CCOB", ROCm 6.2 and later by default):
  u16 version, u16 method (0 zlib, 1 zstd), then
  v1: u32 uncompressed size, u64 hash (20-byte header);
  v2: u32 total size, u32 uncompressed size, u64 hash (24 bytes);
  v3: u64 total size, u64 uncompressed size, u64 hash (32 bytes);
  and the compressed uncompressed bundle.
Every size is checked against the bytes there are, and a compressed bundle
is inflated only up to the size it declares (at most MAX_INFLATED).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from . import amdgpu, elf
from .errors import AuditError

MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED = b"CCOB"
MAX_INFLATED = 1 << 31
_MAX_ENTRIES = 4096


class Entry(NamedTuple):
    triple: str
    code: bytes  # empty for the host entry


class DeviceCode(NamedTuple):
    triple: str
    target: str  # from the code object's ELF header: "gfx908:xnack-"
    described: str


def is_bundle(head: bytes) -> bool:
    return head.startswith(MAGIC) or head.startswith(COMPRESSED)


def entries(data: bytes, where: str) -> list[Entry]:
    """Every entry of every bundle in data (a section or a file), in order."""
    out: list[Entry] = []
    pos = 0
    while pos < len(data):
        starts = [i for i in (data.find(MAGIC, pos), data.find(COMPRESSED, pos)) if i >= 0]
        if not starts:
            break
        at = min(starts)
        if data.startswith(MAGIC, at):
            found, end = _uncompressed(data, at, where)
        else:
            found, end = _compressed(data, at, where)
        out += found
        pos = max(end, at + 1)
    return out


def device_code(data: bytes, where: str) -> list[DeviceCode]:
    """The AMDGPU code objects of the bundles in data, each read from its own ELF header."""
    out = []
    for entry in entries(data, where):
        if entry.triple.startswith("host-") or not entry.code:
            continue
        label = f"{where}: bundle entry {entry.triple}"
        info = elf.parse(label, entry.code)
        if not amdgpu.is_code_object(info):
            raise AuditError(f"{label} is an ELF file for {info.machine}, not an AMDGPU code object")
        co = amdgpu.code_object(info)
        named = entry.triple.split("amdhsa-", 1)[-1].lstrip("-")  # the target ID ends the triple
        if named.split(":")[0] != co.target.split(":")[0]:
            raise AuditError(f"{label}: the triple names {named} but the code object is for {co.target}")
        out.append(DeviceCode(entry.triple, co.target, co.describe()))
    return out


def _uncompressed(data: bytes, at: int, where: str) -> tuple[list[Entry], int]:
    count = _u64(data, at + 24, where)
    if count > _MAX_ENTRIES:
        raise AuditError(f"{where}: an offload bundle at {at:#x} claims {count} entries")
    pos, out, end = at + 32, [], at + 32
    for _ in range(count):
        offset, size, length = (_u64(data, pos + 8 * i, where) for i in range(3))
        pos += 24
        triple = bytes(data[pos:pos + length])
        if len(triple) != length or length > 4096:
            raise AuditError(f"{where}: an offload bundle entry at {pos:#x} has a truncated target triple")
        pos += length
        start = at + offset
        if size and (offset < 32 or start + size > len(data)):
            raise AuditError(f"{where}: offload bundle entry {triple.decode('ascii', 'replace')!r} lies outside "
                             f"the data ({offset:#x}+{size:#x} of {len(data) - at:#x} bytes)")
        out.append(Entry(triple.decode("ascii", "replace"), bytes(data[start:start + size])))
        end = max(end, pos, start + size)
    return out, end


def _compressed(data: bytes, at: int, where: str) -> tuple[list[Entry], int]:
    if len(data) < at + 8:
        raise AuditError(f"{where}: a truncated compressed offload bundle at {at:#x}")
    version, method = struct.unpack_from("<HH", data, at + 4)
    if version == 1:
        (inflated,), header, total = struct.unpack_from("<I", data, at + 8), 20, len(data) - at
    elif version == 2:
        total, inflated = struct.unpack_from("<II", data, at + 8)
        header = 24
    elif version == 3:
        total, inflated = struct.unpack_from("<QQ", data, at + 8)
        header = 32
    else:
        raise AuditError(f"{where}: compressed offload bundle version {version} at {at:#x} is not one abicache "
                         "reads (1 to 3)")
    if total < header or at + total > len(data) or inflated > MAX_INFLATED:
        raise AuditError(f"{where}: the compressed offload bundle at {at:#x} claims {total} bytes "
                         f"({inflated} inflated); {len(data) - at} are there")
    bundle = _inflate(bytes(data[at + header:at + total]), method, inflated, where)
    if not bundle.startswith(MAGIC):
        raise AuditError(f"{where}: the compressed offload bundle at {at:#x} does not hold a bundle")
    found, _ = _uncompressed(bundle, 0, f"{where} (compressed bundle)")
    return found, at + total


def _inflate(payload: bytes, method: int, size: int, where: str) -> bytes:
    if method == 0:
        import zlib

        inflater = zlib.decompressobj()
        out = inflater.decompress(payload, size + 1)
    elif method == 1:
        try:
            import zstandard
        except ImportError:
            raise AuditError(f"{where} holds a zstd-compressed offload bundle; pip install zstandard "
                             "to read it") from None
        import io

        try:  # a stream, read to one byte past the size declared: a bomb cannot inflate further
            out = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(payload)).read(size + 1)
        except zstandard.ZstdError as exc:
            raise AuditError(f"{where}: a damaged compressed offload bundle ({exc})") from None
    else:
        raise AuditError(f"{where}: offload bundle compression method {method} is not zlib (0) or zstd (1)")
    if len(out) != size:
        raise AuditError(f"{where}: a compressed offload bundle inflates to {len(out)} bytes, not the {size} "
                         "it declares")
    return out


def _u64(data: bytes, pos: int, where: str) -> int:
    if pos + 8 > len(data):
        raise AuditError(f"{where}: an offload bundle is truncated at {pos:#x}")
    return int(struct.unpack_from("<Q", data, pos)[0])
