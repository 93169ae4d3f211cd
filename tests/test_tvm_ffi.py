"""abicache.tvm_ffi: tvm_ffi.cpp.load_inline / load through the cache, keyed on
tvm-ffi's version (its own cache omits it) and never on a venv path.
(apache/tvm-ffi's own test_load_inline.py and test_build.py, run with install():
see the note.)"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from abicache import Cache, Facts
from conftest import SRC

np = pytest.importorskip("numpy")
tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed (bench/run installs it)")

ADD_ONE = r"""
void add_one(tvm::ffi::TensorView x, tvm::ffi::TensorView y) {
  TVM_FFI_ICHECK(x.ndim() == 1) << "x must be a 1D tensor";
  for (int i = 0; i < x.size(0); ++i)
    static_cast<float*>(y.data_ptr())[i] = static_cast<float*>(x.data_ptr())[i] + 1;
}
"""


@pytest.mark.parametrize("name", ["load_inline", "load"])
def test_tvm_ffi_signatures(name: str) -> None:
    import tvm_ffi.cpp

    import abicache.tvm_ffi as at

    theirs = list(inspect.signature(getattr(tvm_ffi.cpp, name)).parameters)
    ours = list(inspect.signature(getattr(at, name)).parameters)
    assert ours[:len(theirs)] == theirs and ours[len(theirs):] == ["cache"]


def test_load_inline_exports_the_functions_and_hits(tmp_path: Path) -> None:
    import abicache.tvm_ffi as at

    cache = Cache(tmp_path / "store")
    mod = at.load_inline("abicache_add_one", cpp_sources=ADD_ONE, functions={"add_one": "x + 1"}, cache=cache)
    x = np.arange(5, dtype=np.float32)
    y = np.empty_like(x)
    mod.add_one(tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(y))
    assert y.tolist() == [1, 2, 3, 4, 5]
    art = at.build_inline("abicache_add_one", cpp_sources=ADD_ONE, functions={"add_one": "x + 1"}, cache=cache)
    version = Facts().get("tvm_ffi.version")
    assert art.hit and f"tvm_ffi.version == {version}" in str(art.requirements)


PLUS = r"""
#include <tvm/ffi/function.h>
int plus(int a) { return a + %d; }
TVM_FFI_DLL_EXPORT_TYPED_FUNC(plus, plus);
"""


def test_load_compiles_files_where_they_live_and_an_edit_is_seen_in_the_same_process(tmp_path: Path) -> None:
    """tvm_ffi.cpp.load's files, given as text or paths: a repeated call is the in-process
    memo's (the same module, no store resolved, no pathlib object made), and an edit of the
    file is a new build in the same process."""
    import abicache.tvm_ffi as at

    source = tmp_path / "plus.cc"
    source.write_text(PLUS % 1)
    cache = Cache(tmp_path / "store")
    first = at.load("abicache_plus", cpp_files=[str(source)], cache=cache)
    assert first.plus(2) == 3
    assert at.load("abicache_plus", cpp_files=[str(source)], cache=cache) is first
    assert at.load("abicache_plus", cpp_files=str(source), cache=cache) is first  # one path, as tvm-ffi takes it
    source.write_text(PLUS % 10)
    assert at.load("abicache_plus", cpp_files=[source], cache=cache).plus(2) == 12


def test_key_holds_tvm_ffis_version_and_no_venv_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tvm-ffi's own cache folder is keyed on the sources and flags only: an upgrade reused the old build."""
    import abicache.tvm_ffi as at

    cache = Cache(tmp_path)
    sources = at.inline_sources(ADD_ONE, None, ["add_one"])

    def key() -> str:
        plan = at.plan("k", sources, facts=cache.facts)
        return cache.key_for(plan.kind, plan.name, plan.inputs)[0], plan

    first, plan = key()
    assert not any(tvm_ffi.__file__.rsplit("/", 2)[0] in str(f) for f in plan.inputs.flags)
    monkeypatch.setattr(at.TvmFfiInstall, "__init__", _other_version)
    assert key()[0] != first


def _other_version(self) -> None:  # a tvm-ffi upgrade
    from tvm_ffi import libinfo

    self.version = "99.0.0"
    self.includes = (libinfo.find_include_path(), libinfo.find_dlpack_include_path())
    self.library = Path(libinfo.find_libtvm_ffi())


def test_install_routes_tvm_ffi_and_a_fresh_process_hits(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import json, sys
        import abicache.tvm_ffi as at
        at.install()
        import tvm_ffi.cpp
        mod = tvm_ffi.cpp.load_inline("abicache_installed", cpp_sources={ADD_ONE!r}, functions=["add_one"])
        art = at.build_inline("abicache_installed", cpp_sources={ADD_ONE!r}, functions=["add_one"])
        at.uninstall()
        print(json.dumps([art.hit, str(art.path).startswith(sys.argv[1]), tvm_ffi.cpp.load_inline is not at.load_inline]))
    """)
    env = {**os.environ, "ABICACHE_DIR": str(tmp_path / "store"), "PYTHONPATH": str(SRC)}
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "store")], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "[true, true, true]"


def test_torch_c_dlpack_addon_is_keyed_on_the_torch_build_and_python_abi(tmp_path: Path) -> None:
    """The case the project started from: tvm-ffi keys this addon on torch{major}{minor} and
    the C++ ABI, so another torch build under that version, or another Python, loaded
    the old library (it links libtorch_python)."""
    pytest.importorskip("torch")
    import ctypes

    import abicache.torch as abitorch
    import abicache.tvm_ffi as at
    from tvm_ffi.utils._build_optional_torch_c_dlpack import cpp_source

    cache = Cache(tmp_path / "store")
    art = at.build_torch_c_dlpack_addon(cache)
    here = cache.facts
    assert f"torch.build == {here.get('torch.build')}" in str(art.requirements)
    assert f"python.abi == {here.get('python.abi')}" in str(art.requirements)
    assert at.build_torch_c_dlpack_addon(cache).hit  # the same torch and Python: a hit
    lib = ctypes.CDLL(str(art.file()))
    assert lib.TorchDLPackExchangeAPIPtr() != 0

    def key(**overrides: str) -> str:
        facts = here.with_overrides(overrides) if overrides else here
        plan = abitorch.plan("torch_c_dlpack_addon", {"addon.cpp": cpp_source}, python_module=False, facts=facts)
        return Cache(tmp_path / "store", facts=facts).key_for(plan.kind, plan.name, plan.inputs)[0]

    version = here.get("torch.version")
    same_version_other_build = here.get("torch.build").replace("git=", "git=0") or "x"
    assert key() != key(**{"torch.build": same_version_other_build, "torch.version": version})
    assert key() != key(**{"python.abi": "cp312"})


BLOB_READER = r"""
extern "C" const char __tvm_ffi__cubin_kernels[];
extern "C" const char __tvm_ffi__cubin_kernels_end[];
int64_t blob_size() { return __tvm_ffi__cubin_kernels_end - __tvm_ffi__cubin_kernels; }
int64_t blob_byte(int64_t i) { return static_cast<unsigned char>(__tvm_ffi__cubin_kernels[i]); }
"""


def test_embed_cubin_links_the_bytes_in_and_keys_on_them(tmp_path: Path) -> None:
    """The symbols TVM_FFI_EMBED_CUBIN(kernels) declares hold exactly the bytes given;
    other bytes are another entry, the same bytes a hit."""
    import abicache.tvm_ffi as at
    from abicache.errors import UsageError

    cache = Cache(tmp_path / "store")
    blob = bytes(range(256)) * 3 + b"tail"
    mod = at.load_inline("abicache_embed", cpp_sources=BLOB_READER, functions=["blob_size", "blob_byte"],
                         embed_cubin={"kernels": blob}, cache=cache)
    assert mod.blob_size() == len(blob) and [mod.blob_byte(i) for i in (0, 255, 256, len(blob) - 1)] == [0, 255, 0, 108]
    again = at.build_inline("abicache_embed", cpp_sources=BLOB_READER, functions=["blob_size", "blob_byte"],
                            embed_cubin={"kernels": blob}, cache=cache)
    other = at.build_inline("abicache_embed", cpp_sources=BLOB_READER, functions=["blob_size", "blob_byte"],
                            embed_cubin={"kernels": blob + b"!"}, cache=cache)
    assert again.hit and not other.hit and other.key != again.key
    # the in-process memo holds the cubins' bytes: the same bytes (a bytearray too) the same module,
    # other bytes in the same process the other build's
    same = at.load_inline("abicache_embed", cpp_sources=BLOB_READER, functions=["blob_size", "blob_byte"],
                          embed_cubin={"kernels": bytearray(blob)}, cache=cache)
    longer = at.load_inline("abicache_embed", cpp_sources=BLOB_READER, functions=["blob_size", "blob_byte"],
                            embed_cubin={"kernels": blob + b"!"}, cache=cache)
    assert same is mod and longer is not mod and longer.blob_size() == len(blob) + 1
    assert (again.path / "kernels.cubin").read_bytes() == blob  # kept beside the module, as tvm-ffi keeps it
    with pytest.raises(UsageError, match="C symbol"):
        at.build_inline("abicache_embed", cpp_sources=BLOB_READER, embed_cubin={"my-kernels": blob}, cache=cache)


def test_an_embedded_cubin_requires_its_gpu(tmp_path: Path) -> None:
    """A real cubin (nvcc, sm_90) embedded in a module: the audit reads its target,
    so the module requires a GPU that runs it, as a torch extension with kernels does."""
    import abicache.tvm_ffi as at
    from corpus import nvcc

    cubin = nvcc(tmp_path / "k.cubin", "-cubin", "-arch=sm_90").read_bytes()
    h100 = Cache(tmp_path / "store", facts=Facts().with_overrides({"gpu.arch": "sm_90"}))
    art = at.build_inline("abicache_embed_gpu", cpp_sources=BLOB_READER, functions=["blob_size"],
                          embed_cubin={"kernels": cubin}, cache=h100)
    assert "gpu.arch ~= sm_90" in art.requirements.to_list()
    assert art.manifest.audit["kernels.cubin"]["kind"] == "cubin"
