"""AMDGPU code objects (ELF e_machine EM_AMDGPU = 224): Triton's .hsaco, hipcc's
device code, standalone code object files.

What a code object needs is in its ELF header (LLVM's AMDGPUUsage, "ELF Header"):
  EI_ABIVERSION  the code object version: 1 = v3, 2 = v4, 3 = v5, 4 = v6;
  e_flags & 0xff the processor (EF_AMDGPU_MACH_*), e.g. 0x04c = gfx942;
  e_flags        v4 and later: XNACK in bits 8-9 and SRAMECC in bits 10-11, each
                 0 unsupported, 1 any, 2 off, 3 on; v3: bit 8 XNACK on, bit 9 SRAMECC on;
  e_flags >> 24  v6: the version of a generic processor.
So a code object for gfx942 with XNACK "any" needs `gpu.arch ~= gfx942`; one
built `xnack-` needs `gpu.arch ~= gfx942:xnack-`. It never needs the host's
machine: it is device code.
"""

from __future__ import annotations

from typing import NamedTuple

from .elf import ElfInfo
from .errors import AuditError

EM_AMDGPU = 224
#: EF_AMDGPU_MACH_* (llvm/BinaryFormat/ELF.h), the processors a code object can name
MACH = {
    0x020: "gfx600", 0x021: "gfx601", 0x022: "gfx700", 0x023: "gfx701", 0x024: "gfx702", 0x025: "gfx703",
    0x026: "gfx704", 0x028: "gfx801", 0x029: "gfx802", 0x02a: "gfx803", 0x02b: "gfx810", 0x02c: "gfx900",
    0x02d: "gfx902", 0x02e: "gfx904", 0x02f: "gfx906", 0x030: "gfx908", 0x031: "gfx909", 0x032: "gfx90c",
    0x033: "gfx1010", 0x034: "gfx1011", 0x035: "gfx1012", 0x036: "gfx1030", 0x037: "gfx1031",
    0x038: "gfx1032", 0x039: "gfx1033", 0x03a: "gfx602", 0x03b: "gfx705", 0x03c: "gfx805",
    0x03d: "gfx1035", 0x03e: "gfx1034", 0x03f: "gfx90a", 0x040: "gfx940", 0x041: "gfx1100",
    0x042: "gfx1013", 0x043: "gfx1150", 0x044: "gfx1103", 0x045: "gfx1036", 0x046: "gfx1101",
    0x047: "gfx1102", 0x048: "gfx1200", 0x04a: "gfx1151", 0x04b: "gfx941", 0x04c: "gfx942",
    0x04e: "gfx1201", 0x04f: "gfx950", 0x051: "gfx9-generic", 0x052: "gfx10-1-generic",
    0x053: "gfx10-3-generic", 0x054: "gfx11-generic", 0x055: "gfx1152", 0x058: "gfx1153",
    0x059: "gfx12-generic", 0x05f: "gfx9-4-generic",
}
_VERSIONS = {1: 3, 2: 4, 3: 5, 4: 6}  # EI_ABIVERSION -> code object version
_MODES_V4 = {0: None, 1: "", 2: "-", 3: "+"}  # None: the processor has no such mode


class CodeObject(NamedTuple):
    target: str  # LLVM target ID: "gfx942", "gfx90a:xnack-"
    version: int  # code object version
    xnack: str | None  # "+", "-", "" (any) or None (unsupported)
    sramecc: str | None
    generic_version: int | None

    def describe(self) -> str:
        modes = ", ".join(f"{name} {_word(mode)}" for name, mode in (("sramecc", self.sramecc),
                                                                      ("xnack", self.xnack)) if mode is not None)
        generic = f", generic version {self.generic_version}" if self.generic_version else ""
        return f"AMDGPU code object v{self.version} for {self.target.split(':')[0]}" + (f" ({modes})" if modes else "") \
            + generic


def _word(mode: str) -> str:
    return {"+": "on", "-": "off", "": "any"}[mode]


def is_code_object(info: ElfInfo) -> bool:
    return info.machine == "amdgpu"


def code_object(info: ElfInfo) -> CodeObject:
    version = _VERSIONS.get(info.abiversion)
    if version is None:
        raise AuditError(f"{info.path}: AMDGPU code object with unknown ABI version {info.abiversion} "
                         "(abicache reads code object v3 to v6)")
    mach = info.flags & 0xFF
    processor = MACH.get(mach)
    if processor is None:
        raise AuditError(f"{info.path}: AMDGPU code object for an unknown processor (EF_AMDGPU_MACH {mach:#x}); "
                         "abicache does not know which GPUs can run it")
    if version == 3:
        xnack: str | None = "+" if info.flags & 0x100 else ""
        sramecc: str | None = "+" if info.flags & 0x200 else ""
    else:
        xnack = _MODES_V4[(info.flags >> 8) & 3]
        sramecc = _MODES_V4[(info.flags >> 10) & 3]
    generic = (info.flags >> 24) & 0xFF if version >= 6 else 0
    modes = "".join(f":{name}{mode}" for name, mode in (("sramecc", sramecc), ("xnack", xnack)) if mode)
    return CodeObject(processor + modes, version, xnack, sramecc, generic or None)
