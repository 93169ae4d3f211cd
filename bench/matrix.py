"""The compatibility matrix: environments that share one cache, artifacts
built in them, and what each caching scheme does with them.

For every (environment, artifact) in order, each scheme either reuses what its
key finds or builds. A reuse is UNSAFE when ground truth says the cached
artifact cannot load (or is not the build that was asked for) here; a build is
NEEDLESS when an artifact that ground truth says is compatible was already
built. MINIMUM is the fewest builds any cache could do (one more only when
nothing built so far is compatible).

Ground truth comes from real evidence where this machine can give it:
- real loads: a cpXY probe module built with each pyenv interpreter's headers
  and an abi3 module, loaded by every interpreter (a cp3.11 module loads in
  3.12 and silently returns garbage: measured);
- the real audit of artifacts built here (C library, cpXY and abi3 modules, a
  classic and a stable torch op, cubins for sm_80/sm_90/sm_90a, PTX), which
  must find exactly the requirement the rule below relies on;
and from the documented rules otherwise (CPython per-minor ABI, torch's
unstable C++ ABI per build, NVIDIA's cubin/PTX compatibility). The report
says which is which.

abicache's column is computed by abicache itself: the key from the real
frontends' plans under each environment's facts, and requirements checked by
the real Requirements against those facts.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RESULTS = ROOT / "bench" / "results"

from abicache import cc
from abicache.core import key as keys  # noqa: E402
from abicache import torch as abitorch  # noqa: E402
from abicache.env import Facts  # noqa: E402
from abicache.core.key import Inputs  # noqa: E402
from abicache.values.requirements import Requirements  # noqa: E402

ARTIFACTS = ["C library", "CPython module", "abi3 module", "classic torch op", "stable torch op", "cubin", "PTX",
             "C project, header edited", "AMD code object", "C++ project, shadowing header", "C++ project, $CXX words",
             "CUDA torch extension"]
HEADERED = "C project, header edited"
SHADOWED = "C++ project, shadowing header"  # a header created in an earlier include folder (E5-E7)
WORDS = "C++ project, $CXX words"  # CXX="c++ -D_GLIBCXX_USE_CXX11_ABI=0" where the environment says so
HSACO = "AMD code object"  # Triton's .hsaco for the environment's AMD target
CUDA_EXT = "CUDA torch extension"  # C++ and .cu sources for TORCH_CUDA_ARCH_LIST: a host library with GPU code
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]


@dataclass(frozen=True)
class Env:
    label: str
    python: str
    torch: str  # torch.__version__, with its local tag
    cxx11abi: str
    cuda: int  # toolkit, runtime and driver major
    device: str  # the GPU: sm_80 or sm_90, or none (a build machine without one)
    target: str  # what its JIT compiles for (TORCH_CUDA_ARCH_LIST): sm_80, sm_90, sm_90a, or an AMD target
    header: int = 1  # which content the project's header has here (edited over time)
    hip: int = 0  # the ROCm/HIP major of an AMD machine (0: an NVIDIA one)
    shadow: bool = False  # a header that shadows the project's is in an earlier include folder
    cxx: str = "c++"  # $CXX, words and all

    @property
    def amd(self) -> bool:
        return self.hip > 0

    @property
    def torch_version(self) -> str:
        return self.torch.split("+")[0]

    @property
    def flavor(self) -> str:
        return "cpu" if self.torch.endswith("+cpu") else "rocm" if "+rocm" in self.torch else "cuda"

    @property
    def cu_tag(self) -> str:  # cpp_extension's folder: py311_cu128 / py311_cpu
        local = self.torch.partition("+")[2]
        return local if local else "cpu"

    @property
    def torch_build(self) -> str:
        cuda = "none" if self.flavor != "cuda" else f"{self.cuda}.{'8' if self.cuda == 12 else '0'}"
        hip = self.torch.partition("+rocm")[2] or "none" if self.flavor == "rocm" else "none"
        return f"{self.torch}/git=g{hashlib.sha1(self.torch.encode()).hexdigest()[:8]}/cuda={cuda}/hip={hip}/" \
               f"cxx11abi={self.cxx11abi}"


ENVS = [
    Env("E1 base", "3.11", "2.9.1+cu128", "1", 12, "sm_90", "sm_90"),
    Env("E2 Python 3.12", "3.12", "2.9.1+cu128", "1", 12, "sm_90", "sm_90"),
    Env("E3 torch +cu130, CUDA 13", "3.11", "2.9.1+cu130", "1", 13, "sm_90", "sm_90"),
    Env("E4 torch patch 2.9.0", "3.11", "2.9.0+cu128", "1", 12, "sm_90", "sm_90", 2),
    Env("E5 torch +cpu", "3.11", "2.9.1+cpu", "1", 12, "sm_90", "sm_90", 2, shadow=True),
    Env("E6 old C++ ABI build", "3.11", "2.9.1+cu128", "0", 12, "sm_90", "sm_90", 2, shadow=True,
        cxx="c++ -D_GLIBCXX_USE_CXX11_ABI=0"),
    Env("E7 Python 3.10, torch 2.10", "3.10", "2.10.0+cu130", "1", 13, "sm_90", "sm_90", 3, shadow=True),
    Env("E8 Python 3.13, torch 2.11", "3.13", "2.11.0+cu130", "1", 13, "sm_90", "sm_90", 3),
    Env("E9 A100 (sm_80)", "3.11", "2.9.1+cu128", "1", 12, "sm_80", "sm_80", 3),
    Env("E10 H100, sm_90a kernels", "3.11", "2.9.1+cu128", "1", 12, "sm_90", "sm_90a", 2),
    Env("E11 A100, CUDA 13, 3.13", "3.13", "2.10.0+cu130", "1", 13, "sm_80", "sm_80", 2),
    Env("E12 base again", "3.11", "2.9.1+cu128", "1", 12, "sm_90", "sm_90"),
    # AMD machines in the same fleet, sharing the cache: MI300X, MI250X, an MI300X on ROCm 7
    Env("E13 MI300X (gfx942), torch +rocm6.4", "3.11", "2.9.1+rocm6.4", "1", 0, "gfx942", "gfx942", hip=6),
    Env("E14 MI250X (gfx90a), torch +rocm6.4", "3.11", "2.9.1+rocm6.4", "1", 0, "gfx90a:sramecc+:xnack-", "gfx90a",
        hip=6),
    Env("E15 MI300X, ROCm 7, torch 2.10 +rocm7.0", "3.12", "2.10.0+rocm7.0", "1", 0, "gfx942", "gfx942", 3, hip=7),
    # a build farm without a GPU (E1's torch, TORCH_CUDA_ARCH_LIST=9.0), then an A100 given the H100's arch list
    Env("E16 build farm, no GPU", "3.11", "2.9.1+cu128", "1", 12, "none", "sm_90"),
    Env("E17 A100, arch list 9.0", "3.11", "2.9.1+cu128", "1", 12, "sm_80", "sm_90"),
]


# ---- ground truth ---------------------------------------------------------------------


def applies(art: str, env: Env) -> bool:
    """Whether art is built in env at all: CUDA code on NVIDIA machines, AMD code on AMD ones."""
    if art in ("cubin", "PTX"):
        # A machine without a GPU compiles kernels for a named target and judges them for it
        # (abicache.cuda, tests/test_arch_fit.py): not for this machine's facts
        return not env.amd and env.device != "none"
    if art == HSACO:
        return env.amd
    if art == CUDA_EXT:
        return env.flavor == "cuda"
    return True


def request(art: str, env: Env) -> str:
    """What a build of art in env is asked to produce (a different request is a different build)."""
    if art == HSACO:
        return env.target
    if art in ("cubin", CUDA_EXT):
        return env.target
    if art == "PTX":
        return env.target.replace("sm_", "compute_")
    return ""


def _runs(target: str, device: str) -> bool:
    from abicache.values.archs import parse_target

    return parse_target(target).runs_on(parse_target(device))


def _gpu_code_fits(target: str, device: str) -> bool:
    """A host library's GPU code: every GPU present must run it; with none, its CPU paths run
    (torch's own load returns the module there, and its CPU functions work: measured)."""
    return device == "none" or _runs(target, device)


RULES: dict[str, Callable[[Env, Env], bool]] = {
    "C library": lambda b, e: True,
    "CPython module": lambda b, e: b.python == e.python,
    "abi3 module": lambda b, e: tuple(map(int, e.python.split("."))) >= (3, 10),
    "classic torch op": lambda b, e: b.torch_build == e.torch_build and b.python == e.python,
    "stable torch op": lambda b, e: tuple(map(int, e.torch_version.split(".")[:2])) >= (2, 9),
    "cubin": lambda b, e: _runs(request("cubin", b), e.device) and e.cuda >= b.cuda,
    "PTX": lambda b, e: _runs(request("PTX", b), e.device) and e.cuda >= b.cuda,
    HEADERED: lambda b, e: b.header == e.header,
    HSACO: lambda b, e: e.amd and _runs(b.target, e.device),
    SHADOWED: lambda b, e: b.shadow == e.shadow,
    WORDS: lambda b, e: b.cxx == e.cxx,
    CUDA_EXT: lambda b, e: (b.torch_build == e.torch_build and b.python == e.python
                            and _gpu_code_fits(request(CUDA_EXT, b), e.device)),
}
WHY_RULE = {
    "C library": "plain C: no Python, torch or CUDA dependency (audit: only glibc symbol versions)",
    "CPython module": "CPython's ABI changes each minor (measured: a cp3.11 module returns garbage in 3.12)",
    "abi3 module": "the limited API is stable from its floor (measured: loads and agrees in 3.10-3.13)",
    "classic torch op": "unstable C++ ABI: the exact torch build and Python (audit: c10::/at:: imports)",
    "stable torch op": "stable C ABI: any torch >= its target 2.9 (audit: only aoti_torch_* shims)",
    "cubin": "sm_XY runs on X.y>=Y, sm_90a only on 9.0; driver >= the toolkit (audit: e_flags, tkinfo)",
    "PTX": "JITs forward from its compute arch; driver >= the toolkit's ISA (audit: .target, .version)",
    HEADERED: "plain C, but its header was edited (E4, E7, E10) and restored (E12): only a build from the "
              "same header bytes is the same program",
    HSACO: "LLVM's target IDs: gfx942 code runs on any gfx942, gfx90a code on any gfx90a; Triton's own LLVM "
           "builds it, so it does not depend on the ROCm major or Python (audit: e_flags)",
    SHADOWED: "a header created in an include folder searched before the one used (E5) and removed (E8): "
              "the compiler picks it up, so only a build with the same folders' contents is the same program "
              "(a depfile lists what was found, not what was looked for)",
    WORDS: "CXX='c++ -D_GLIBCXX_USE_CXX11_ABI=0' (E6): another std::string ABI, so only a build with the same "
           "compiler command is the same program",
    CUDA_EXT: "the classic op's rule, and its GPU code must run on every GPU present (an A100 given sm_90 code, "
              "E17, cannot launch it); a machine without a GPU (E16) loads it for its CPU paths",
}


def truth(art: str, built: Env, here: Env) -> bool:
    """Whether the artifact built in `built` is what `here` asks for and can load here."""
    return request(art, built) == request(art, here) and RULES[art](built, here)


def same_build(art: str, built: Env, here: Env) -> bool:
    """Compatible and made by the same toolkit: rebuilding it would be needless. (A CUDA 12
    cubin that loads under a CUDA 13 driver is safe to reuse, but a build with the CUDA 13
    toolkit is a different build, not a needless one.)"""
    gpu = art in ("cubin", "PTX")  # Triton's hsaco comes from Triton's LLVM, whatever the ROCm
    return truth(art, built, here) and (not gpu or built.cuda == here.cuda)


# ---- the schemes ------------------------------------------------------------------------


def _triton_key(env: Env) -> str:
    return f"libtriton-{env.python}"  # triton_key() hashes libtriton.so, built per Python


@dataclass
class Scheme:
    name: str
    key: Callable[[str, Env], Any]
    mechanism: str
    # cpp_extension: one folder per key, rebuilt in place by ninja when the command changes
    rebuild_on_command_change: bool = False


def _command(art: str, env: Env) -> tuple[str, ...]:
    """The build command's env-dependent part (what ninja compares)."""
    if art in ("cubin", "PTX"):
        return (f"-arch={request(art, env)}",)
    if art == CUDA_EXT:
        return (f"-I/usr/include/python{env.python}", f"-arch={request(art, env)}")
    if art == HSACO:
        return (f"--offload-arch={request(art, env)}",)
    if art in ("CPython module", "abi3 module", "classic torch op"):
        return (f"-I/usr/include/python{env.python}",)
    if art == HEADERED:
        return (f"header v{env.header}",)  # ninja's depfiles see the header change
    if art == WORDS:
        return (env.cxx,)  # ninja compares the command line, compiler words included
    return ()  # SHADOWED: no depfile lists a header that was looked for and not found


SCHEMES = [
    Scheme("torch cpp_extension", lambda a, e: (f"py{e.python.replace('.', '')}_{e.cu_tag}", a),
           "folder py311_cu128/<name>: key omits the torch version and C++ ABI (unsafe after a torch "
           "upgrade); ninja rebuilds in place when flags change, so alternating GPU targets rebuild",
           rebuild_on_command_change=True),
    Scheme("tvm-ffi addon (before #644)",
           lambda a, e: (a, f"torch{e.torch_version.replace('.', '')[:3]}-{e.flavor}"),
           "name torch{maj}{min}-{device}: key omits torch patch/local tag, C++ ABI, Python ABI and GPU arch"),
    Scheme("tvm-ffi addon (after #644)",
           lambda a, e: (a, f"torch{e.torch_version.replace('.', '')[:3]}-{e.flavor}",
                         hashlib.sha256(f"{e.torch}|{e.cxx11abi}".encode()).hexdigest()[:8]),
           "adds sha(torch.__version__|cxx11abi): key still omits Python ABI and GPU arch, and is too "
           "fine for stable-ABI ops and plain libraries"),
    Scheme("Triton key", lambda a, e: (a, _triton_key(e), f"ptxas{e.cuda}", e.target),
           "key = libtriton hash (one per Python) + ptxas + target: omits torch (unsafe for torch ops); "
           "Python and CUDA in every key rebuild identical artifacts"),
    Scheme("FlashInfer layout", lambda a, e: ("0.5", e.target, a),
           "{version}/{archs}/cached_ops/<uri>: key omits torch, CUDA toolkit and Python"),
]


# ---- abicache, through its own code ---------------------------------------------------------

C_SRC = "int answer(void) { return 42; }\n"
PY_SRC = "#include <Python.h>\nPyMODINIT_FUNC PyInit_probe(void) { return NULL; }\n"
OP_SRC = ('#include <ATen/ATen.h>\n#include <torch/library.h>\nat::Tensor twice(const at::Tensor& a) { return a.add(a); }\n'
          'TORCH_LIBRARY(matrix, m) { m.def("twice", &twice); }\n')
STABLE_SRC = ('#include <torch/csrc/stable/library.h>\n#include <torch/csrc/stable/tensor.h>\n'
              'using torch::stable::Tensor;\nTensor ident(Tensor t) { return t; }\n'
              'STABLE_TORCH_LIBRARY(matrix_stable, m) { m.def("ident(Tensor t) -> Tensor"); }\n'
              'STABLE_TORCH_LIBRARY_IMPL(matrix_stable, CPU, m) { m.impl("ident", TORCH_BOX(&ident)); }\n')
KERNEL = 'extern "C" __global__ void scale(float* x, float a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }'
EXT_SRC = ('#include <torch/extension.h>\nvoid launch_scale(float* x, float a, int n);\n'
           'double twice(double x) { return 2 * x; }\n'
           'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }\n')
EXT_CU = KERNEL + '\nvoid launch_scale(float* x, float a, int n) { scale<<<1, 256>>>(x, a, n); }\n'
#: Triton's key for one kernel source and Triton version, before the target is added
TRITON_KERNEL_KEY = hashlib.sha256(b"triton 3.6: k(x, n, B) source").hexdigest()


def facts_for(env: Env) -> Facts:
    abi = f"cp{env.python.replace('.', '')}"
    nvidia = not env.amd
    return Facts().with_overrides({
        "python.version": env.python + ".0", "python.abi": abi, "torch.version": env.torch,
        "torch.build": env.torch_build, "torch.flavor": env.flavor, "torch.cxx11abi": env.cxx11abi,
        "torch.cuda": f"{env.cuda}.0" if env.flavor == "cuda" else None,
        "torch.hip": env.torch.partition("+rocm")[2] or None,
        "cuda.runtime": str(env.cuda) if nvidia else None, "cuda.driver": f"{env.cuda}.0" if nvidia else None,
        "gpu.arch": env.device, "hip.runtime": str(env.hip) if env.amd else None,
        "cuda.nvcc": f"Cuda compilation tools, release {env.cuda}.0" if nvidia else None,
    })


def abicache_plan(art: str, env: Env, facts: Facts) -> tuple[str, str, Inputs, Requirements]:
    """(kind, name, inputs, declared) from the real frontends."""
    if art == "C library":
        p = cc.library_plan("clib", [C_SRC], lang="c")
    elif art == "CPython module":
        p = cc.module_plan("probe", [PY_SRC], facts=facts)
    elif art == "abi3 module":
        p = cc.module_plan("probe", [PY_SRC], abi3="3.10", facts=facts)
    elif art == "classic torch op":
        p = abitorch.plan("matrix", {"op.cpp": OP_SRC}, python_module=False, facts=facts)
    elif art == "stable torch op":
        p = abitorch.plan("matrix_stable", {"op.cpp": STABLE_SRC}, stable=True, target="2.9", facts=facts)
    elif art == HEADERED:
        p = cc.library_plan("proj", [HEADER_PROJECT / "proj.c"], lang="c")
    elif art == SHADOWED:
        p = cc.library_plan("shadowed", [SHADOW_PROJECT / "x.cpp"], cflags=[f"-I{SHADOW_PROJECT / 'first'}",
                                                                             f"-I{SHADOW_PROJECT / 'second'}"])
    elif art == WORDS:
        p = _with_cxx(env.cxx, lambda: cc.library_plan("words", ['extern "C" int f() { return 1; }']))
    elif art == CUDA_EXT:
        arch = request(art, env).split("_")[1]
        p = _with_env("TORCH_CUDA_ARCH_LIST", f"{arch[0]}.{arch[1:]}", lambda: abitorch.plan(
            "matrix_cuda", {"ext.cpp": EXT_SRC, "kernel.cu": EXT_CU}, facts=facts))
    elif art == HSACO:  # abicache.triton keys a kernel on Triton's own key, which holds the target
        inputs = Inputs.make({}, extra={"triton_key": f"{TRITON_KERNEL_KEY}|hip|{request(art, env)}|64"})
        return "triton", "k", inputs, Requirements()
    else:
        output = "cubin" if art == "cubin" else "ptx"
        inputs = Inputs.make({"scale.cu": KERNEL}, flags=[],
                             extra={"arch": request(art, env), "output": output,
                                    "compiler": facts.get("cuda.nvcc") or ""})
        return f"cuda.{output}", "scale", inputs, Requirements()
    return p.kind, p.name, p.inputs, Requirements.of(p.requires)


def requirements_of(art: str, built: Env) -> Requirements:
    """What the frontend declares and the audit detects for art built in `built`
    (checked against real builds by audit_real_builds)."""
    return Requirements.of({
        "C library": [],
        "CPython module": [f"python.abi == cp{built.python.replace('.', '')}"],
        "abi3 module": ["python.abi3 >= 3.10"],
        "classic torch op": [f"torch.build == {built.torch_build}", f"python.abi == cp{built.python.replace('.', '')}"],
        "stable torch op": ["torch.version >= 2.9"],
        "cubin": [f"gpu.arch ~= {request(art, built)}", f"cuda.driver >= {built.cuda}.0"],
        "PTX": [f"gpu.arch ~= {request(art, built)}", f"cuda.driver >= {built.cuda}.0"],
        HEADERED: [],
        HSACO: [f"gpu.arch ~= {request(art, built)}"],
        SHADOWED: [],
        WORDS: [],
        CUDA_EXT: [f"torch.build == {built.torch_build}", f"python.abi == cp{built.python.replace('.', '')}",
                   f"cuda.runtime == {built.cuda}", f"gpu.arch ~= {request(art, built)}"],
    }[art])


# ---- simulation ----------------------------------------------------------------------------


@dataclass
class Tally:
    unsafe: int = 0
    needless: int = 0
    builds: int = 0
    examples: list[str] = field(default_factory=list)


# find(art, env) -> (the artifact's build environment if the cache would reuse it, or None;
#                    a callable that records a build of art in env)
Finder = Callable[[str, Env], "tuple[Env | None, Callable[[], None]]"]


def simulate(find: Finder) -> Tally:
    """Walk the environments in order; count unsafe reuses, needless rebuilds, builds."""
    tally, built = Tally(), {a: [] for a in ARTIFACTS}
    for env in ENVS:
        for art in ARTIFACTS:
            if not applies(art, env):
                continue
            cached, record = find(art, env)
            if cached is not None:
                if not truth(art, cached, env):
                    tally.unsafe += 1
                    tally.examples.append(f"{art}: {cached.label} -> {env.label}")
                continue
            tally.builds += 1
            if any(same_build(art, b, env) for b in built[art]):
                tally.needless += 1
                tally.examples.append(f"needless {art} in {env.label}")
            record()
            built[art].append(env)
    return tally


def simulate_scheme(scheme: Scheme) -> Tally:
    slots: dict[Any, Env] = {}

    def find(art: str, env: Env) -> tuple[Env | None, Callable[[], None]]:
        k = scheme.key(art, env)
        slot = slots.get(k)
        if slot is not None and scheme.rebuild_on_command_change and _command(art, slot) != _command(art, env):
            slot = None  # ninja rebuilds in place
        return slot, lambda: slots.__setitem__(k, env)

    return simulate(find)


def simulate_abicache() -> Tally:
    """abicache's own code decides: keys from the real frontends' plans, requirements
    by the real Requirements, and for the edited header the real dependency check
    against the header as it is in each environment (written to disk)."""
    from abicache.store import deps as depcheck

    store: dict[str, list[tuple[Env, Requirements, tuple[Any, ...]]]] = {}
    facts = {env: facts_for(env) for env in ENVS}

    def find(art: str, env: Env) -> tuple[Env | None, Callable[[], None]]:
        deps: tuple[Any, ...] = ()
        absent: tuple[Any, ...] = ()
        if art == HEADERED:
            deps = _write_header(env)
        if art == SHADOWED:
            deps, absent = _write_shadow(env)
        kind, name, inputs, declared = abicache_plan(art, env, facts[env])
        k = keys.compute(kind, name, inputs.describe(facts[env]))
        bases = {"src": str(HEADER_PROJECT), "inc0": str(SHADOW_PROJECT / "first"),
                 "inc1": str(SHADOW_PROJECT / "second")}
        usable = [b for b, reqs, (d, a) in store.get(k, [])
                  if reqs.satisfied_by(facts[env]) and depcheck.first_changed(d, bases, {}, a)[0] is None]
        reqs = declared | requirements_of(art, env)
        return (usable[0] if usable else None), lambda: store.setdefault(k, []).append((env, reqs, (deps, absent)))

    return simulate(find)


HEADER_PROJECT = Path(tempfile.mkdtemp(prefix="abicache-matrix-project-"))
atexit.register(shutil.rmtree, HEADER_PROJECT, True)  # made on import (tests/test_matrix.py): gone at exit
(HEADER_PROJECT / "proj.c").write_text('#include "proj.h"\nint answer(void) { return ANSWER; }\n')


def _write_header(env: Env) -> tuple[Any, ...]:
    """Put the header as it is in env on disk; the dependency a build there records."""
    from abicache.store import deps as depcheck
    from abicache.store.manifest import Dependency

    text = f"#define ANSWER {40 + env.header}\n"
    (HEADER_PROJECT / "proj.h").write_text(text)
    depcheck.forget()  # as a new process would: no hash remembered from before the edit
    return (Dependency("src", "proj.h", hashlib.sha256(text.encode()).hexdigest()),)


SHADOW_PROJECT = Path(tempfile.mkdtemp(prefix="abicache-matrix-shadow-"))
atexit.register(shutil.rmtree, SHADOW_PROJECT, True)
(SHADOW_PROJECT / "first").mkdir()
(SHADOW_PROJECT / "second").mkdir()
(SHADOW_PROJECT / "second" / "v.h").write_text("#define VALUE 1\n")
(SHADOW_PROJECT / "x.cpp").write_text('#include <v.h>\nextern "C" int f() { return VALUE; }\n')


def _write_shadow(env: Env) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Put the shadowing header there or not, as env has it; what a build there records
    (engine/record.py): the header it read, and, where the first folder had none, that
    it must stay missing there."""
    from abicache.store import deps as depcheck
    from abicache.store.manifest import Absent, Dependency

    shadow = SHADOW_PROJECT / "first" / "v.h"
    depcheck.forget()
    if env.shadow:
        shadow.write_text("#define VALUE 2\n")
        return (Dependency("inc0", "v.h", hashlib.sha256(b"#define VALUE 2\n").hexdigest()),), ()
    shadow.unlink(missing_ok=True)
    return ((Dependency("inc1", "v.h", hashlib.sha256(b"#define VALUE 1\n").hexdigest()),),
            (Absent("inc0", ".", "v.h"),))


def _with_cxx(cxx: str, make: Callable[[], Any]) -> Any:
    """A plan made where $CXX is cxx (the project's build sets it)."""
    return _with_env("CXX", cxx, make)


def _with_env(name: str, value: str, make: Callable[[], Any]) -> Any:
    """A plan made where the variable has that value (the project's build sets it)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        return make()
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def minimum_builds() -> int:
    built = {a: [] for a in ARTIFACTS}
    for env in ENVS:
        for art in ARTIFACTS:
            if applies(art, env) and not any(same_build(art, b, env) for b in built[art]):
                built[art].append(env)
    return sum(len(v) for v in built.values())


# ---- evidence: real loads and real audits --------------------------------------------------

PROBE = textwrap.dedent(r"""
    #include <Python.h>
    /* Py_SIZE of an int reads the object's layout as these headers see it:
       3.12 replaced ob_size with lv_tag, so an older module decodes garbage there. */
    static PyObject* size_of(PyObject* self, PyObject* v) { return PyLong_FromSsize_t(Py_SIZE(v)); }
    static PyMethodDef methods[] = {{"size_of", size_of, METH_O, ""}, {NULL, NULL, 0, NULL}};
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "probe", NULL, -1, methods};
    PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&def); }
""")
LOAD = ("import importlib.util as u, sys; s = u.spec_from_file_location('probe', sys.argv[1]); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.size_of(5))")


def interpreters() -> dict[str, str]:
    base = Path.home() / ".pyenv" / "versions"
    found = {}
    for version in PYTHONS:
        for candidate in sorted(base.glob(f"{version}.*")) if base.is_dir() else []:
            if (candidate / "bin" / "python3").exists():
                found[version] = str(candidate / "bin" / "python3")
                break
    return found


def measure_python_loads(work: Path) -> dict[tuple[str, str], str]:
    """(built with, loaded by) -> what the probe returned ('error: ...' if it failed)."""
    pythons = interpreters()
    (work / "probe.c").write_text(PROBE)
    modules = {}
    for version, exe in pythons.items():
        include = subprocess.run([exe, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        out = work / f"probe-{version}.so"
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-DNDEBUG", f"-I{include}", str(work / "probe.c"), "-o", str(out)],
                       check=True)
        modules[version] = out
    results = {}
    for b, module in modules.items():
        for e, exe in pythons.items():
            got = subprocess.run([exe, "-c", LOAD, str(module)], capture_output=True, text=True)
            results[(b, e)] = got.stdout.strip() if got.returncode == 0 else f"error: {got.stderr.strip()[-80:]}"
    return results


def audit_real_builds(work: Path) -> list[tuple[str, str, str, bool]]:
    """Build each artifact here; its manifest's requirements (declared by the real
    frontend, detected by the real audit) must be what requirements_of() assumes,
    apart from platform floors that every environment meets."""
    import importlib.util

    from abicache import Cache
    from abicache import cuda

    cache = Cache(work / "store", remote=False)
    here = Env("here", f"{sys.version_info.major}.{sys.version_info.minor}", "", "1", 13, "sm_90", "sm_90")
    rows: list[tuple[str, str, str, bool]] = []

    def check(art: str, what: str, built: Any, model: Requirements) -> None:
        real = built.manifest.requirements
        names = {r.name for r in model}
        same = all(r in real for r in model if r.name != "torch.build")
        torch_ok = ("torch.build" in names) == any(r.name == "torch.build" for r in real)
        extra = [r for r in real if r.name not in names and not r.name.startswith("platform.")]
        rows.append((art, what, str(real) or "(none)", same and torch_ok and not extra))

    check("C library", "gcc, plain C", cc.build_library("clib", [C_SRC], lang="c", cache=cache),
          requirements_of("C library", here))
    check("CPython module", f"cp{here.python}", cc.build_module("probe", [PY_SRC], cache=cache),
          requirements_of("CPython module", here))
    check("abi3 module", "Py_LIMITED_API 3.10", cc.build_module("probe", [PY_SRC], abi3="3.10", cache=cache),
          requirements_of("abi3 module", here))
    for art, target in (("cubin", "sm_80"), ("cubin", "sm_90"), ("cubin", "sm_90a"), ("PTX", "sm_90")):
        env = Env("here", here.python, "", "1", 13, target[:5], target)
        try:
            compiled = cuda.compile(KERNEL, arch=request(art, env), output=art.lower(),
                                            compiler="nvcc", cache=cache)
        except Exception as exc:  # no nvcc here: the report says so
            rows.append((art, target, f"not built: {exc}"[:80], False))
            continue
        check(art, f"nvcc 13, {request(art, env)}", compiled.artifact, requirements_of(art, env))
    for target in ("gfx942", "gfx90a"):
        env = Env("here", here.python, "", "1", 0, target, target, hip=6)
        try:
            hsaco = triton_hsaco(work, target)
        except Exception as exc:  # no Triton here: the report says so
            rows.append((HSACO, target, f"not built: {exc}"[:80], False))
            continue
        amd = cache.for_target({"gpu.arch": target})
        built = amd.get_or_build("matrix.hsaco", "k", {"extra": {"target": target}},
                                 lambda out, data=hsaco: (out / "k.hsaco").write_bytes(data))
        check(HSACO, f"Triton, {target}", built, requirements_of(HSACO, env))
    if importlib.util.find_spec("torch") is None:
        rows.append(("torch ops", "-", "not built: torch is not installed", False))
        return rows
    stable = abitorch.build_inline("matrix_stable", [STABLE_SRC], stable=True, target="2.9", cache=cache)
    check("stable torch op", "target 2.9", stable, requirements_of("stable torch op", here))
    classic = abitorch.plan("matrix", {"op.cpp": OP_SRC}, python_module=False, facts=cache.facts).run(cache)
    check("classic torch op", "TORCH_LIBRARY", classic, requirements_of("classic torch op", here))
    return rows


TRITON_AMD = textwrap.dedent("""
    import sys, triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    @triton.jit
    def k(x, n, B: tl.constexpr):
        o = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(x + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)
    src = ASTSource(fn=k, signature={"x": "*fp32", "n": "i32", "B": "constexpr"}, constexprs={"B": 64})
    sys.stdout.buffer.write(triton.compile(src, target=GPUTarget("hip", sys.argv[1], 64)).asm["hsaco"])
""")


def triton_hsaco(work: Path, target: str) -> bytes:
    """Triton's code object for an AMD target, compiled here (Triton needs no ROCm for it)."""
    script = work / "triton_amd.py"  # @triton.jit reads its source from a file
    script.write_text(TRITON_AMD)
    done = subprocess.run([sys.executable, str(script), target], capture_output=True, timeout=600,
                          env={**os.environ, "TRITON_CACHE_DIR": str(work / "triton-cache")})
    if done.returncode != 0:
        raise RuntimeError(done.stderr.decode(errors="replace").strip().splitlines()[-1])
    return done.stdout


def measure_clib_loads(work: Path) -> dict[str, str]:
    """The plain C library, loaded with ctypes by every interpreter."""
    lib = work / "libclib.so"
    (work / "clib.c").write_text(C_SRC)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", str(work / "clib.c"), "-o", str(lib)], check=True)
    code = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).answer())"
    return {v: subprocess.run([exe, "-c", code, str(lib)], capture_output=True, text=True).stdout.strip()
            for v, exe in interpreters().items()}


def evidence(loads: dict[tuple[str, str], str], clib: dict[str, str], audited: dict[str, bool]) -> dict[str, str]:
    """How each artifact's cells are known: measured by real loads, or derived from a rule
    (confirmed, or not, by the audit of a real build)."""
    pythons = set(interpreters())
    out = {}
    for art in ARTIFACTS:
        if art == "C library" and pythons == set(PYTHONS) and all(v == "42" for v in clib.values()):
            out[art] = "measured: loaded by 3.10-3.13 with ctypes"
        elif art == HEADERED:
            out[art] = "measured: tests/test_build.py compiles, edits the header, loads the new answer"
        elif art in (SHADOWED, WORDS):
            out[art] = ("measured: tests/test_fidelity.py and bench/fidelity.py compile, change it, load the "
                        "new answer in a fresh process (beside ccache)")
        elif art == CUDA_EXT:
            out[art] = ("measured: tests/test_torch_newest.py builds one (-Ofast -fopenmp, arch list 9.0) under "
                        "torch 2.15+cu132 without a GPU, loads it and calls its CPU function; bench/gpu calls one on "
                        "an H100; the audit's requirements are checked there")
        elif art in ("CPython module", "abi3 module") and pythons == set(PYTHONS):
            out[art] = "measured: real loads under 3.10-3.13" + (" (+ the per-minor rule)" if art == "CPython module" else "")
        else:
            confirmed = audited.get(art)
            out[art] = "derived: documented rule" + (", confirmed by the audit of a real build" if confirmed
                                                     else " (no real build here)")
    return out


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    work = Path(tempfile.mkdtemp(prefix="abicache-matrix-"))
    os.environ["ABICACHE_PROGRESS"] = "0"
    loads = measure_python_loads(work)
    clib = measure_clib_loads(work)
    audits = audit_real_builds(work)
    audited = {}
    for art, _, _, ok in audits:
        audited[art] = audited.get(art, True) and ok
    minimum = minimum_builds()
    results = {s.name: simulate_scheme(s) for s in SCHEMES}
    results["abicache"] = simulate_abicache()
    mechanisms = {s.name: s.mechanism for s in SCHEMES}
    mechanisms["abicache"] = ("key = inputs + tool identities; requirements (declared + audited) checked "
                              "against each environment; variants side by side")
    console = Console(width=200)
    t = Table(title=f"{len(ENVS)} environments x {len(ARTIFACTS)} artifacts sharing one cache "
                    f"(minimum possible builds: {minimum})", title_justify="left")
    for col in ("scheme", "unsafe reuses", "needless rebuilds", "builds", "vs minimum", "why"):
        t.add_column(col, overflow="fold")
    for name, tally in results.items():
        t.add_row(name, str(tally.unsafe), str(tally.needless), str(tally.builds),
                  f"{tally.builds / minimum:.2f}x", mechanisms[name])
    console.print(t)
    ev = evidence(loads, clib, audited)
    t = Table(title="Ground truth: how each artifact's cells are known", title_justify="left")
    for col in ("artifact", "rule", "evidence"):
        t.add_column(col, overflow="fold")
    for art in ARTIFACTS:
        t.add_row(art, WHY_RULE[art], ev[art])
    console.print(t)
    versions = sorted({b for b, _ in loads})
    t = Table(title="Measured: Py_SIZE(5) from a cpXY probe module loaded by each interpreter "
                    "(its own interpreter says 1 before 3.12, 8 from 3.12)", title_justify="left")
    t.add_column("built with \\ loaded by")
    for v in versions:
        t.add_column(v)
    for b in versions:
        own = loads[(b, b)]
        t.add_row(b, *[loads[(b, e)] + ("" if loads[(b, e)] == own else " (garbage)") for e in versions])
    console.print(t)
    t = Table(title="Audit of real builds here vs the requirements the matrix assumes", title_justify="left")
    for col in ("artifact", "build", "requirements found", "as assumed"):
        t.add_column(col, overflow="fold")
    for art, what, found, ok in audits:
        t.add_row(art, what, found, "yes" if ok else "NO")
    console.print(t)
    doc = {
        "environments": [e.__dict__ for e in ENVS], "artifacts": ARTIFACTS, "minimum_builds": minimum,
        "schemes": {n: {"unsafe": r.unsafe, "needless": r.needless, "builds": r.builds,
                        "mechanism": mechanisms[n], "examples": r.examples[:6]} for n, r in results.items()},
        "evidence": ev, "python_loads": {f"{b}->{e}": v for (b, e), v in loads.items()},
        "audits": [{"artifact": a, "build": w, "found": f, "as_assumed": ok} for a, w, f, ok in audits],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "matrix.json").write_text(json.dumps(doc, indent=1))
    chart = write_chart(results, minimum, RESULTS / "matrix.png")
    console.print(f"wrote {RESULTS / 'matrix.json'} and {chart}")
    ours = results["abicache"]
    ok = ours.unsafe == 0 and ours.needless == 0 and all(a[3] for a in audits)
    if not ok:
        console.print(f"[red]abicache: {ours.unsafe} unsafe, {ours.needless} needless; {ours.examples[:5]}[/]")
    return 0 if ok else 1


def write_chart(results: dict[str, Tally], minimum: int, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=120)
    x = range(len(names))
    width = 0.27
    ax.bar([i - width for i in x], [results[n].unsafe for n in names], width, label="unsafe reuses", color="#d62728")
    ax.bar(list(x), [results[n].needless for n in names], width, label="needless rebuilds", color="#ff7f0e")
    ax.bar([i + width for i in x], [results[n].builds for n in names], width, label="builds", color="#7f7f7f")
    ax.axhline(minimum, color="#2ca02c", linestyle="--", linewidth=1, label=f"minimum builds ({minimum})")
    ax.set_xticks(list(x), [n.replace(" (", "\n(") for n in names], fontsize=8)
    ax.set_title(f"{len(ENVS)} environments x {len(ARTIFACTS)} artifacts sharing one cache")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
