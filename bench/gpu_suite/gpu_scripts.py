"""The programs bench/gpu times in fresh interpreters (Context.python runs each
from a file). Each prints one JSON line last. The timed region is the same for
every column of a row: what abicache does, what the tool it replaces does, and
the floor (the same binary loaded by hand, with no cache in front of it).

ABICACHE_BENCH_PROFILE=FILE: the abicache column's timed region also runs under
cProfile, its top functions appended to FILE (a separate run, not in a median).
"""

# Shared by the scripts: time a call, under cProfile where ABICACHE_BENCH_PROFILE names a file.
TIMED = r'''
import os, time
def timed(label, fn):
    path = os.environ.get("ABICACHE_BENCH_PROFILE")
    if not path:
        t = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - t
    import cProfile, io, pstats
    profile = cProfile.Profile()
    t = time.perf_counter()
    profile.enable()
    result = fn()
    profile.disable()
    spent = time.perf_counter() - t
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(40)
    stats.sort_stats("tottime").print_stats(20)
    with open(path, "a") as f:
        f.write(f"\n==== {label}: {spent * 1e3:.1f} ms under the profiler\n{text.getvalue()}")
    return result, spent
'''

# Triton: the first launch of a cached kernel in a fresh process (torch's context already made).
# abicache: abicache's store; default: Triton's own FileCacheManager; memory: Triton's own path
# with triton_key() and every cache lookup answered from a dict filled before the timer (the
# floor of Triton's path); hand: the same cubin through cuModuleLoadData and cuLaunchKernel.
TRITON = TIMED + r'''
import json, sys
mode = sys.argv[1]
import torch
n = 1 << 20
x = torch.randn(n, device="cuda"); y = torch.randn(n, device="cuda"); out = torch.empty_like(x)
torch.cuda.synchronize()
if mode == "hand":
    import ctypes
    import numpy as np
    from cuda.bindings import driver as cu
    meta = json.loads(os.environ["TRITON_CUBIN"])
    def launch():
        image = np.fromfile(meta["path"], dtype=np.uint8)
        err, module = cu.cuModuleLoadData(image.ctypes.data)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        err, function = cu.cuModuleGetFunction(module, meta["name"].encode())
        assert err == cu.CUresult.CUDA_SUCCESS, err
        # the kernel's own four arguments, then null scratch pointers (Triton appends them; extra ones are unread)
        args = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                ctypes.c_int32(n)] + [ctypes.c_void_p(0) for _ in range(4)]
        params = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
        err, = cu.cuLaunchKernel(function, n // 1024, 1, 1, 32 * meta["num_warps"], 1, 1, meta["shared"], 0,
                                 ctypes.addressof(params), 0)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        torch.cuda.synchronize()
    _, first = timed("hand", launch)
    print(json.dumps({"first_launch_s": first, "err": (out - (x * 2 + y)).abs().max().item(), "hits": [],
                      "builds": []}))
    raise SystemExit(0)
import importlib
import triton, triton.language as tl
hits, builds = [], []
try:  # the launcher and driver modules Triton compiles with gcc, cached with a lone put()
    import triton.runtime.build as tb
    compile_c = tb._build
    def counted_build(*args, **kwargs):
        builds.append(str(args[0]) if args else "?")
        return compile_c(*args, **kwargs)
    tb._build = counted_build
except (ImportError, AttributeError):
    builds = None
from triton.runtime.cache import FileCacheManager
if mode == "abicache":
    import abicache.triton
    abicache.triton.install()
    manager = abicache.triton.CacheManager
elif mode == "memory":
    root = os.environ["TRITON_CACHE_DIR"]
    files, groups = {}, {}
    for key in (os.listdir(root) if os.path.isdir(root) else []):
        folder = os.path.join(root, key)
        files[key] = {name: os.path.join(folder, name) for name in os.listdir(folder)}
        groups[key] = {name[len("__grp__"):]: json.load(open(path))["child_paths"]
                       for name, path in files[key].items() if name.startswith("__grp__")}
    class manager(FileCacheManager):
        def get_file(self, filename):
            return files.get(self.key, {}).get(filename)
        def get_group(self, filename):
            return groups.get(self.key, {}).get(filename)
    triton.knobs.cache.manager_class = manager
    for name in ("triton.runtime.cache", "triton.runtime.autotuner", "triton.compiler.compiler"):
        module = importlib.import_module(name)
        if hasattr(module, "triton_key"):
            module.triton_key = lambda: "bench-gpu-floor"
else:
    manager = FileCacheManager
get_group = manager.get_group
def counted(self, filename):
    found = get_group(self, filename)
    hits.append(found is not None)
    return found
manager.get_group = counted

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + tl.load(y_ptr + offs, mask=mask), mask=mask)

def launch():
    kernel = add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    return kernel
kernel, first = timed(f"triton first launch ({mode})", launch)
err = (out - (x * 2 + y)).abs().max().item()
if os.environ.get("TRITON_CUBIN_OUT"):  # the cubin Triton launched, for the hand-made floor
    with open(os.environ["TRITON_CUBIN_OUT"], "wb") as f:
        f.write(kernel.asm["cubin"])
    meta = {"path": os.environ["TRITON_CUBIN_OUT"], "name": kernel.metadata.name,
            "shared": kernel.metadata.shared, "num_warps": kernel.metadata.num_warps}
else:
    meta = None
print(json.dumps({"first_launch_s": first, "err": err, "hits": hits, "builds": builds, "triton": triton.__version__,
                  "cubin": meta}))
'''

# torch CUDA extensions: the load call after `import torch`; floor-*: the same .so by path.
TORCH = TIMED + r'''
import json, sys
mode, arg = sys.argv[1], sys.argv[2]
CLASSIC_CPP, CLASSIC_CU, STABLE_CPP, STABLE_CU = json.loads(os.environ["GPU_SOURCES"])
t0 = time.perf_counter()
import torch
t = time.perf_counter()
def load():
    if mode == "torch":
        from torch.utils.cpp_extension import load_inline
        return load_inline("abicache_gpu_classic", [CLASSIC_CPP], cuda_sources=[CLASSIC_CU], functions=["scale"],
                           build_directory=arg)
    if mode == "abicache":
        import abicache.torch as at
        return at.load_inline("abicache_gpu_classic", [CLASSIC_CPP], cuda_sources=[CLASSIC_CU], functions=["scale"])
    if mode == "stable":
        import abicache.torch as at
        return at.load_inline("abicache_gpu_stable", [STABLE_CPP], cuda_sources=[STABLE_CU], stable=True)
    if mode == "floor-classic":  # import the very file by path, as Python's import system would
        import importlib.util
        spec = importlib.util.spec_from_file_location("abicache_gpu_classic", arg)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    torch.ops.load_library(arg)  # floor-stable
    return arg
mod, loaded = timed(f"torch extension load ({mode})", load)
x = torch.randn(1 << 20, device="cuda")
if mode in ("stable", "floor-stable"):
    err = (torch.ops.abicache_gpu_stable.add_one(x) - (x + 1)).abs().max().item()
else:
    err = (mod.scale(x, 3.0) - 3 * x).abs().max().item()
torch.cuda.synchronize()
hit = served = None
if mode in ("abicache", "stable"):
    from abicache import Cache, cc
    served = type(next(iter(cc._loaded.values()))[0]).__name__ == "Served"  # by its hit record
    # this extension's entries (the store is shared: check 7's tree is a torch.pybind entry too)
    store = Cache(os.environ["ABICACHE_DIR"]).store
    name = "abicache_gpu_stable" if mode == "stable" else "abicache_gpu_classic"
    hit = len([v for v in store.iter_variant_dirs() if store.read_manifest(v).name == name])
path = mod if isinstance(mod, str) else getattr(mod, "__file__", None)
print(json.dumps({"load_s": loaded, "import_torch_s": t - t0, "err": err, "entries": hit, "torch": torch.__version__,
                  "path": path, "served": served}))
'''

# A torch CUDA extension as a source tree (4 files, 2 headers), load()ed from files.
TREE = TIMED + r'''
import json, sys
mode, arg = sys.argv[1], sys.argv[2]
tree = json.loads(os.environ["TREE"])
import torch
def load():
    if mode == "torch":
        from torch.utils.cpp_extension import load
        return load("abicache_gpu_tree", tree["sources"], extra_include_paths=[tree["include"]], build_directory=arg)
    if mode == "abicache":
        import abicache.torch as at
        return at.load("abicache_gpu_tree", tree["sources"], extra_include_paths=[tree["include"]])
    import importlib.util
    spec = importlib.util.spec_from_file_location("abicache_gpu_tree", arg)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
mod, loaded = timed(f"torch extension tree load ({mode})", load)
x = torch.randn(1 << 20, device="cuda")
err = (mod.axpb(x, 3.0, 1.0) - (3 * x + 1)).abs().max().item()
torch.cuda.synchronize()
served = None
if mode == "abicache":
    from abicache import cc
    served = type(next(iter(cc._loaded.values()))[0]).__name__ == "Served"  # by its hit record
print(json.dumps({"load_s": loaded, "err": err, "path": mod.__file__, "served": served}))
'''

# Many distinct Triton kernels (one constexpr each) launched in one fresh process.
# cold: launch kernels start, start+step, ... < count (one of several compiling workers).
KERNELS = TIMED + r'''
import json, sys
mode, count = sys.argv[1], int(sys.argv[2])
start, step = (int(v) for v in sys.argv[3:5]) if len(sys.argv) > 4 else (0, 1)
import torch, triton, triton.language as tl
if mode == "abicache":
    import abicache.triton
    abicache.triton.install()

@triton.jit
def scaled(x_ptr, out_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * SCALE, mask=mask)

n = 1024
x = torch.randn(n, device="cuda"); out = torch.empty_like(x)
torch.cuda.synchronize()
def launch_all():
    for k in range(start, count, step):
        scaled[(1,)](x, out, n, SCALE=k, BLOCK=1024)
    torch.cuda.synchronize()
_, spent = timed(f"{count} Triton kernels ({mode})", launch_all)
err = (out - x * (count - 1)).abs().max().item() if step == 1 else 0.0  # the last kernel's answer
print(json.dumps({"seconds": spent, "err": err}))
'''
