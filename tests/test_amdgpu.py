"""AMD GPUs: code objects audited by their gfx target, AMD's loading rules, the
GPUs present from KFD's sysfs, and Triton compiling for AMD through abicache
(which failed every time: the audit gave hsaco files `platform.machine == em_amdgpu`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from abicache import Cache, Facts, Requirement
from abicache.archs import parse_device, parse_target
from abicache.audit import AuditError, audit_file
from conftest import SRC
from test_triton import compile_with, entries, has_triton

E_FLAGS = 0x30  # offset of e_flags in a 64-bit ELF header
EI_ABIVERSION = 8


@pytest.fixture(scope="module")
def hsaco(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Triton's code objects for two AMD targets, compiled here (no ROCm needed)."""
    if not has_triton(sys.executable):
        pytest.skip("triton is not installed for this interpreter (pip install triton)")
    folder = tmp_path_factory.mktemp("hsaco")
    script = ("import sys, triton, triton.language as tl\n"
              "from triton.backends.compiler import GPUTarget\nfrom triton.compiler import ASTSource\n"
              "@triton.jit\ndef k(x, n, B: tl.constexpr):\n"
              "    o = tl.program_id(0) * B + tl.arange(0, B)\n"
              "    tl.store(x + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)\n"
              "src = ASTSource(fn=k, signature={'x': '*fp32', 'n': 'i32', 'B': 'constexpr'}, constexprs={'B': 64})\n"
              "out = triton.compile(src, target=GPUTarget('hip', sys.argv[1], 64))\n"
              "open(sys.argv[2], 'wb').write(out.asm['hsaco'])\n")
    (folder / "make.py").write_text(script)  # @triton.jit needs its source in a file
    found = {}
    for arch in ("gfx90a", "gfx942"):
        path = folder / f"k_{arch}.hsaco"
        done = subprocess.run([sys.executable, str(folder / "make.py"), arch, str(path)], capture_output=True, text=True,
                              env={**os.environ, "TRITON_CACHE_DIR": str(folder / "tc")}, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        found[arch] = path
    return found


def test_triton_compiles_for_amd_through_abicache_hit_and_miss(tmp_path: Path) -> None:
    """The reported failure: 'built, but cannot be loaded here: platform.machine == em_amdgpu'."""
    if not has_triton(sys.executable):
        pytest.skip("triton is not installed for this interpreter (pip install triton)")
    root = tmp_path / "store"
    first = compile_with(sys.executable, root, ARCH="gfx942")
    again = compile_with(sys.executable, root, ARCH="gfx942")
    assert first["cubin_sha"] == again["cubin_sha"] and len(entries(root)) == 1  # the second was a hit
    other = compile_with(sys.executable, root, ARCH="gfx90a")
    assert other["cubin_sha"] != first["cubin_sha"] and len(entries(root)) == 2  # another target: a miss
    reqs = {str(Cache(root).store.read_manifest(v).requirements) for v in entries(root)}
    assert reqs == {"gpu.arch ~= gfx90a", "gpu.arch ~= gfx942"}  # nothing about the host machine


def test_audit_names_the_gfx_target_with_its_evidence(hsaco: dict[str, Path]) -> None:
    for arch, path in hsaco.items():
        done = subprocess.run([sys.executable, "-m", "abicache", "audit", str(path), "--json"], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
        doc = json.loads(done.stdout)
        found = doc[0] if isinstance(doc, list) else doc
        text = json.dumps(found)
        assert f"gpu.arch ~= {arch}" in text and f"AMDGPU code object v5 for {arch}" in text
        assert "platform.machine" not in text


def _patched(src: Path, dst: Path, flags: int, abiversion: int) -> Path:
    data = bytearray(src.read_bytes())
    data[EI_ABIVERSION] = abiversion
    struct.pack_into("<I", data, E_FLAGS, flags)
    dst.write_bytes(bytes(data))
    return dst


# processors LLVM 14's llvm-readobj names, and every mode of XNACK / SRAMECC (code object v4)
CASES = [(mach, xnack, sramecc) for mach in (0x2c, 0x2f, 0x30, 0x3f, 0x36)
         for xnack in (0, 1, 2, 3) for sramecc in (0, 1, 2, 3)]


def test_reader_agrees_with_llvm_readobj(hsaco: dict[str, Path], tmp_path: Path) -> None:
    readobj = shutil.which("llvm-readobj") or shutil.which("llvm-readobj-14")
    if readobj is None:
        pytest.skip("llvm-readobj is not installed (apt-get install llvm)")
    from abicache.audit import amdgpu, elf

    words = {"ANY": "", "OFF": "-", "ON": "+"}
    for mach, xnack, sramecc in CASES:
        flags = mach | xnack << 8 | sramecc << 10
        path = _patched(hsaco["gfx90a"], tmp_path / f"{flags:x}.hsaco", flags, 2)
        out = subprocess.run([readobj, "--file-headers", str(path)], capture_output=True, text=True).stdout
        theirs_mach = re.search(r"EF_AMDGPU_MACH_AMDGCN_(GFX\w+)", out)
        ours = amdgpu.code_object(elf.parse(path))
        assert theirs_mach and theirs_mach.group(1).lower() == ours.target.split(":")[0], out
        for feature, mode in (("XNACK", ours.xnack), ("SRAMECC", ours.sramecc)):
            said = re.search(rf"EF_AMDGPU_FEATURE_{feature}_(ANY|OFF|ON)_V4", out)
            assert (words[said.group(1)] if said else None) == mode, (hex(flags), feature, out)


def test_requirements_follow_amds_rules() -> None:
    here = Facts.from_dict({"gpu.arch": "gfx90a:sramecc+:xnack+"})
    ok = lambda text: Requirement.parse(text).check(here) is None  # noqa: E731
    assert ok("gpu.arch ~= gfx90a") and ok("gpu.arch ~= gfx90a:xnack+")
    assert not ok("gpu.arch ~= gfx90a:xnack-")  # xnack- code does not load where XNACK is on
    assert not ok("gpu.arch ~= gfx942") and not ok("gpu.arch ~= sm_90")
    assert ok("gpu.arch ~= gfx942,gfx90a")  # one of the targets runs
    mi300 = Facts.from_dict({"gpu.arch": "gfx942"})
    assert Requirement.parse("gpu.arch ~= gfx9-4-generic").check(mi300) is None
    assert Requirement.parse("gpu.arch ~= gfx11-generic").check(mi300) is not None
    assert Requirement.parse("gpu.arch ~= sm_90").check(mi300) is not None
    assert str(parse_target("gfx90a:xnack-:sramecc+")) == "gfx90a:sramecc+:xnack-"  # LLVM's order
    with pytest.raises(ValueError, match="generic target, not a device"):
        parse_device("gfx9-4-generic")
    with pytest.raises(ValueError, match="not an AMD GPU target"):
        parse_target("gfx942:xnack")


def test_amd_gpus_present_come_from_kfd_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from abicache.env import cuda_probe

    for node, version in enumerate((0, 90402, 90010, 90402)):  # a CPU node, an MI300, an MI250, an MI300
        (tmp_path / str(node)).mkdir()
        (tmp_path / str(node) / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {version}\n")
    monkeypatch.setenv("ABICACHE_KFD_TOPOLOGY", str(tmp_path))
    got = cuda_probe.probe()["gpu.arch"]
    assert got is not None and got.endswith("gfx90a,gfx942")  # after any NVIDIA GPU of this machine


@settings(max_examples=300, deadline=None)
@given(flags=st.integers(0, 2**32 - 1), abiversion=st.integers(0, 255))
def test_any_header_is_read_or_refused_with_a_reason(hsaco_bytes: bytes, tmp_path_factory, flags: int,
                                                     abiversion: int) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "x.hsaco"
    data = bytearray(hsaco_bytes)
    data[EI_ABIVERSION] = abiversion
    struct.pack_into("<I", data, E_FLAGS, flags)
    path.write_bytes(bytes(data))
    try:
        audited = audit_file(path)
    except AuditError as exc:
        assert "AMDGPU code object" in str(exc)
        return
    assert [str(f.requirement).split(" ~= ")[0] for f in audited.findings] == ["gpu.arch"]


@pytest.fixture(scope="module")
def hsaco_bytes(hsaco: dict[str, Path]) -> bytes:
    return hsaco["gfx942"].read_bytes()


def test_a_host_library_linking_the_hip_runtime_requires_its_major(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-ins built here with HIP's sonames: no ROCm needed."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    rocm = tmp_path / "rocm" / "lib"
    rocm.mkdir(parents=True)
    hip = rocm / "libamdhip64.so.6"
    subprocess.run(["cc", "-shared", "-fPIC", "-x", "c", "-", "-o", str(hip), "-Wl,-soname,libamdhip64.so.6"],
                   input="int hipGetDeviceCount(int* n) { *n = 0; return 0; }\n", text=True, check=True)
    host = tmp_path / "libuses_hip.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-x", "c", "-", "-o", str(host), f"-L{rocm}", "-l:libamdhip64.so.6"],
                   input="int hipGetDeviceCount(int*); int count(void) { int n; hipGetDeviceCount(&n); return n; }\n",
                   text=True, check=True)
    audited = audit_file(host)
    assert "hip.runtime == 6" in [str(f.requirement) for f in audited.findings]
    assert "DT_NEEDED libamdhip64.so.6" in [f.evidence for f in audited.findings]
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    assert Facts().get("hip.runtime") == "6"
    assert Requirement.parse("hip.runtime == 6").check(Facts()) is None
    hip.rename(rocm / "libamdhip64.so.7")  # another major installed: refused with the reason
    assert "this environment has hip.runtime = 7" in Requirement.parse("hip.runtime == 6").check(Facts())
