"""A precompiled torch/extension.h, kept as a cached entry shared by every
extension of one torch build (kind "torch.pch").

gcc looks for `X.gch` beside each candidate `X` as it searches the include
path, and uses it when the command line matches the one that made it (else
it quietly reads the header: -Winvalid-pch says so). So the entry holds
torch/extension.h.gch, and extensions compile with `-I<entry>` ahead of
torch's folders. Its key: the compile flags (but TORCH_EXTENSION_NAME, which
the header does not use), the compiler and the torch build. A copy of the
header sits beside the .gch: gcc uses a PCH for the first #include only, and
looks for the header itself beside the .gch for any later one.

Measured here (bench/build.py): the PCH takes ~40 s to make (one extension
takes ~17 s) and is ~0.8 GB; with it an extension takes ~6.4 s, so it pays
from the second extension on. Like torch, abicache makes it only when asked
(use_pch=True).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..core.key import Inputs
from .job import Job

if TYPE_CHECKING:
    from ..core.cache import Cache

HEADER = "torch/extension.h"


def torch_extension(cache: Cache, job: Job, torch_include: Path, python_abi: str,
                    run: Callable[[list[str], Path, str], None]) -> str:
    """The folder to put first on the include path (built once per torch build and flags)."""
    from .units import objects_of

    def keep(flag: str) -> bool:
        return not flag.startswith("-DTORCH_EXTENSION_NAME=")

    flags = [f for f in (*job.cflags, *job.tree.flags) if keep(f)]
    key_flags = [f for f in (*job.key_cflags, *job.tree.key_flags) if keep(f)]
    inputs = Inputs.make({}, flags=["-x", "c++-header", *key_flags], tools=["compiler.cxx", "torch.build"],
                         extra={"header": HEADER, "python.abi": python_abi})

    def build(out: Path) -> None:
        target = out / (HEADER + ".gch")
        target.parent.mkdir(parents=True)
        run([*job.compiler, "-x", "c++-header", str(torch_include / HEADER), "-o", str(target), *flags],
            out, f"precompiled {HEADER}")
        # A second #include of the header (gcc uses a PCH once) reads the file beside
        # the .gch: a copy, whose own includes go through the search path as usual.
        (out / HEADER).write_bytes((torch_include / HEADER).read_bytes())

    art = objects_of(cache).get_or_build("torch.pch", HEADER, inputs, build)
    return str(art.path)
