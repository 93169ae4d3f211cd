"""compile(): CUDA source to cubin, PTX or fatbin, with nvcc or NVRTC, through the cache.

The key holds the source, the arch(s), the output kind, the options and the
compiler's identity (the nvcc version string, or the NVRTC version). The
requirements come from the audit of what was produced (GPU targets; PTX ISA ->
minimum driver), checked against the *target*: compiling for sm_90 on a
machine without that GPU is the point of a build farm, so lookups judge the
artifact for the device and toolkit it was compiled for.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from ..values.archs import Target, parse_target
from ..engine import depfile, roots, steer, tree as trees
from ..core.cache import Artifact, BuildResult, Cache, default_cache
from ..errors import AbicacheError, BuildError
from ..core.key import Inputs

OUTPUTS = {"cubin": ".cubin", "ptx": ".ptx", "fatbin": ".fatbin"}


class Compiled(NamedTuple):
    data: bytes
    path: Path
    artifact: Artifact


def compile(source: str, *, arch: str | Sequence[str], output: str = "cubin", compiler: str = "nvcc",
            options: Sequence[str] = (), name: str | None = None, cache: Cache | None = None,
            nvrtc_major: int | None = None) -> Compiled:
    """Compile CUDA C++ source; returns the bytes and the cached file."""
    if output not in OUTPUTS:
        raise AbicacheError(f"output={output!r}: use one of {', '.join(OUTPUTS)}")
    archs = [arch] if isinstance(arch, str) else list(arch)
    for a in archs:
        try:
            target = parse_target(a)  # a clear error for a bad arch, before anything runs
        except ValueError as exc:
            raise AbicacheError(f"arch: {exc}") from None
        if not isinstance(target, Target):
            raise AbicacheError(f"arch={a!r} is an AMD GPU target; cuda.compile builds for NVIDIA GPUs "
                                "(sm_XY, compute_XY)")
    if output != "fatbin" and len(archs) != 1:
        raise AbicacheError(f"output={output!r} takes one arch; use output='fatbin' for several")
    name = name or _kernel_name(source)
    cache = cache or default_cache()
    bases: dict[str, str] = {"cwd": os.getcwd()}
    flags, key_flags = trees.include_bases(options, bases)  # include folders: bases, not paths, in the key
    if compiler == "nvcc":
        tree = trees.Tree((trees.File(f"{name}.cu", source, None),), bases, flags, key_flags)
        identity, build = _nvcc_plan(tree, archs, output, name, cache.facts.get("cuda.nvcc"), cache.store.trust.ok)
    elif compiler == "nvrtc":
        if output == "fatbin":
            raise AbicacheError("NVRTC produces cubin or PTX, not fatbins; use compiler='nvcc'")
        identity, build = _nvrtc_plan(source, archs[0], output, list(flags), name, nvrtc_major,
                                      cache.store.layout.tools, bases)
    else:
        raise AbicacheError(f"compiler={compiler!r}: use 'nvcc' or 'nvrtc'")
    inputs = Inputs.make({f"{name}.cu": source}, flags=list(key_flags),
                         extra={"arch": ",".join(archs), "output": output, "compiler": identity,
                                **steer.key_extra()})
    target = _target_cache(cache, archs, identity)
    art = target.get_or_build(f"cuda.{output}", name, inputs, build, _driver_floor(identity), bases=bases)
    path = art.file()
    return Compiled(path.read_bytes(), path, art)


def _kernel_name(source: str) -> str:
    match = re.search(r"__global__\s+void\s+(\w+)", source)
    return match.group(1) if match else "kernel"


def _toolkit(identity: str) -> re.Match[str] | None:
    return re.search(r"(\d+)\.(\d+)", identity.split("release")[-1])


def _driver_floor(identity: str) -> list[str]:
    """A driver of the toolkit's major at least: NVIDIA supports code from a toolkit
    only on drivers of its major or newer, and cubins carry no such mark of their own
    (CUDA 13's have no tkinfo note; bench/matrix caught the gap)."""
    toolkit = _toolkit(identity)
    return [f"cuda.driver >= {toolkit.group(1)}.0"] if toolkit else []


def _target_cache(cache: Cache, archs: list[str], identity: str) -> Cache:
    """The same store, judged for the device and toolkit the code was compiled for."""
    devices = sorted({f"sm_{t.major}{t.minor}" for t in map(parse_target, archs)})
    toolkit = _toolkit(identity)
    overrides = {"gpu.arch": devices[0] if len(devices) == 1 else ",".join(devices)}
    if toolkit and not cache.facts.get("cuda.driver"):
        overrides["cuda.driver"] = f"{toolkit.group(1)}.{toolkit.group(2)}"
    return cache.for_target(overrides)


def _nvcc_plan(tree: trees.Tree, archs: list[str], output: str, name: str, identity: str | None,
               trust: Callable[[os.stat_result], bool]):
    from ..env import probes

    nvcc = probes.nvcc_path()
    if nvcc is None or identity is None:
        raise AbicacheError("nvcc was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin); install the "
                            "CUDA toolkit or use compiler='nvrtc'")
    filename = name + OUTPUTS[output]
    if output == "fatbin":
        arch_flags = [f"-gencode=arch={_virtual(a)},code={a}" for a in archs]
    else:
        arch_flags = [f"-arch={archs[0]}"]
    # The toolkit's own headers come with the nvcc version in the key.
    toolkit = {roots.normal(str(Path(nvcc).parent.parent)), roots.normal(str(Path(nvcc).resolve().parent.parent))}

    def build(out: Path) -> BuildResult:
        from ..cc import run_compiler
        from ..engine import observe, record
        from ..engine import scratch as scratches

        tools = out.parent.parent / "tools"  # the store's (out is a stage in its tmp/)
        with scratches.scratch() as scratch:  # swept by a later build where this process is killed
            src = Path(scratch) / tree.files[0].name
            src.write_bytes(tree.files[0].code.encode("utf-8", "surrogateescape"))  # the bytes it was read as
            dfile = Path(scratch) / "deps.d"
            with observe.watching(observe.library(tools, trusted=trust), scratch) as session:
                run_compiler([str(nvcc), f"-{output}", *arch_flags, *tree.flags, str(src), "-o",
                              str(out / filename), "-MD", "-MF", str(dfile)], Path(os.getcwd()),
                             f"CUDA {output} {name}",
                             **({"env": session.env, "fds": session.fds} if session else {}))
                observed = session.result([str(nvcc)], os.getcwd()) if session else None
            # the host compiler's system headers are recorded, as for C++ (unless sloppiness says otherwise)
            covered = [*toolkit, *(roots.compiler_dirs(("c++",)) if roots.sloppy_system_headers() else ())]
            read = depfile.read(dfile) if dfile.exists() else None
            rec = record.of(observed, read, os.getcwd(), tree, covered, [scratch, str(out.parent.parent.parent)],
                            tools)
            return BuildResult(deps=rec.deps, absent=rec.absent, env=rec.env, system=rec.system)

    return identity, build


def _virtual(arch: str) -> str:
    return arch if arch.startswith("compute_") else arch.replace("sm_", "compute_")


def _nvrtc_plan(source: str, arch: str, output: str, options: Sequence[str], name: str, major: int | None,
                memo_dir: Path, bases: dict[str, str]):
    from . import nvrtc

    identity = nvrtc.identity(major, memo_dir)
    target = arch if output == "cubin" else _virtual(arch)
    if output == "cubin" and not arch.startswith("sm_"):
        raise AbicacheError(f"a cubin needs a real arch like sm_90, not {arch!r}")
    opts = [f"--gpu-architecture={target}", *options]
    filename = name + OUTPUTS[output]

    def build(out: Path) -> BuildResult:
        data = nvrtc.compile_source(nvrtc.library(major), source, name, opts, output)
        if not data:
            raise BuildError(f"NVRTC returned no {output} for {name}")
        (out / filename).write_bytes(data)
        # NVRTC cannot say which headers it read: every file of its include folders counts.
        return BuildResult(deps=trees.every_file(bases, [b for b in bases if b.startswith("inc")]))

    return identity, build
