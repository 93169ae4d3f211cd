"""What a hit record of GPU code holds of the GPU facts its lookup judged by, and the check
of it in a served call.

A torch CUDA extension is keyed on the GPUs present where TORCH_CUDA_ARCH_LIST does not
name them (engine/jitargs.py cuda_arch_flags) and requires `gpu.arch ~= ...` and
`cuda.runtime == N` (the audit); a library that links the driver requires `cuda.driver`.
Those facts are no file's stat, so a record holds what they stand on, as a text field
(record.py): `gpu=<digest>` the premise under which the driver's answer is remembered
(env/cuda_premise.py seen: the boot, the kernel module, the GPUs, the device nodes, the
loader's cache, the variables that choose devices), with the memo file itself an l witness;
`gpu=none` no kernel module and no driver library to load (a machine without a GPU: CUDA
reaches none here); `cudart=N` the CUDA runtime this process has loaded, from which the
lookup read cuda.runtime. A lookup in a fresh process with the same premise reads the same
memo, so the record is exactly as loose as the lookup. AMD GPUs (KFD's topology present)
are judged by a full lookup; their absence is an a witness.
"""

from __future__ import annotations

import os

from ..env import cuda_premise
from ..values.digest import sha256_hex

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Sequence

    from ..core.artifact import Artifact
    from ..core.cache import Cache
    from ..env.facts import Facts

#: facts a record holds through this field
FACTS = frozenset({"gpu.arch", "cuda.driver", "cuda.runtime"})
#: tools whose keys read the GPU facts (the arch flags)
TOOLS = frozenset({"cuda.nvcc"})

Witness = tuple[str, str, tuple[int, int, int, int]]


def holds(field: str) -> bool:
    """Whether the GPU facts stand on what they stood on when the record was written."""
    for part in field.split(";"):
        what, _, value = part.partition("=")
        if what == "gpu":
            premise = cuda_premise.seen()
            if value == "none":
                if premise is not None or cuda_premise.driver_loads():
                    return False
            elif premise is None or _digest(premise) != value:
                return False
        elif what != "cudart" or cuda_premise.loaded_cudart() != value:
            return False
    return True


def needed(art: Artifact, tools: Sequence[str]) -> bool:
    """Whether a record of this lookup stands on GPU facts: its key's arch flags or its requirements."""
    return bool(TOOLS.intersection(tools) or FACTS & {r.name for r in art.requirements})


def taken(cache: Cache, art: Artifact, out: list[Witness]) -> str | None:
    """The field, its witnesses appended to out; or why no record may stand for it (a text
    starting with "no: ")."""
    from ..env import amd_probe
    from ..values.archs import NO_GPU

    kfd = os.environ.get("ABICACHE_KFD_TOPOLOGY") or amd_probe.DEFAULT
    try:
        os.lstat(kfd)
        return "no: AMD GPUs' topology is present (their facts are judged by a full lookup)"
    except FileNotFoundError:
        out.append(("a", kfd, (0, 0, 0, 0)))
    facts = cache.facts
    premise = cuda_premise.seen()
    if premise is None:
        if facts.get("gpu.arch") != NO_GPU or facts.get("cuda.driver") is not None or cuda_premise.driver_loads():
            return "no: the driver is asked in each process here (no kernel module to read)"
        parts = ["gpu=none"]
    else:
        why = _remembered(facts, premise, out)
        if why is not None:
            return why
        parts = [f"gpu={_digest(premise)}"]
    if "cuda.runtime" in {r.name for r in art.requirements}:
        loaded = cuda_premise.loaded_cudart()
        if loaded is None or loaded != facts.get("cuda.runtime"):
            return "no: cuda.runtime was not read from the CUDA runtime this process has loaded"
        parts.append(f"cudart={loaded}")
    return ";".join(parts)


def _remembered(facts: Facts, premise: tuple[object, ...], out: list[Witness]) -> str | None:
    """The driver's answer as the memo holds it for this premise: the lookup's facts, and the
    memo file, which must not move while it is read."""
    import json

    from ..env import toolid

    memo_dir = facts.memo_dir
    found = toolid.remembered_on_disk(premise, cuda_premise.REMEMBERED, memo_dir)
    if found is None:
        return "no: no memo of the driver's answer under this premise"
    memo, value = found
    before = os.lstat(memo)
    try:
        answer = json.loads(value)
    except ValueError:
        return "no: a memo of the driver's answer that does not read"
    if answer != [facts.get("cuda.driver"), facts.get("gpu.arch")]:
        return "no: the lookup's GPU facts are not the driver's remembered answer"
    after = os.lstat(memo)
    held = (after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns)
    if held != (before.st_ino, before.st_size, before.st_mtime_ns, before.st_ctime_ns):
        return "no: the driver's memo changed while it was read"
    out.append(("l", os.fspath(memo), held))
    return None


def _digest(premise: tuple[object, ...]) -> str:
    return sha256_hex(repr(premise).encode("utf-8", "surrogateescape"))
