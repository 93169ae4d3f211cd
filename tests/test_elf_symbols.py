"""audit/elf.py reads .dynsym with struct (pyelftools took 0.15 s of each torch-extension
build): its imports and exports must equal what pyelftools itself reads, on real libraries."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from abicache.audit import elf

pytest.importorskip("elftools")
from elftools.elf.elffile import ELFFile  # noqa: E402


def reference(path: Path) -> tuple[tuple[elf.Symbol, ...], tuple[str, ...]]:
    """The symbol view read entirely with pyelftools, symbol by symbol."""
    with open(path, "rb") as fh:
        f = ELFFile(fh)
        dynsym = f.get_section_by_name(".dynsym")
        versym = f.get_section_by_name(".gnu.version")
        names: dict[int, tuple[str, str]] = {}
        verneed = f.get_section_by_name(".gnu.version_r")
        if verneed is not None:
            for need, auxes in verneed.iter_versions():
                for aux in auxes:
                    names[aux["vna_other"]] = (aux.name, need.name)
        imports, exports = [], []
        for index, sym in enumerate(dynsym.iter_symbols()):
            if not sym.name:
                continue
            bind = sym["st_info"]["bind"]
            if sym["st_shndx"] == "SHN_UNDEF":
                version = library = None
                ndx = versym.get_symbol(index)["ndx"] if versym is not None else None
                if isinstance(ndx, int):
                    version, library = names.get(ndx & 0x7FFF, (None, None))
                imports.append(elf.Symbol(sym.name, version, library, bind == "STB_WEAK"))
            elif bind in ("STB_GLOBAL", "STB_WEAK", "STB_LOOS"):  # STB_LOOS is GNU_UNIQUE's value
                exports.append(sym.name)
    return tuple(imports), tuple(exports)


def _libraries() -> list[Path]:
    found = [ctypes.util.find_library(n) for n in ("stdc++", "ssl", "z", "m")]
    paths = [Path(p) if os.path.isabs(p) else Path(f"/lib/x86_64-linux-gnu/{p}") for p in found if p]
    libpython = Path(sysconfig.get_config_var("LIBDIR") or "/") / (sysconfig.get_config_var("LDLIBRARY") or "")
    paths += [libpython, Path(sys.executable).resolve()]
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec and spec.origin:
            paths += sorted((Path(spec.origin).parent / "lib").glob("libc10.so"))
    except (ImportError, ValueError):
        pass
    return [p for p in paths if p.is_file()]


@pytest.mark.parametrize("path", _libraries(), ids=lambda p: p.name)
def test_symbols_match_pyelftools(path: Path) -> None:
    info = elf.parse(path)
    imports, exports = reference(path)
    assert info.imports == imports
    assert info.exports == exports
    assert imports or exports


def test_versioned_weak_and_gnu_unique_symbols(tmp_path: Path) -> None:
    """A library built here: a weak import, versioned glibc imports, a GNU-unique export."""
    if not shutil.which("c++"):
        pytest.skip("no c++ compiler")
    src = tmp_path / "u.cpp"
    src.write_text('#include <cstdio>\nextern "C" int maybe(void) __attribute__((weak));\n'
                   "template <class T> struct S { static inline int n = 0; };\n"
                   'extern "C" int touch() { std::puts("x"); return S<int>::n++ + (maybe ? maybe() : 0); }\n')
    out = tmp_path / "libu.so"
    subprocess.run(["c++", "-shared", "-fPIC", "-O1", str(src), "-o", str(out)], check=True)
    info = elf.parse(out)
    assert (info.imports, info.exports) == reference(out)
    by_name = {s.name: s for s in info.imports}
    assert by_name["maybe"].weak and by_name["maybe"].version is None
    assert by_name["puts"].library == "libc.so.6" and by_name["puts"].version.startswith("GLIBC_")
    assert "touch" in info.exports
    assert "_ZN1SIiE1nE" in info.exports  # GNU unique: pyelftools names its binding STB_LOOS


@pytest.mark.parametrize("cut", [".dynsym", ".gnu.version"])
def test_a_damaged_symbol_table_is_an_audit_error(tmp_path: Path, cut: str) -> None:
    """A section header whose size no longer fits its entries: an AuditError, not garbage."""
    src = Path(ctypes.util.find_library("z") or "libz.so.1")
    lib = src if src.is_absolute() else Path("/lib/x86_64-linux-gnu") / src
    if not lib.is_file():
        pytest.skip("no libz to copy")
    data = bytearray(lib.read_bytes())
    with open(lib, "rb") as fh:
        f = ELFFile(fh)
        sec = f.get_section_by_name(cut)
        index = next(i for i, s in enumerate(f.iter_sections()) if s.name == cut)
        header_at = f.header["e_shoff"] + index * f.header["e_shentsize"]
    size_at = header_at + 32  # Elf64_Shdr.sh_size
    new = sec["sh_size"] - 1 if cut == ".dynsym" else 2
    data[size_at:size_at + 8] = new.to_bytes(8, "little")
    bad = tmp_path / "libbad.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(elf.AuditError, match="entries|malformed|truncated"):
        elf.parse(bad)
