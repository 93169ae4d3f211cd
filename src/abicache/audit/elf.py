"""What a binary needs from the system, read from its ELF tables.

Only the dynamic view matters for loading: DT_NEEDED, DT_SONAME, the
undefined dynamic symbols with their version needs, and the exported ones.
The tables are read by abicache.native.elftables (struct; cross-checked against
pyelftools in the tests). Any malformed or truncated input becomes an
AuditError naming the file.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, NamedTuple

from ..native import elftables
from .errors import AuditError

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
_MACHINES = {  # e_machine -> the platform.machine a binary needs
    62: "x86_64",
    183: "aarch64",
    3: "i686",
    21: "ppc64le",
    22: "s390x",
    243: "riscv64",
    40: "armv7l",
    EM_CUDA: "cuda",
    224: "amdgpu",  # device code objects (audit/amdgpu.py)
}


class Symbol(NamedTuple):
    name: str
    version: str | None = None  # e.g. "GLIBC_2.34"
    library: str | None = None  # the library the version need names, e.g. "libc.so.6"
    weak: bool = False


class ElfInfo(NamedTuple):
    path: str
    bits: int
    machine: str
    osabi: int
    abiversion: int
    flags: int
    elf_type: str
    soname: str | None
    needed: tuple[str, ...]
    imports: tuple[Symbol, ...]
    exports: tuple[str, ...]
    sections: tuple[str, ...]

    @property
    def is_cubin(self) -> bool:
        return self.machine == "cuda"


def mapped(path: str | Path) -> Any:
    """The file's bytes, memory-mapped: a 400 MB libtorch is read only where parsed."""
    import mmap

    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                return b""
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise AuditError(f"cannot read {path}: {exc.strerror}") from None


def parse(path: str | Path, data: Any = None) -> ElfInfo:
    """The dynamic view of one ELF file (AuditError if it is not a sound ELF).

    data: the file's bytes (or an mmap of them); read from path when omitted.
    """
    data = mapped(path) if data is None else data
    if data[:4] != ELF_MAGIC:
        raise AuditError(f"{path} is not an ELF file (it starts with {data[:4]!r}); "
                         "abicache audits shared libraries, extension modules, cubins, fatbins and PTX")
    try:
        return _parse(str(path), data)
    except (elftables.ElfError, struct.error, ValueError, IndexError, OverflowError) as exc:
        raise AuditError(f"{path} is a truncated or malformed ELF file ({exc})") from None


def _parse(path: str, data: Any) -> ElfInfo:
    elf = elftables.ElfFile(data)
    needed, soname = elf.needed_and_soname()
    imports, exports = _dynamic_symbols(elf)
    return ElfInfo(
        path=path,
        bits=elf.bits,
        machine=_MACHINES.get(elf.machine, f"em_{elf.machine}"),
        osabi=elf.osabi,
        abiversion=elf.abiversion,
        flags=elf.flags,
        elf_type=_TYPES.get(elf.type, str(elf.type)),
        soname=soname,
        needed=needed,
        imports=imports,
        exports=exports,
        sections=tuple(s.name for s in elf.sections),
    )


def _dynamic_symbols(elf: elftables.ElfFile) -> tuple[tuple[Symbol, ...], tuple[str, ...]]:
    """Imports (undefined, with their version needs) and exports of .dynsym."""
    names = elf.version_needs()
    imports, exports = [], []
    for name, info, shndx, ndx in elf.dynamic_symbols():
        if not name:
            continue
        bind = info >> 4
        if shndx == elftables.SHN_UNDEF:
            version = library = None
            if ndx is not None and ndx not in _VERSYM_RESERVED:
                version, library = names.get(ndx & 0x7FFF, (None, None))
            imports.append(Symbol(name, version, library, bind == _STB_WEAK))
        elif bind in _EXPORTED_BINDS:
            exports.append(name)
    return tuple(imports), tuple(exports)


_STB_WEAK = 2
_EXPORTED_BINDS = frozenset((1, 2, 10))  # global, weak, GNU unique (10: pyelftools calls it STB_LOOS)
_VERSYM_RESERVED = frozenset((0, 1, 0xFF00, 0xFF01))  # local, global, reserved: no version need
_TYPES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}


def sections_named(data: Any, name: str) -> list[bytes]:
    """The contents of every section with this name (a host .so may have several .nv_fatbin)."""
    try:
        elf = elftables.ElfFile(data)
    except elftables.ElfError as exc:
        raise AuditError(f"cannot read section {name}: {exc}") from None
    return [elf.contents(s) for s in elf.sections if s.name == name and s.type != elftables.SHT_NOBITS]
