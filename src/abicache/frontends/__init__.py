"""What the public frontends at the top of the package (cc, torch, cuda, triton, tvm_ffi) are built
from: torch's own build lines (torch_lines), torch.compile's cache (torch_compile), Triton's probes
remembered (triton_probes), routing another library's entry points (patching), `abicache check`,
which replays a frontend's call (check, check_spawn), and cc's plans and compiler runs (cc_plans)."""
