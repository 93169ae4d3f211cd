"""The few ELF tables abicache reads, unpacked with struct: the header, the
section table, the dynamic tags (DT_NEEDED, DT_SONAME), the version needs
and definitions, and the dynamic symbols.

pyelftools builds an object for every section to find one by name (and
parses the whole GNU hash table on the way): 13 ms to audit a freshly linked
torch extension and 5 to 50 ms to read libstdc++'s version definitions, both
between the link and the load of every build (bench/build.py). These tables
have fixed layouts; tests cross-check every value read here against
pyelftools on real libraries (tests/test_elf_tables.py).

Every offset and count is checked against the file's size and every chain
is bounded by its table, so bad input raises ElfError and never loops.
Names are read as pyelftools reads them: up to the NUL, UTF-8 with
replacement, '' when unterminated.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Iterator, NamedTuple

MAGIC = b"\x7fELF"
SHT_NOBITS = 8
SHT_DYNSYM = 11
SHN_UNDEF = 0
_SHN_XINDEX = 0xFFFF
DT_NEEDED, DT_SONAME = 1, 14

# (ELF header after e_ident, section header, Elf_Dyn, Elf_Sym with (name, info, shndx) positions)
_LAYOUT = {
    64: ("HHIQQQIHHHHHH", "IIQQQQIIQQ", "qQ", ("IBBHQQ", 0, 1, 3)),
    32: ("HHIIIIIHHHHHH", "IIIIIIIIII", "iI", ("IIIBBH", 0, 3, 5)),
}
_VERNEED, _VERNAUX = "HHIII", "IHHII"  # (version, cnt, file, aux, next); (hash, flags, other, name, next)
_VERDEF, _VERDAUX = "HHHHIII", "II"  # (version, flags, ndx, cnt, hash, aux, next); (name, next)


class ElfError(ValueError):
    """The file is not a sound ELF file; the message says what is wrong."""


class Section(NamedTuple):
    name: str
    type: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


class ElfFile:
    """The header and section table of an ELF image held in memory (bytes or an mmap)."""

    def __init__(self, data: Any) -> None:
        if len(data) < 16 or data[:4] != MAGIC:
            raise ElfError("no ELF header")
        self.data = data
        self.bits = {1: 32, 2: 64}.get(data[4], 0)
        if not self.bits or data[5] not in (1, 2):
            raise ElfError(f"unknown ELF class {data[4]} or byte order {data[5]}")
        self.end = "<" if data[5] == 1 else ">"
        self.osabi, self.abiversion = data[7], data[8]
        header, self._shdr, self._dyn, self._sym = _LAYOUT[self.bits]
        (self.type, self.machine, _, _, _, shoff, self.flags, _, _, _, shentsize, shnum,
         shstrndx) = self._unpack(header, 16)
        self.sections = self._sections(shoff, shentsize, shnum, shstrndx)

    # ---- raw reads ------------------------------------------------------

    def _unpack(self, fmt: str, at: int) -> tuple[int, ...]:
        size = struct.calcsize(self.end + fmt)  # struct caches compiled formats
        if at < 0 or at + size > len(self.data):
            raise ElfError(f"a {size}-byte record at byte {at} runs past the end of the file ({len(self.data)} bytes)")
        return struct.unpack_from(self.end + fmt, self.data, at)

    def string(self, table: Section | None, offset: int) -> str:
        """The NUL-terminated string at offset in a string table section."""
        if table is None:
            return ""
        at = table.offset + offset
        if at >= len(self.data):
            raise ElfError(f"a name at byte {at} lies past the end of the file")
        stop = self.data.find(b"\0", at)
        return "" if stop < 0 else bytes(self.data[at:stop]).decode("utf-8", errors="replace")

    def contents(self, section: Section) -> bytes:
        return b"" if section.type == SHT_NOBITS else bytes(self.data[section.offset:section.offset + section.size])

    # ---- the section table ------------------------------------------------

    def _sections(self, shoff: int, entsize: int, count: int, strndx: int) -> tuple[Section, ...]:
        if shoff == 0:
            return ()
        size = struct.calcsize(self.end + self._shdr)
        if entsize != size:
            raise ElfError(f"section headers are {entsize} bytes, not {size}")
        first = self._unpack(self._shdr, shoff)
        count = count or first[5]  # sh_size of section 0 holds counts too large for e_shnum
        strndx = first[6] if strndx == _SHN_XINDEX else strndx  # and sh_link the string table's index
        end = shoff + count * size
        if end > len(self.data):
            raise ElfError(f"section table ends at byte {end}, past the end of the file ({len(self.data)} bytes)")
        raw = [self._unpack(self._shdr, shoff + i * size) for i in range(count)]
        for name, kind, _, _, offset, length, *_ in raw:
            if kind != SHT_NOBITS and offset + length > len(self.data):
                raise ElfError("a section runs past the end of the file")
        names = None
        if 0 < strndx < count:
            strtab = raw[strndx]
            names = Section("", strtab[1], strtab[4], strtab[5], 0, 0, 0)
        return tuple(Section(self.string(names, h[0]) if names else "", h[1], h[4], h[5], h[6], h[7], h[9])
                     for h in raw)

    def section(self, name: str) -> Section | None:
        """The first section with this name."""
        return next((s for s in self.sections if s.name == name), None)

    def linked(self, section: Section) -> Section | None:
        """The section sh_link names (a string table for the tables below)."""
        return self.sections[section.link] if 0 < section.link < len(self.sections) else None

    # ---- the dynamic view -------------------------------------------------

    def dynamic_tags(self) -> Iterator[tuple[int, int]]:
        """(d_tag, d_val) of .dynamic up to DT_NULL."""
        dynamic = self.section(".dynamic")
        if dynamic is None or dynamic.type == SHT_NOBITS:
            return
        size = struct.calcsize(self.end + self._dyn)
        for at in range(dynamic.offset, dynamic.offset + dynamic.size - size + 1, size):
            tag, value = self._unpack(self._dyn, at)
            if tag == 0:
                return
            yield tag, value

    def needed_and_soname(self) -> tuple[tuple[str, ...], str | None]:
        dynamic = self.section(".dynamic")
        if dynamic is None:
            return (), None
        strings = self.linked(dynamic)
        needed, soname = [], None
        for tag, value in self.dynamic_tags():
            if tag == DT_NEEDED:
                needed.append(self.string(strings, value))
            elif tag == DT_SONAME:
                soname = self.string(strings, value)
        return tuple(needed), soname

    def version_needs(self) -> dict[int, tuple[str, str]]:
        """Version index -> (version name, library) from .gnu.version_r."""
        section = self.section(".gnu.version_r")
        out: dict[int, tuple[str, str]] = {}
        if section is None:
            return out
        strings = self.linked(section)
        for at in self._chain(section, _VERNEED, 4):
            _, count, file, aux, _ = self._unpack(_VERNEED, at)
            library = self.string(strings, file)
            for sub in self._aux(section, at + aux, count, _VERNAUX, 4):
                _, _, other, name, _ = self._unpack(_VERNAUX, sub)
                out[other] = (self.string(strings, name), library)
        return out

    def version_definitions(self) -> list[str]:
        """Every name of .gnu.version_d (each definition's own, then its parents)."""
        section = self.section(".gnu.version_d")
        if section is None:
            return []
        strings = self.linked(section)
        names = []
        for at in self._chain(section, _VERDEF, 6):
            _, _, _, count, _, aux, _ = self._unpack(_VERDEF, at)
            for sub in self._aux(section, at + aux, count, _VERDAUX, 1):
                names.append(self.string(strings, self._unpack(_VERDAUX, sub)[0]))
        return names

    def _chain(self, section: Section, fmt: str, next_at: int) -> Iterator[int]:
        """Offsets of sh_info entries linked by their next field (as pyelftools walks them)."""
        at, limit = section.offset, section.size // struct.calcsize(self.end + fmt)
        if section.info > limit:
            raise ElfError(f"{section.name} claims {section.info} entries; it has room for {limit}")
        for _ in range(section.info):
            self._within(section, at, fmt)
            yield at
            at += self._unpack(fmt, at)[next_at]

    def _aux(self, section: Section, at: int, count: int, fmt: str, next_at: int) -> Iterator[int]:
        limit = section.size // struct.calcsize(self.end + fmt)
        if count > limit:
            raise ElfError(f"{section.name} claims {count} auxiliary entries; it has room for {limit}")
        for _ in range(count):
            self._within(section, at, fmt)
            yield at
            at += self._unpack(fmt, at)[next_at]

    def _within(self, section: Section, at: int, fmt: str) -> None:
        if not section.offset <= at <= section.offset + section.size - struct.calcsize(self.end + fmt):
            raise ElfError(f"an entry of {section.name} at byte {at} lies outside the section")

    def dynamic_symbols(self) -> Iterator[tuple[str, int, int, int | None]]:
        """(name, st_info, st_shndx, version index or None) of each .dynsym entry."""
        dynsym = self.section(".dynsym")
        if dynsym is None or dynsym.type == SHT_NOBITS:
            return
        fmt, name_at, info_at, shndx_at = self._sym
        size = struct.calcsize(self.end + fmt)
        if dynsym.entsize != size or dynsym.size % size:
            raise ElfError(f".dynsym entries are {dynsym.entsize} bytes, not {size}")
        count = dynsym.size // size
        ndx = self._version_indexes(count)
        name = self._namer(self.linked(dynsym))
        table = self.contents(dynsym)
        for index, sym in enumerate(struct.iter_unpack(self.end + fmt, table)):
            yield name(sym[name_at]), sym[info_at], sym[shndx_at], None if ndx is None else ndx[index]

    def _namer(self, table: Section | None) -> Callable[[int], str]:
        """string(table, offset) for thousands of symbols: an ASCII table (they
        all are, in practice) is decoded once and sliced; a name that runs past
        its table, or any other table, is read as string() reads it."""
        if table is None:
            return lambda offset: ""
        blob = self.contents(table)
        if not blob.isascii():
            return lambda offset: self.string(table, offset)
        text = blob.decode("ascii")

        def name(offset: int) -> str:
            stop = text.find("\0", offset)
            return text[offset:stop] if stop >= 0 else self.string(table, offset)

        return name

    def _version_indexes(self, count: int) -> tuple[int, ...] | None:
        versym = self.section(".gnu.version")
        if versym is None:
            return None
        raw = self.contents(versym)
        if len(raw) < 2 * count:
            raise ElfError(f".gnu.version has {len(raw) // 2} entries for {count} dynamic symbols")
        return struct.unpack(f"{self.end}{count}H", raw[:2 * count])
