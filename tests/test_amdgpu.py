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
from abicache.values.archs import parse_device, parse_target
from abicache.audit import AuditError, audit_file
from conftest import SRC
from test_triton import compile_with, entries, has_triton, py312  # noqa: F401  (a fixture)

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


def test_one_amd_entry_serves_python_311_and_312(py312: str, tmp_path: Path) -> None:
    """Triton's code object does not depend on the Python that asked for it: one entry."""
    if not has_triton(sys.executable):
        pytest.skip("triton is not installed for this interpreter (pip install triton)")
    root = tmp_path / "store"
    first = compile_with(sys.executable, root, ARCH="gfx942")
    second = compile_with(py312, root, ARCH="gfx942")
    assert first["cubin_sha"] == second["cubin_sha"] and len(entries(root)) == 1


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


# ---- offload bundles: hipcc's device code inside host libraries ---------------------------------

HIP_SOURCE = """
#include <stddef.h>
struct dim3 { unsigned x, y, z; };  /* what clang's launch stub needs, without ROCm's headers */
extern "C" int hipLaunchKernel(const void* f, dim3 grid, dim3 block, void** args, size_t shared, void* stream);
extern "C" __attribute__((global)) void scale(float* x, float a) { x[0] *= a; }
extern "C" int host_side(int v) { return v + 1; }
"""
HIP_TARGETS = ("gfx90a", "gfx908:xnack-", "gfx1030")


def _llvm_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in sorted(Path("/usr/lib").glob("llvm-*/bin"), reverse=True):
        if (folder / name).is_file():
            return str(folder / name)
    return None


@pytest.fixture(scope="module")
def hip_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host library with a .hip_fatbin, compiled by clang's HIP toolchain (no ROCm: Debian's
    clang, lld and clang-offload-bundler), linked by gcc as a user's extension would be."""
    clang = _llvm_tool("clang++")
    if clang is None or _llvm_tool("clang-offload-bundler") is None or _llvm_tool("ld.lld") is None:
        pytest.skip("clang, lld and clang-offload-bundler are not installed (apt-get install clang lld clang-tools)")
    work = tmp_path_factory.mktemp("hip")
    (work / "k.hip").write_text(HIP_SOURCE)
    tools = str(Path(clang).parent)
    done = subprocess.run([clang, "-x", "hip", *(f"--offload-arch={t}" for t in HIP_TARGETS), "-nogpulib", "-nogpuinc",
                           "-fPIC", "-c", "k.hip", "-o", "k.o"], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "TMPDIR": str(work)},
                          timeout=300)  # TMPDIR: clang leaves an empty k-XXXXXX folder there for each target
    if done.returncode != 0:
        pytest.skip(f"this clang cannot compile HIP for {HIP_TARGETS}: {done.stderr[-500:]}")
    subprocess.run(["cc", "-shared", "k.o", "-o", "libk.so"], cwd=work, check=True)
    return work / "libk.so"


def _fatbin(library: Path, out: Path) -> bytes:
    subprocess.run(["objcopy", "--dump-section", f".hip_fatbin={out}", str(library)], check=True)
    return out.read_bytes()


def test_a_host_library_with_an_offload_bundle_requires_its_gfx_targets(hip_library: Path, tmp_path: Path) -> None:
    audited = audit_file(hip_library)
    gpu = [f for f in audited.findings if f.requirement.name == "gpu.arch"]
    assert [str(f.requirement) for f in gpu] == ["gpu.arch ~= gfx1030,gfx908:xnack-,gfx90a"]
    assert "embedded .hip_fatbin" in gpu[0].evidence and "xnack off" in gpu[0].evidence
    assert not any(str(f.requirement) == "platform.machine == em_amdgpu" for f in audited.findings)
    # The same bundle as a file of its own (what clang-offload-bundler writes)
    alone = audit_file(_write(tmp_path / "k.hipfb", _fatbin(hip_library, tmp_path / "fat.bin")))
    assert alone.kind == "offload bundle" and [str(f.requirement) for f in alone.findings] == [str(gpu[0].requirement)]


def test_the_bundle_reader_agrees_with_llvms_tools(hip_library: Path, tmp_path: Path) -> None:
    """clang-offload-bundler lists the same triples and unbundles the same bytes;
    llvm-readobj reads each code object's processor as we do."""
    from abicache.audit import offload

    bundler, readobj = _llvm_tool("clang-offload-bundler"), _llvm_tool("llvm-readobj")
    if readobj is None:
        pytest.skip("llvm-readobj is not installed (apt-get install llvm)")
    data = _fatbin(hip_library, tmp_path / "fat.bin")
    ours = offload.entries(data, "fat.bin")
    listed = subprocess.run([bundler, "-list", "-type=bc", f"-inputs={tmp_path / 'fat.bin'}"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert sorted(e.triple for e in ours) == sorted(listed)
    for entry in ours:
        if entry.triple.startswith("host-"):
            continue
        out = tmp_path / (entry.triple.split("--")[-1].replace(":", "_") + ".co")
        subprocess.run([bundler, "-unbundle", "-type=bc", f"-inputs={tmp_path / 'fat.bin'}",
                        f"-targets={entry.triple}", f"-outputs={out}"], check=True)
        assert out.read_bytes() == entry.code
        theirs = re.search(r"EF_AMDGPU_MACH_AMDGCN_(GFX\w+)",
                           subprocess.run([readobj, "--file-headers", str(out)], capture_output=True, text=True).stdout)
        assert theirs and entry.triple.split("--")[-1].split(":")[0] == theirs.group(1).lower()


def _ccob(bundle: bytes, version: int, method: int, declared: int | None = None) -> bytes:
    import zlib

    if method == 0:
        payload = zlib.compress(bundle)
    else:
        zstandard = pytest.importorskip("zstandard")
        payload = zstandard.ZstdCompressor().compress(bundle)
    size = len(bundle) if declared is None else declared
    if version == 2:
        return b"CCOB" + struct.pack("<HHIIQ", 2, method, 24 + len(payload), size, 0) + payload
    return b"CCOB" + struct.pack("<HHQQQ", 3, method, 32 + len(payload), size, 0) + payload


@pytest.mark.parametrize("version, method", [(2, 0), (2, 1), (3, 1), (3, 0)])
def test_compressed_bundles_are_read_within_their_declared_size(hip_library: Path, tmp_path: Path,
                                                                version: int, method: int) -> None:
    """ROCm 6.2+ compresses bundles (CCOB); assembled here from clang's, as that clang cannot."""
    bundle = _fatbin(hip_library, tmp_path / "fat.bin")
    plain = audit_file(_write(tmp_path / "plain.hipfb", bundle))
    packed = audit_file(_write(tmp_path / "packed.hipfb", _ccob(bundle, version, method) + b"\0" * 64))
    assert [str(f.requirement) for f in packed.findings] == [str(f.requirement) for f in plain.findings]
    bomb = _write(tmp_path / "bomb.hipfb", _ccob(bundle, version, method, declared=4096))
    with pytest.raises(AuditError, match="inflates to 4097 bytes, not the 4096"):
        audit_file(bomb)


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, 4096), flips=st.lists(st.tuples(st.integers(0, 511), st.integers(1, 255)), max_size=4))
def test_any_damaged_bundle_is_read_or_refused_with_a_reason(hip_bundle: bytes, tmp_path_factory, cut: int,
                                                             flips: list[tuple[int, int]]) -> None:
    data = bytearray(hip_bundle[:len(hip_bundle) - cut])
    for where, bits in flips:
        if where < len(data):
            data[where] ^= bits
    path = _write(tmp_path_factory.mktemp("fuzz") / "x.hipfb", bytes(data))
    try:
        audited = audit_file(path)
    except AuditError:
        return
    assert {f.requirement.name for f in audited.findings} <= {"gpu.arch"}


@pytest.fixture(scope="module")
def hip_bundle(hip_library: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _fatbin(hip_library, tmp_path_factory.mktemp("bundle") / "fat.bin")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
