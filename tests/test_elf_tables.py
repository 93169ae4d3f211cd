"""abicache.native.elftables reads ELF tables with struct (pyelftools took 13 ms of the
audit after every link and up to 50 ms to read libstdc++'s version
definitions): every value must equal what pyelftools reads, on real files."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest

from abicache.native import elftables
from abicache.env import probes
from corpus import PLAIN_C, gxx, nvcc
from test_elf_symbols import _libraries

pytest.importorskip("elftools")
from elftools.elf.elffile import ELFFile  # noqa: E402
from elftools.elf.enums import ENUM_E_MACHINE, ENUM_E_TYPE, ENUM_EI_OSABI  # noqa: E402


def _number(value: object, names: dict[str, int]) -> int:
    return value if isinstance(value, int) else names[str(value)]


def _built(tmp: Path) -> list[Path]:
    """Files made here: a C library, a relocatable object (no dynamic view), a cubin."""
    out = [gxx(PLAIN_C, tmp / "libplain.so", lang="c")]
    if shutil.which("cc"):
        (tmp / "obj.c").write_text("int f(int x) { return x + 1; }\n")
        subprocess.run(["cc", "-c", str(tmp / "obj.c"), "-o", str(tmp / "obj.o")], check=True)
        out.append(tmp / "obj.o")
    try:
        out.append(nvcc(tmp / "k.cubin", "-cubin", "-arch=sm_90a"))
    except pytest.skip.Exception:
        pass
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return _libraries() + _built(tmp_path_factory.mktemp("elf"))


def _reference(data: bytes) -> dict[str, object]:
    f = ELFFile(io.BytesIO(data))
    h = f.header
    sections = list(f.iter_sections())
    needed, soname = [], None
    dynamic = f.get_section_by_name(".dynamic")
    for tag in dynamic.iter_tags() if dynamic is not None else ():
        if tag.entry.d_tag == "DT_NEEDED":
            needed.append(tag.needed)
        elif tag.entry.d_tag == "DT_SONAME":
            soname = tag.soname
    needs = {}
    verneed = f.get_section_by_name(".gnu.version_r")
    for need, auxes in verneed.iter_versions() if verneed is not None else ():
        for aux in auxes:
            needs[aux["vna_other"]] = (aux.name, need.name)
    verdef = f.get_section_by_name(".gnu.version_d")
    defs = [aux.name for _, auxes in (verdef.iter_versions() if verdef is not None else ()) for aux in auxes]
    return {
        "bits": f.elfclass,
        "machine": _number(h["e_machine"], ENUM_E_MACHINE),
        "type": _number(h["e_type"], ENUM_E_TYPE),
        "osabi": _number(h["e_ident"]["EI_OSABI"], ENUM_EI_OSABI),
        "abiversion": h["e_ident"]["EI_ABIVERSION"],
        "flags": h["e_flags"],
        "sections": [(s.name, s["sh_offset"], s["sh_size"], s["sh_link"], s["sh_info"], s["sh_entsize"],
                      s["sh_type"] == "SHT_NOBITS") for s in sections],
        "contents": {s.name: s.data() for s in sections if s["sh_type"] != "SHT_NOBITS"},
        "needed": tuple(needed),
        "soname": soname,
        "needs": needs,
        "defs": defs,
    }


def test_every_table_matches_pyelftools(files: list[Path]) -> None:
    assert len(files) >= 5
    for path in files:
        data = path.read_bytes()
        ref = _reference(data)
        ours = elftables.ElfFile(data)
        got = {
            "bits": ours.bits, "machine": ours.machine, "type": ours.type, "osabi": ours.osabi,
            "abiversion": ours.abiversion, "flags": ours.flags,
            "sections": [(s.name, s.offset, s.size, s.link, s.info, s.entsize, s.type == elftables.SHT_NOBITS)
                         for s in ours.sections],
            "contents": {s.name: ours.contents(s) for s in ours.sections if s.type != elftables.SHT_NOBITS},
            "needed": ours.needed_and_soname()[0],
            "soname": ours.needed_and_soname()[1],
            "needs": ours.version_needs(),
            "defs": ours.version_definitions(),
        }
        for field, value in ref.items():
            assert got[field] == value, f"{path}: {field}"
    # the cross-check is only as good as what it saw: version tables, sonames and a file without sections' names
    seen = [_reference(p.read_bytes()) for p in files]
    assert any(r["defs"] for r in seen) and any(r["needs"] for r in seen) and any(r["soname"] for r in seen)
    assert any(r["type"] == 1 for r in seen)  # an ET_REL object


def test_libstdcxx_version_floors_match_pyelftools() -> None:
    path = probes._libstdcxx_path()
    if path is None:
        pytest.skip("no libstdc++ loaded in this process")
    with open(path, "rb") as fh:
        verdef = ELFFile(fh).get_section_by_name(".gnu.version_d")
        names = [aux.name for _, auxes in verdef.iter_versions() for aux in auxes]
    glibcxx, cxxabi = probes._symbol_version_floors(path).split(";")
    assert f"GLIBCXX_{glibcxx}" in names and f"CXXABI_{cxxabi}" in names
    last = int(glibcxx.rsplit(".", 1)[1])
    assert not [n for n in names if n.startswith("GLIBCXX_3.4.") and int(n.rsplit(".", 1)[1]) > last]


@pytest.mark.parametrize("field,at,value", [
    ("e_shoff past the end", 0x28, (1 << 40).to_bytes(8, "little")),
    ("e_shentsize", 0x3A, (12).to_bytes(2, "little")),
    ("ELF class", 4, b"\x07"),
])
def test_a_damaged_header_is_an_elf_error(files: list[Path], field: str, at: int, value: bytes) -> None:
    data = bytearray(files[0].read_bytes())
    data[at:at + len(value)] = value
    with pytest.raises(elftables.ElfError):
        elftables.ElfFile(bytes(data))


def test_a_version_chain_claiming_more_entries_than_fit_is_refused(files: list[Path]) -> None:
    """sh_info of .gnu.version_r set to 2**32-1: refused at once, not walked."""
    path = next(p for p in files if _reference(p.read_bytes())["needs"])
    data = bytearray(path.read_bytes())
    ours = elftables.ElfFile(bytes(data))
    index = next(i for i, s in enumerate(ours.sections) if s.name == ".gnu.version_r")
    shoff = int.from_bytes(data[0x28:0x30], "little")
    info_at = shoff + index * 64 + 44  # Elf64_Shdr.sh_info
    data[info_at:info_at + 4] = (2**32 - 1).to_bytes(4, "little")
    with pytest.raises(elftables.ElfError, match="claims"):
        elftables.ElfFile(bytes(data)).version_needs()
