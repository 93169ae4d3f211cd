"""ELF reading with pyelftools: what a binary needs from the system.

Only the dynamic view matters for loading: DT_NEEDED, DT_SONAME, the
undefined dynamic symbols with their version needs, and the exported ones.
Any malformed or truncated input becomes an AuditError naming the file.
"""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path
from typing import Any, NamedTuple

from .errors import AuditError

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
_MACHINES = {
    "EM_X86_64": "x86_64",
    "EM_AARCH64": "aarch64",
    "EM_386": "i686",
    "EM_PPC64": "ppc64le",
    "EM_S390": "s390x",
    "EM_RISCV": "riscv64",
    "EM_ARM": "armv7l",
    "EM_CUDA": "cuda",
    EM_CUDA: "cuda",
    "EM_AMDGPU": "amdgpu",  # device code objects (audit/amdgpu.py)
    224: "amdgpu",
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
    except AuditError:
        raise
    except ImportError as exc:  # a missing dependency, not a bad file (seen on a bare GPU image)
        module = (exc.name or str(exc)).split(".")[0]
        raise AuditError(f"cannot audit {path}: {module} is not installed (pip install pyelftools, "
                         "or reinstall abicache with its dependencies)") from None
    except Exception as exc:  # pyelftools raises many types on bad input; all mean the same
        raise AuditError(f"{path} is a truncated or malformed ELF file ({type(exc).__name__}: {exc})") from None


def _stream(data: Any) -> Any:
    import mmap

    return data if isinstance(data, mmap.mmap) else io.BytesIO(data)


def _parse(path: str, data: Any) -> ElfInfo:
    from elftools.elf.elffile import ELFFile  # only when auditing

    elf = ELFFile(_stream(data))
    header = elf.header
    _check_tables(elf, len(data))
    sections = tuple(s.name for s in elf.iter_sections())
    needed, soname = _dynamic_tags(elf)
    imports, exports = _dynamic_symbols(elf, data)
    return ElfInfo(
        path=path,
        bits=elf.elfclass,
        machine=_MACHINES.get(header["e_machine"], str(header["e_machine"]).lower()),
        osabi=_osabi(header["e_ident"]["EI_OSABI"]),
        abiversion=int(header["e_ident"]["EI_ABIVERSION"]),
        flags=int(header["e_flags"]),
        elf_type=str(header["e_type"]),
        soname=soname,
        needed=needed,
        imports=imports,
        exports=exports,
        sections=sections,
    )


def _check_tables(elf: Any, size: int) -> None:
    """Refuse section tables that point past the end (pyelftools would loop or read garbage)."""
    header = elf.header
    end = header["e_shoff"] + header["e_shnum"] * header["e_shentsize"]
    if header["e_shnum"] and end > size:
        raise AuditError(f"section table ends at byte {end}, past the end of the file ({size} bytes)")
    for section in elf.iter_sections():
        if section["sh_type"] != "SHT_NOBITS" and section["sh_offset"] + section["sh_size"] > size:
            raise AuditError(f"section {section.name!r} runs past the end of the file")


def _osabi(value: Any) -> int:
    """pyelftools names the OS ABIs it knows and leaves others (CUDA's 0x33, 0x41) as numbers."""
    if isinstance(value, int):
        return value
    from elftools.elf.enums import ENUM_EI_OSABI

    return int(ENUM_EI_OSABI.get(value, 0))


def _dynamic_tags(elf: Any) -> tuple[tuple[str, ...], str | None]:
    dynamic = elf.get_section_by_name(".dynamic")
    if dynamic is None:
        return (), None
    needed, soname = [], None
    for tag in dynamic.iter_tags():
        if tag.entry.d_tag == "DT_NEEDED":
            needed.append(tag.needed)
        elif tag.entry.d_tag == "DT_SONAME":
            soname = tag.soname
    return tuple(needed), soname


def _version_names(elf: Any) -> dict[int, tuple[str, str]]:
    """Version index -> (version name, library) from .gnu.version_r."""
    verneed = elf.get_section_by_name(".gnu.version_r")
    out: dict[int, tuple[str, str]] = {}
    if verneed is None:
        return out
    for need, auxes in verneed.iter_versions():
        for aux in auxes:
            out[aux["vna_other"]] = (aux.name, need.name)
    return out


def _dynamic_symbols(elf: Any, data: Any) -> tuple[tuple[Symbol, ...], tuple[str, ...]]:
    """Imports (undefined, with their version needs) and exports of .dynsym.

    A torch extension has thousands of dynamic symbols; pyelftools' per-symbol
    parsing took 0.15 s of every cold build. The fixed-size tables are unpacked
    with struct instead (tests cross-check against pyelftools on real libraries).
    """
    dynsym = elf.get_section_by_name(".dynsym")
    if dynsym is None:
        return (), ()
    versym = elf.get_section_by_name(".gnu.version")
    end = "<" if elf.little_endian else ">"
    # (st_name, st_info, st_shndx) positions in each class's Elf_Sym
    fmt, name_at, info_at, shndx_at = ((end + "IBBHQQ", 0, 1, 3) if elf.elfclass == 64
                                      else (end + "IIIBBH", 0, 3, 5))
    size = struct.calcsize(fmt)
    strtab = elf.get_section(dynsym["sh_link"])
    table = dynsym.data()
    if dynsym["sh_entsize"] != size or len(table) % size:
        raise AuditError(f".dynsym entries are {dynsym['sh_entsize']} bytes, not {size}")
    count = len(table) // size
    ndx = _version_indexes(versym, end, count)
    names = _version_names(elf)
    base = strtab["sh_offset"]
    imports, exports = [], []
    for index, sym in enumerate(struct.iter_unpack(fmt, table)):
        name = _cstring(data, base + sym[name_at])
        if not name:
            continue
        bind = sym[info_at] >> 4
        if sym[shndx_at] == _SHN_UNDEF:
            version = library = None
            if ndx is not None and ndx[index] not in _VERSYM_RESERVED:
                version, library = names.get(ndx[index] & 0x7FFF, (None, None))
            imports.append(Symbol(name, version, library, bind == _STB_WEAK))
        elif bind in _EXPORTED_BINDS:
            exports.append(name)
    return tuple(imports), tuple(exports)


_SHN_UNDEF = 0
_STB_WEAK = 2
_EXPORTED_BINDS = frozenset((1, 2, 10))  # global, weak, GNU unique (10: pyelftools calls it STB_LOOS)
_VERSYM_RESERVED = frozenset((0, 1, 0xFF00, 0xFF01))  # local, global, reserved: no version need


def _version_indexes(versym: Any, end: str, count: int) -> tuple[int, ...] | None:
    if versym is None:
        return None
    raw = versym.data()
    if len(raw) < 2 * count:
        raise AuditError(f".gnu.version has {len(raw) // 2} entries for {count} dynamic symbols")
    return struct.unpack(f"{end}{count}H", raw[:2 * count])


def _cstring(data: Any, at: int) -> str:
    """The NUL-terminated name at this file offset ('' when unterminated, as pyelftools reads it)."""
    stop = data.find(b"\0", at)
    return "" if stop < 0 else data[at:stop].decode("utf-8", errors="replace")


def sections_named(data: Any, name: str) -> list[bytes]:
    """The contents of every section with this name (a host .so may have several .nv_fatbin)."""
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(_stream(data))
        return [s.data() for s in elf.iter_sections() if s.name == name and s["sh_type"] != "SHT_NOBITS"]
    except Exception as exc:
        raise AuditError(f"cannot read section {name}: {type(exc).__name__}: {exc}") from None
