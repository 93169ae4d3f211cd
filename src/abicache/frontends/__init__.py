"""What the public frontends at the top of the package (cc, torch, cuda, triton, tvm_ffi) are built
from: torch's own build lines (torch_lines), a newer torch's call handed to torch (torch_newer),
one build of each stable op library a process (torch_oplibs), torch.compile's cache (torch_compile), Triton's probes
remembered (triton_probes), routing another library's entry points (patching), `abicache check`,
which replays a frontend's call (check, check_spawn), and cc's plans and compiler runs (cc_plans)."""
