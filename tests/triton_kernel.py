"""Compile one Triton kernel through abicache; run as a script in any interpreter.

Environment: BLOCK (constexpr), ARCH (target: 90 for sm_90, gfx942 for an AMD GPU), WARPS (num_warps),
BODY=alt (another source),
DEFAULT_CACHE=1 (Triton's own cache, for the benchmark).
"""
import json, os, sys, time
t0 = time.perf_counter()
opened = []
assembled = []  # ptxas runs that assemble a kernel
spawned = []  # every program run (a hit through abicache runs none)
def _audit(ev, args):
    if ev == "open" and "libtriton" in str(args[0]):
        opened.append(str(args[0]))
    elif ev == "subprocess.Popen":
        spawned.append(os.path.basename(str(args[0])) + " " + " ".join(str(a) for a in (args[1] or ())[1:2]))
        if any("--gpu-name" in str(a) for a in (args[1] or ())):
            assembled.append(str(args[0]))
sys.addaudithook(_audit)
import triton, triton.language as tl
t_import = time.perf_counter()
if os.environ.get("DEFAULT_CACHE") != "1":
    import abicache.triton
    abicache.triton.install()
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def add_kernel_alt(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * tl.load(y_ptr + offs, mask=mask), mask=mask)

block = int(os.environ.get("BLOCK", "128"))
fn = add_kernel_alt if os.environ.get("BODY") == "alt" else add_kernel
import inspect
if "constexprs" in inspect.signature(ASTSource).parameters:  # Triton 3.3 and newer
    src = ASTSource(fn=fn, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, constexprs={"BLOCK": block})
else:  # Triton 3.2: constants by name, no constexpr entry in the signature
    src = ASTSource(fn=fn, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}, constants={"BLOCK": block})
t1 = time.perf_counter()
options = {"num_warps": int(os.environ["WARPS"])} if os.environ.get("WARPS") else None
arch = os.environ.get("ARCH", "90")
target = GPUTarget("hip", arch, 64) if arch.startswith("gfx") else GPUTarget("cuda", int(arch), 32)
k = triton.compile(src, target=target, options=options)
t2 = time.perf_counter()
import hashlib
binary = k.asm["hsaco"] if arch.startswith("gfx") else k.asm["cubin"]
print(json.dumps({"py": sys.version[:4], "triton": triton.__version__, "cubin_sha": hashlib.sha256(binary).hexdigest(),
                  "compile_s": t2 - t1, "total_s": t2 - t0, "hit_path_s": t2 - t_import,
                  "libtriton_opened": opened, "assembled": len(assembled), "spawned": spawned,
                  "platform_key": __import__("triton.runtime.build", fromlist=["x"]).platform_key()
                  if os.environ.get("PLATFORM_KEY") else None}))
