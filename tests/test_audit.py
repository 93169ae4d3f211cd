from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from abicache import Cache, cc
from abicache.audit import AuditError, audit_file
from abicache.env import Facts
from abicache.errors import BuildError
from conftest import SRC
from corpus import (CXX_STRING, PLAIN_C, PY_FULL, PY_LIMITED, PY_TOO_NEW, STALE_TORCH, TARGET_2_10,
                    TORCH_CLASSIC, TORCH_FAKE_STABLE, TORCH_STABLE, find_tool, gxx, nvcc,
                    torch_op, torch_root)


def reqs(path: Path, **kw) -> list[str]:
    return [str(f.requirement) for f in audit_file(path, **kw).findings]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def test_plain_c_library(work: Path) -> None:
    audited = audit_file(gxx(PLAIN_C, work / "libplain.so", lang="c"))
    found = [str(f.requirement) for f in audited.findings]
    assert audited.kind == "shared library"
    assert "platform.libc == glibc" in found
    glibc = next(r for r in found if r.startswith("platform.glibc >= "))
    assert glibc == "platform.glibc >= 2.26"  # reallocarray@GLIBC_2.26 is the newest import
    assert not any(r.startswith(("python.", "torch.", "platform.glibcxx")) for r in found)
    evidence = {str(f.requirement): f.evidence for f in audited.findings}
    assert "reallocarray" in evidence[glibc]


@pytest.mark.parametrize("abi,expected", [("0", "old"), ("1", "new")])
def test_cxx_string_abi_evidence(work: Path, abi: str, expected: str) -> None:
    lib = gxx(CXX_STRING, work / f"libcxx{abi}.so", f"-D_GLIBCXX_USE_CXX11_ABI={abi}")
    audited = audit_file(lib)
    assert audited.summary["cxx_abi"] == expected
    assert any(str(f.requirement).startswith("platform.glibcxx >= 3.4") for f in audited.findings)


def test_cpython_module_against_the_full_api(work: Path, root: Path) -> None:
    art = cc.build_module("fullmod", [PY_FULL.replace("NAME", "fullmod")], cache=Cache(root))
    audited = audit_file(art.file())  # standalone: the file name carries the ABI tag
    abi = Facts().get("python.abi")
    assert f"python.abi == {abi}" in [str(f.requirement) for f in audited.findings]
    assert audited.summary["outside_limited_api"] >= 1 and not audited.problems
    assert "_PyBytes_Resize" in next(f.evidence for f in audited.findings if f.requirement.name == "python.abi")


@pytest.mark.parametrize("source", ["PY_FULL", "PY_LIMITED"])
def test_an_untagged_module_is_unverifiable(work: Path, source: str) -> None:
    """mod.so, no ABI tag: the CPython minor it needs is recorded nowhere (even limited-API
    imports prove nothing without Py_LIMITED_API): unverifiable, never 'loads anywhere'."""
    import sysconfig

    code = {"PY_FULL": PY_FULL, "PY_LIMITED": PY_LIMITED}[source]
    path = gxx(code.replace("NAME", "mod"), work / f"mod_{source}.so", f"-I{sysconfig.get_paths()['include']}",
               lang="c")
    assert reqs(path)[-1] == "python.abi == unknown"
    out = subprocess.run([sys.executable, "-m", "abicache", "audit", str(path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 1, out.stdout  # not "fine": abicache cannot show that it loads here
    assert "python.abi == unknown" in out.stdout and "unverifiable" in out.stdout


def test_torchs_own_library_holds_in_its_own_torch() -> None:
    """libtorch_python.so in the installed torch: that torch's build, not 'unknown'."""
    root = torch_root()
    found = reqs(root / "lib" / "libtorch_python.so")
    assert f"torch.build == {Facts().get('torch.build')}" in found


def test_abi3_module(root: Path) -> None:
    art = cc.build_module("limmod", [PY_LIMITED.replace("NAME", "limmod")], abi3="3.10", cache=Cache(root))
    assert "python.abi3 >= 3.10" in art.requirements.to_list()
    audited = audit_file(art.file())
    assert "python.abi3 >= 3.2" in [str(f.requirement) for f in audited.findings]  # the symbols' own floor
    assert not audited.problems


def test_abi3_claim_broken_by_a_newer_symbol_fails_the_build(root: Path) -> None:
    with pytest.raises(BuildError) as info:
        cc.build_module("newmod", [PY_TOO_NEW.replace("NAME", "newmod")], abi3="3.10", cache=Cache(root))
    text = str(info.value)
    assert "PyErr_GetRaisedException" in text and "3.12" in text and "abi3 >= 3.10" in text
    assert not list(Cache(root).store.iter_variant_dirs())


def test_abi3_claim_broken_by_a_non_limited_symbol(work: Path) -> None:
    include = __import__("sysconfig").get_paths()["include"]
    lib = gxx(PY_FULL.replace("NAME", "fake3"), work / "fake3.abi3.so", f"-I{include}", lang="c")
    audited = audit_file(lib)
    assert any("outside the limited API: _PyBytes_Resize" in p for p in audited.problems)


CUBINS = [("sm_80", "sm_80"), ("sm_90", "sm_90"), ("sm_90a", "sm_90a"), ("sm_100a", "sm_100a"),
          ("sm_100f", "sm_100f")]


@pytest.mark.parametrize("arch,expected", CUBINS)
def test_nvcc_cubins(work: Path, arch: str, expected: str) -> None:
    cubin = nvcc(work / f"k_{arch}.cubin", "-cubin", f"-arch={arch}")
    assert reqs(cubin) == [f"gpu.arch ~= {expected}"]


def test_ptx(work: Path) -> None:
    ptx = nvcc(work / "k.ptx", "-ptx", "-arch=compute_80")
    assert reqs(ptx) == ["gpu.arch ~= compute_80", "cuda.driver >= 13.0"]


def test_multi_arch_fatbin_with_compressed_ptx(work: Path) -> None:
    fat = nvcc(work / "k.fatbin", "-fatbin", "-gencode", "arch=compute_80,code=sm_80",
               "-gencode", "arch=compute_90a,code=sm_90a", "-gencode", "arch=compute_90,code=compute_90")
    audited = audit_file(fat)
    assert [str(f.requirement) for f in audited.findings] == ["gpu.arch ~= compute_90,sm_80,sm_90a"]
    ptx = [t for t in audited.summary["targets"] if t["kind"] == "ptx"]
    checked = __import__("importlib").util.find_spec("zstandard") is not None
    assert ptx == [{"kind": "ptx", "arch": "compute_90", "ptx_isa": "9.0", "compression": "zstd",
                    "checked": checked}]


def test_a_fatbin_whose_ptx_disagrees_with_its_header_is_refused(work: Path) -> None:
    pytest.importorskip("zstandard", reason="needs zstandard to read compressed PTX")
    fat = nvcc(work / "lie.fatbin", "-fatbin", "-gencode", "arch=compute_90,code=compute_90")
    data = bytearray(fat.read_bytes())
    entry = 16  # after the container header: patch the entry's arch field from 90 to 80
    assert int.from_bytes(data[entry + 28:entry + 32], "little") == 90
    data[entry + 28:entry + 32] = (80).to_bytes(4, "little")
    fat.write_bytes(bytes(data))
    with pytest.raises(AuditError, match="the header says compute_80 ISA 9.0, the PTX inside says compute_90"):
        audit_file(fat)


def test_host_library_with_shared_cudart(work: Path) -> None:
    lib = nvcc(work / "libk.so", "--cudart=shared", "-shared", "-Xcompiler", "-fPIC",
               "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=compute_90")
    found = reqs(lib)
    assert "cuda.runtime == 13" in found
    assert "gpu.arch ~= compute_90,sm_80" in found


def _cuobjdump_list(tool: str, path: Path) -> list[tuple[str, str]]:
    out = subprocess.run([tool, "-lelf", "-lptx", str(path)], capture_output=True, text=True).stdout
    pairs = []
    for line in out.splitlines():
        match = re.match(r"(ELF|PTX) file\s+\d+: .*\.(sm_\d+[af]?)\.(cubin|ptx)$", line.strip())
        if match:
            kind = "elf" if match.group(1) == "ELF" else "ptx"
            arch = match.group(2) if kind == "elf" else match.group(2).replace("sm_", "compute_")
            pairs.append((kind, arch))
    return sorted(pairs)


def _ours(path: Path) -> list[tuple[str, str]]:
    audited = audit_file(path)
    targets = audited.summary.get("targets") or audited.summary.get("device_code") or []
    # cuobjdump does not print the family suffix of a cubin: compare without it.
    return sorted((t["kind"], t["arch"].rstrip("f") if t["kind"] == "elf" else t["arch"]) for t in targets)


def test_cuda_parser_agrees_with_cuobjdump(work: Path) -> None:
    tool = find_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    files = [nvcc(work / f"x_{a}.cubin", "-cubin", f"-arch={a}") for a, _ in CUBINS]
    files.append(nvcc(work / "x.fatbin", "-fatbin", "-gencode", "arch=compute_80,code=sm_80",
                      "-gencode", "arch=compute_90a,code=sm_90a", "-gencode", "arch=compute_90,code=compute_90"))
    files.append(nvcc(work / "libx.so", "--cudart=shared", "-shared", "-Xcompiler", "-fPIC",
                      "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=compute_90"))
    for path in files:
        assert _ours(path) == _cuobjdump_list(tool, path), path.name


def test_classic_torch_op_needs_the_exact_build(work: Path) -> None:
    lib = torch_op(TORCH_CLASSIC, work / "classic.so")
    facts = Facts()
    here = audit_file(lib, facts=facts, built_here=True)
    assert f"torch.build == {facts.get('torch.build')}" in [str(f.requirement) for f in here.findings]
    standalone = audit_file(lib)
    finding = next(f for f in standalone.findings if f.requirement.name == "torch.build")
    assert str(finding.requirement) == "torch.build == unknown"
    assert "c10::" in finding.evidence and "unstable torch C++ symbols" in finding.evidence
    assert not standalone.problems  # every import is exported by the installed torch


def test_stable_op_with_target_2_10_needs_torch_2_10(work: Path) -> None:
    lib = torch_op(TORCH_STABLE, work / "stable.so", TARGET_2_10)
    found = reqs(lib)
    assert "torch.version >= 2.10" in found
    assert not any(r.startswith("torch.build") for r in found)


def test_fake_stable_op_fails_its_build_with_the_symbols_named(root: Path) -> None:
    """Declared stable, built without TORCH_TARGET_VERSION (with it, torch's own headers
    refuse ATen.h at compile time): only the binary tells, and the cache refuses it."""
    torch_root()
    cache = Cache(root)

    def build(out: Path) -> None:
        torch_op(TORCH_FAKE_STABLE, out / "fake_stable.so")

    with pytest.raises(BuildError) as info:
        cache.get_or_build("torch.stable", "fake_stable", {"sources": {"x": TORCH_FAKE_STABLE}}, build,
                           requires=["torch.version >= 2.10"])
    text = str(info.value)
    assert "declared for the stable ABI (torch >= 2.10) but imports" in text
    assert "at::" in text or "c10::" in text
    assert not list(cache.store.iter_variant_dirs())


def test_stale_torch_extension_is_found_by_its_missing_symbols(work: Path) -> None:
    root = torch_root()
    lib = gxx(STALE_TORCH, work / "stale.so", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=0",
              "-isystem", str(root / "include"))
    audited = audit_file(lib)
    assert any("does not export" in p and "torchCheckFail" in p for p in audited.problems)


@pytest.mark.parametrize("content,message", [
    (b"#!/bin/sh\necho hi\n", None),
    (b"\x7fELF\x02\x01\x01" + b"\x00" * 9, "truncated or malformed"),
    (b"\x50\xed\x55\xba\x01\x00\x10\x00" + b"\xff" * 8, "runs past the end"),
])
def test_bad_inputs_get_clear_errors(tmp_path: Path, content: bytes, message: str | None) -> None:
    path = tmp_path / "input.bin"
    path.write_bytes(content)
    if message is None:
        assert audit_file(path).kind == "data"
        return
    with pytest.raises(AuditError, match=message):
        audit_file(path)


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="cannot read .*No such file"):
        audit_file(tmp_path / "nope.so")


def test_published_entries_carry_detected_requirements_and_evidence(root: Path) -> None:
    art = cc.build_library("plainc", [{"plain.c": PLAIN_C}], lang="c", cache=Cache(root))
    assert "platform.glibc >= 2.26" in art.requirements.to_list()
    assert art.manifest.declared == type(art.requirements)()
    summary = art.manifest.audit["libplainc.so"]
    assert summary["kind"] == "shared library"
    assert "reallocarray" in summary["evidence"]["platform.glibc >= 2.26"]
    # The environment here must satisfy them, or it would not have been published.
    assert art.requirements.satisfied_by(Cache(root).facts)


def test_the_audit_needs_no_pyelftools(tmp_path: Path) -> None:
    """Seen on a GPU image without pyelftools: the audit called every cubin 'malformed'.
    The tables are now read by abicache.native.elftables, so the audit works without it."""
    script = ("import sys; sys.modules['elftools'] = None\n"
              "from abicache.audit import audit_file\n"
              "audited = audit_file(sys.argv[1])\n"
              "print(audited.kind, sorted(str(r) for r in audited.requirements()))\n")
    done = subprocess.run([sys.executable, "-c", script, sys.executable], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr
    assert "platform.machine ==" in done.stdout and "platform.glibc >=" in done.stdout, done.stdout
