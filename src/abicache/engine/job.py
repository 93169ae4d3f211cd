"""What the engine builds: one output from a source tree (a plain value,
made on every lookup, so it imports nothing heavy)."""

from __future__ import annotations

from ..values.records import named_tuple
from .tree import Tree


@named_tuple
class CudaUnits:
    """.cu units compile with nvcc to objects; the job's compiler links them."""

    nvcc: tuple[str, ...]
    flags: tuple[str, ...]  # for the command line
    key_flags: tuple[str, ...]  # as they go into the object's key
    tree_flags: bool = True  # the tree's flags follow (False: flags already hold what nvcc gets of them)


@named_tuple
class Embedding:
    """Binary blobs linked into the output as data (tvm-ffi's embed_cubin): the
    units' objects are merged (ld -r), then `command` adds each blob in turn
    (--input-obj, --output-obj, --cubin FILE, --name NAME), then the result is
    linked. The blobs' bytes go into the key."""

    command: tuple[str, ...]
    blobs: tuple[tuple[str, bytes], ...]  # (name, bytes), sorted by name


@named_tuple
class Job:
    """One output built from a tree."""

    what: str  # "library add", for messages
    compiler: tuple[str, ...]  # the compiler command, e.g. ("c++",)
    tool: str  # the fact that identifies it, e.g. "compiler.cxx"
    lang: str
    tree: Tree
    cflags: tuple[str, ...]  # compile flags (the tree's include flags are added)
    key_cflags: tuple[str, ...]  # the same as they go into keys
    link: tuple[str, ...]  # flags that make the output, before the inputs ("-shared")
    ldflags: tuple[str, ...]  # after the inputs
    output: str  # file name written into the output folder
    covered: tuple[str, ...] = ()  # the frontend's covered roots (torch, CUDA, Python includes)
    cuda: CudaUnits | None = None  # how .cu units compile (torch extensions with CUDA sources)
    verbose: bool = False  # print every compiler command
    embed: Embedding | None = None  # blobs linked in as data
    c_compiler: tuple[str, ...] = ()  # for .c units of a C++ job, as a compiler driver takes them ($CC)
    steer: tuple[tuple[str, str], ...] = ()  # what the key holds of the commands and environment (steer.key_extra)

    def unit_lang(self, name: str) -> str:
        """A unit's language as a compiler driver decides it, by its extension:
        a .c unit of a job that lets extensions decide (c_compiler set) is C."""
        return "c" if self.c_compiler and name.endswith(".c") else self.lang
