"""abicache.torch with the real torch 2.13 CPU wheel."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from abicache import Cache
from abicache.env import Facts
from abicache.errors import AbicacheError, BuildError
from conftest import ROOT, SRC
from corpus import TORCH_STABLE, torch_root

pytestmark = pytest.mark.usefixtures("_torch")

PYBIND = """
int64_t add(int64_t a, int64_t b) { return a + b; }
torch::Tensor scaled(torch::Tensor x, double s) { return x * s; }
"""

CLASSIC_OPS = """
#include <torch/library.h>
at::Tensor plus_one(const at::Tensor& a) { return a + 1; }
TORCH_LIBRARY(abicache_classic_ops, m) { m.def("plus_one(Tensor a) -> Tensor", &plus_one); }
"""

STABLE_WITH_ATEN = "#include <ATen/ATen.h>\n" + TORCH_STABLE

# Declares c10's check-failure function by hand (its header refuses stable builds) and calls it.
STABLE_WITH_C10_CALL = TORCH_STABLE.replace(
    "using torch::stable::Tensor;",
    "#include <string>\n#include <cstdint>\n"
    "namespace c10 { namespace detail { [[noreturn]] void torchCheckFail("
    "const char*, const char*, uint32_t, const std::string&); } }\n"
    "using torch::stable::Tensor;",
).replace("Tensor out = torch::stable::empty_like(t);",
          'if (v < 0) c10::detail::torchCheckFail("f", "file", 1, std::string("v < 0"));\n'
          "  Tensor out = torch::stable::empty_like(t);")


@pytest.fixture(scope="module")
def _torch() -> None:
    torch_root()


@pytest.fixture(scope="module")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("torch-store")


def test_pybind_module_computes(shared_root: Path) -> None:
    import torch

    import abicache.torch as at

    mod = at.load_inline("abicache_pyext", [PYBIND], functions=["add", "scaled"], cache=Cache(shared_root))
    assert mod.add(40, 2) == 42
    assert torch.equal(mod.scaled(torch.ones(3), 2.5), torch.full((3,), 2.5))
    art = at.build_inline("abicache_pyext", [PYBIND], functions=["add", "scaled"], cache=Cache(shared_root))
    facts = Facts()
    assert art.hit and art.kind == "torch.pybind"
    assert f"torch.build == {facts.get('torch.build')}" in art.requirements.to_list()
    assert f"python.abi == {facts.get('python.abi')}" in art.requirements.to_list()


def test_classic_op_computes(shared_root: Path) -> None:
    import torch

    import abicache.torch as at

    path = at.load_inline("abicache_classic_ops", [CLASSIC_OPS], is_python_module=False, cache=Cache(shared_root))
    assert Path(path).name == "libabicache_classic_ops.so"
    assert torch.equal(torch.ops.abicache_classic_ops.plus_one(torch.zeros(2)), torch.ones(2))
    art = at.build_inline("abicache_classic_ops", [CLASSIC_OPS], is_python_module=False, cache=Cache(shared_root))
    assert art.kind == "torch.classic" and art.requirements.satisfied_by(Facts())


def test_stable_op_computes_and_targets_the_oldest_possible_torch(shared_root: Path) -> None:
    import torch

    import abicache.torch as at

    at.load_inline("abicache_stable_ops", [TORCH_STABLE], stable=True, cache=Cache(shared_root))
    out = torch.ops.abicache_stable.my_fill(torch.zeros(4), 7.0)
    assert torch.equal(out, torch.full((4,), 7.0))
    art = at.build_inline("abicache_stable_ops", [TORCH_STABLE], stable=True, cache=Cache(shared_root))
    assert art.manifest.declared.to_list() == ["torch.version >= 2.9"]  # empty_like/fill_ exist since 2.9
    assert "torch.version >= 2.9" in art.requirements.to_list()
    explicit = at.build_inline("abicache_stable_ops", [TORCH_STABLE], stable=True, target="2.10",
                               cache=Cache(shared_root))
    assert "torch.version >= 2.10" in explicit.requirements.to_list() and explicit.key != art.key


def test_stable_key_ignores_the_installed_torch_and_classic_key_does_not(tmp_path: Path) -> None:
    import abicache.torch as at

    here = Facts()
    version = here.get("torch.version")
    other = Facts().with_overrides({"torch.version": next_patch(version),
                                    "torch.build": here.get("torch.build").replace(version, next_patch(version))})

    def key(facts: Facts, **kw) -> str:
        sources = at.inline_sources("x", [TORCH_STABLE if kw.get("stable") else PYBIND], None,
                                    kw.get("stable", False), not kw.get("stable", False))
        plan = at.plan("x", sources, facts=facts, **kw)
        return Cache(tmp_path, facts=facts).key_for(plan.kind, plan.name, plan.inputs)[0]

    assert key(here, stable=True) == key(other, stable=True)
    assert key(here) != key(other)


def test_cuda_sources_need_a_cuda_torch_and_enter_key_and_requirements(tmp_path: Path) -> None:
    import abicache.torch as at

    sources = {"main.cpp": "#include <torch/extension.h>\n", "kernel.cu": "__global__ void k() {}\n"}
    with pytest.raises(AbicacheError, match=r"CUDA sources \(or with_cuda=True\) need a CUDA build of torch"):
        at.plan("cu", sources, facts=Facts().with_overrides({"torch.flavor": "cpu"}))
    rocm = Facts().with_overrides({"torch.flavor": "rocm", "torch.version": "2.9.1+rocm6.4", "torch.cuda": None})
    with pytest.raises(AbicacheError, match=r"2.9.1\+rocm6.4 is a ROCm build: .* hipcc"):
        at.plan("cu", sources, facts=rocm)  # never nvcc for a ROCm torch
    cuda_torch = Facts().with_overrides({"torch.flavor": "cuda", "torch.cuda": "13.0",
                                         "cuda.nvcc": "Cuda compilation tools, release 13.0"})
    plan = at.plan("cu", sources, facts=cuda_torch)
    assert "cuda.nvcc" in plan.inputs.tools and "torch.build" in plan.inputs.tools
    assert "torch.flavor in cuda" in plan.requires
    assert "-ltorch_cuda" in plan.inputs.flags
    assert not any(f.startswith(("-L", "-I/", "/")) for f in plan.inputs.flags)  # no path in the key
    described = plan.inputs.describe(cuda_torch)
    assert described["tools"]["cuda.nvcc"].startswith("Cuda compilation tools")
    newer_nvcc = cuda_torch.with_overrides({"cuda.nvcc": "Cuda compilation tools, release 13.1"})
    cache = Cache(tmp_path)
    assert cache.key_for(plan.kind, plan.name, plan.inputs)[0] != \
        Cache(tmp_path, facts=newer_nvcc).key_for(plan.kind, plan.name, plan.inputs)[0]


def test_stable_op_including_aten_is_refused(tmp_path: Path) -> None:
    import abicache.torch as at

    with pytest.raises(BuildError, match=r"includes <ATen/\.\.\.>, which is not part of the stable ABI"):
        at.build_inline("bad_stable", [STABLE_WITH_ATEN], stable=True, cache=Cache(tmp_path))


def test_stable_op_calling_an_unstable_api_is_refused_with_the_symbols(tmp_path: Path) -> None:
    import abicache.torch as at

    cache = Cache(tmp_path)
    with pytest.raises(BuildError) as info:
        at.build_inline("sneaky_stable", [STABLE_WITH_C10_CALL], stable=True, cache=cache)
    text = str(info.value)
    assert "declared for the stable ABI" in text and "c10::detail::torchCheckFail" in text
    assert not list(cache.store.iter_variant_dirs())


def test_compile_errors_show_command_and_output(tmp_path: Path) -> None:
    import abicache.torch as at

    with pytest.raises(BuildError) as info:
        at.build_inline("broken_stable", ["int x = ;"], stable=True, target="2.10", cache=Cache(tmp_path))
    assert "-DTORCH_TARGET_VERSION=0x020a000000000000" in str(info.value) and "error:" in str(info.value)


BUILD_STABLE = textwrap.dedent("""
    import sys
    import abicache.torch as at
    from abicache import Cache
    at.build_inline("killed_stable", [sys.argv[2]], stable=True, cache=Cache(sys.argv[1]))
""")


def test_sigkill_during_a_torch_build(tmp_path: Path) -> None:
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-c", BUILD_STABLE, str(root), TORCH_STABLE], env=env)
    time.sleep(0.8)  # inside the compiler (a stable build takes ~1.3 s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    cache = Cache(root, lock_timeout=30)
    for vdir in cache.store.iter_variant_dirs():  # anything visible is whole
        assert cache.store.full_problem(vdir, cache.store.read_manifest(vdir)) is None
    import abicache.torch as at

    start = time.monotonic()
    art = at.build_inline("killed_stable", [TORCH_STABLE], stable=True, cache=cache)
    assert time.monotonic() - start < 60 and art.file().is_file()


def installed_torch() -> str:
    """The installed torch's version (2.13.0+cpu here, 2.11.0+cu130 on the GPU machine)."""
    return Facts().get("torch.version")


def next_patch(version: str) -> str:
    """2.13.0+cpu -> 2.13.1+cpu: the same major.minor and flavour, another build."""
    return re.sub(r"^(\d+\.\d+\.)(\d+)", lambda m: f"{m.group(1)}{int(m.group(2)) + 1}", version)


def _torch_with_version(tmp_path: Path, version: str) -> Path:
    """A second torch identity: the real package seen through symlinks, with its own version.py."""
    real = torch_root()
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    for child in real.iterdir():
        if child.name != "version.py":
            (fake / child.name).symlink_to(child)
    text = (real / "version.py").read_text()
    (fake / "version.py").write_text(text.replace(installed_torch(), version))
    return fake.parent


ADDON = textwrap.dedent("""
    import json, sys
    import torch
    import abicache.torch as at
    from abicache import Cache
    classic, stable, root = sys.argv[1], sys.argv[2], sys.argv[3]
    c = at.build_inline("addon_classic", [classic], is_python_module=False, cache=Cache(root))
    s = at.build_inline("addon_stable", [stable], stable=True, cache=Cache(root))
    torch.ops.load_library(str(s.file()))
    out = torch.ops.abicache_stable.my_fill(torch.zeros(2), 3.0).tolist()
    print(json.dumps({"torch": torch.__version__, "classic_hit": c.hit, "stable_hit": s.hit, "out": out}))
""")


def test_two_torch_builds_with_one_major_minor_share_a_cache(tmp_path: Path) -> None:
    """The tvm-ffi addon case: same major.minor and device, different patch and local tag."""
    classic = CLASSIC_OPS.replace("abicache_classic_ops", "addon_ops")
    root = tmp_path / "shared-home-cache"
    args = [classic, TORCH_STABLE, str(root)]
    one = subprocess.run([sys.executable, "-c", ADDON, *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=600)
    assert one.returncode == 0, one.stderr
    here, there = installed_torch(), next_patch(installed_torch())
    assert json.loads(one.stdout) == {"torch": here, "classic_hit": False, "stable_hit": False,
                                      "out": [3.0, 3.0]}
    site = _torch_with_version(tmp_path, there)
    two = subprocess.run([sys.executable, "-c", ADDON, *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{SRC}"}, timeout=600)
    assert two.returncode == 0, two.stderr
    assert json.loads(two.stdout) == {"torch": there, "classic_hit": False, "stable_hit": True,
                                      "out": [3.0, 3.0]}
    why = subprocess.run([sys.executable, "-m", "abicache", "explain", "addon_classic", "--json", "--root", str(root)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{SRC}"})
    diffs = json.loads(why.stdout)[0]["candidates"][0]["differences"]
    assert [d["what"] for d in diffs if d["what"].startswith("tools.")] == ["tools.torch.build"]
    assert diffs[0]["entry"].startswith(f"{here}/") and diffs[0]["wanted"].startswith(f"{there}/")


HIT_NO_SPAWN = textwrap.dedent("""
    import json, os, subprocess, sys
    import torch
    def refuse(*a, **k):
        raise AssertionError("the hit path must not spawn a process")
    subprocess.Popen.__init__ = refuse
    os.posix_spawn = os.posix_spawnp = os.fork = refuse
    import abicache.torch as at
    from abicache import Cache
    art = at.build_inline("nospawn_stable", [sys.argv[2]], stable=True, cache=Cache(sys.argv[1]))
    print(json.dumps({"hit": art.hit}))
""")


def test_a_fresh_process_torch_hit_spawns_nothing(shared_root: Path) -> None:
    import abicache.torch as at

    at.build_inline("nospawn_stable", [TORCH_STABLE], stable=True, cache=Cache(shared_root))
    out = subprocess.run([sys.executable, "-c", HIT_NO_SPAWN, str(shared_root), TORCH_STABLE], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"hit": True}


def test_load_from_files(tmp_path: Path, shared_root: Path) -> None:
    import torch

    import abicache.torch as at

    src = tmp_path / "file_ops.cpp"
    src.write_text(TORCH_STABLE.replace("abicache_stable", "abicache_file_ops"))
    path = at.load("file_ops", [src], stable=True, cache=Cache(shared_root))
    assert torch.equal(torch.ops.abicache_file_ops.my_fill(torch.zeros(1), 2.0), torch.full((1,), 2.0))
    assert Path(path).name == "libfile_ops.so"
    with pytest.raises(AbicacheError, match="cannot read source file"):
        at.load("missing", [tmp_path / "nope.cpp"], stable=True, cache=Cache(shared_root))


def test_cuda_arch_flags_follow_torch_cuda_arch_list_then_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import abicache.torch as at
    from abicache.errors import UsageError

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a+PTX")
    assert at.cuda_arch_flags(Facts()) == ["-gencode=arch=compute_80,code=sm_80",
                                           "-gencode=arch=compute_90a,code=sm_90a",
                                           "-gencode=arch=compute_90a,code=compute_90a"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "Hopper Maxwell+Tegra")  # cpp_extension's names, space-separated
    assert at.cuda_arch_flags(Facts()) == ["-gencode=arch=compute_90,code=sm_90",
                                           "-gencode=arch=compute_90,code=compute_90",
                                           "-gencode=arch=compute_53,code=sm_53"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.x")
    with pytest.raises(UsageError, match="TORCH_CUDA_ARCH_LIST: '9.x'"):
        at.cuda_arch_flags(Facts())
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    two_gpus = Facts().with_overrides({"gpu.arch": "sm_80,sm_90"})
    assert at.cuda_arch_flags(two_gpus) == ["-gencode=arch=compute_80,code=sm_80",  # as cpp_extension: PTX of
                                            "-gencode=arch=compute_90,code=sm_90",  # the newest, for newer GPUs
                                            "-gencode=arch=compute_90,code=compute_90"]
    assert at.cuda_arch_flags(Facts().with_overrides({"gpu.arch": None})) == []  # nvcc's default


def test_cuda_flags_and_archs_enter_the_classic_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import abicache.torch as at

    cuda_torch = Facts().with_overrides({"torch.flavor": "cuda", "torch.cuda": "13.0",
                                         "cuda.nvcc": "Cuda compilation tools, release 13.0"})
    sources = at.inline_sources("cu", ["torch::Tensor f(torch::Tensor x);"], None, False, True,
                                cuda_sources="__global__ void k() {}")
    assert sources["cuda.cu"].startswith("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>")
    cache = Cache(tmp_path, facts=cuda_torch)

    def key(**kw) -> str:
        plan = at.plan("cu", sources, facts=cuda_torch, **kw)
        return cache.key_for(plan.kind, plan.name, plan.inputs)[0]

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    base = key()
    assert key(extra_cuda_cflags=["-DSCALE=2"]) != base  # an edit of nvcc's flags never hits the old build
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    assert key() != base


def gpu_sources():
    """The stable CUDA op bench/gpu calls on a GPU (one copy of its source)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_sources", ROOT / "bench" / "gpu_suite" / "gpu_sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stable_op_with_cuda_sources_builds_for_any_torch_flavor(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """FlashAttention-3, xformers and torchao ship such ops; the kernels need nvcc, not a CUDA torch
    (bench/gpu calls one on an H100)."""
    import abicache.torch as at
    from abicache.env import probes

    if probes.nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    sources = gpu_sources()
    STABLE_CUDA_CPP, STABLE_CUDA_CU = sources.STABLE_CPP, sources.STABLE_CU
    target = Cache(tmp_path).for_target({"gpu.arch": "sm_90", "cuda.driver": "13.0", "cuda.runtime": "13"})
    art = at.build_inline("abicache_stable_cuda", [STABLE_CUDA_CPP], cuda_sources=[STABLE_CUDA_CU], stable=True,
                          cache=target)
    reqs = str(art.requirements)
    assert "gpu.arch ~= sm_90" in reqs and "cuda.runtime == 13" in reqs and "torch.version >= 2.9" in reqs
    assert "torch.flavor" not in reqs and "torch.build" not in reqs and "python.abi" not in reqs
    assert at.build_inline("abicache_stable_cuda", [STABLE_CUDA_CPP], cuda_sources=[STABLE_CUDA_CU], stable=True,
                           cache=target).hit
    with pytest.raises(BuildError, match=r"cuda.cu includes <ATen/\.\.\.>"):
        at.build_inline("abicache_stable_cuda", [STABLE_CUDA_CPP], cuda_sources=["#include <ATen/ATen.h>\n"],
                        stable=True, cache=target)
    # a GPU of another arch never gets it (as the driver would refuse its kernels): rebuilt, and refused
    with pytest.raises(BuildError, match="gpu.arch"):
        at.build_inline("abicache_stable_cuda", [STABLE_CUDA_CPP], cuda_sources=[STABLE_CUDA_CU], stable=True,
                        cache=Cache(tmp_path, facts=Facts().with_overrides({"gpu.arch": "sm_80"})))
    # a machine with no GPU (a build farm) finds the same entry, not rebuilt: it loads for its CPU paths
    no_gpu = Cache(tmp_path, facts=Facts().with_overrides({"gpu.arch": "none", "cuda.runtime": "13"}))
    assert at.build_inline("abicache_stable_cuda", [STABLE_CUDA_CPP], cuda_sources=[STABLE_CUDA_CU], stable=True,
                           cache=no_gpu).hit


def test_a_load_given_paths_as_text_pictures_the_files_as_given_as_paths(tmp_path: Path) -> None:
    """torch's load takes paths as text or as path objects: its in-process memo stats either
    alike (no pathlib object made a repeated call: they were half of its 150 us), and an edit of
    a source gives another picture, so the next call looks again."""
    from abicache.cc import _fingerprint

    source = tmp_path / "ext.cpp"
    source.write_text("int f() { return 1; }\n")
    as_text = _fingerprint([str(source)], files=True)
    assert as_text == _fingerprint([source]) == _fingerprint([source], files=True)
    assert _fingerprint([str(source)]) == (str(source),)  # without files=: text is code, as load_inline's
    source.write_text("int f() { return 22; }\n")
    assert _fingerprint([str(source)], files=True) != as_text
    assert _fingerprint([str(tmp_path / "gone.cpp")], files=True) == ((str(tmp_path / "gone.cpp"), None),)
