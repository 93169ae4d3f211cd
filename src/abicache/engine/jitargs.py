"""How JIT entry points (cpp_extension's, tvm-ffi's) read their build arguments,
shared by the torch and tvm-ffi frontends: lenient flags, nvcc's targets, the
CUDA runtime on the link line, and a copy of the output where the caller asked."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..env.toolid import shell_words
from ..errors import UsageError

if TYPE_CHECKING:
    from ..core.cache import Artifact
    from ..env import Facts


def listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return [value] if isinstance(value, (str, os.PathLike)) else list(value)


#: gcc's, clang's and nvcc's options whose value is the next argument ("-I", "DIR")
SEPARATE = frozenset({
    "-I", "-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-isysroot", "-D", "-U", "-L", "-l", "-o",
    "-x", "-MF", "-MT", "-MQ", "-T", "-u", "-z", "-Xlinker", "-Xassembler", "-Xpreprocessor", "-Xclang",
    "-Xcompiler", "-Xptxas", "-Xnvlink", "-Xarchive", "-ccbin", "--compiler-bindir", "-gencode", "--generate-code",
    "-arch", "--gpu-architecture", "-code", "--gpu-code", "--compiler-options", "--linker-options",
    "--ptxas-options", "--nvlink-options", "--options-file", "-maxrregcount", "--maxrregcount", "-t", "--threads",
})


def lenient(flags: Any) -> tuple[str, ...]:
    """Flags as cpp_extension takes them, each stripped: an element that is a list of options
    is split as the shell that runs ninja's command splits it ("-O2\\n", " -g ", "-O3 -g",
    "-I dir"); any other element is one argument, as the compiler takes it, space and all
    (["-I", "/path/sp ace"], "-DNAME=a b", "-I/path/sp ace"), where torch's shell would break it."""
    out: list[str] = []
    for flag in listed(flags):
        text, words = str(flag), shell_words(str(flag))
        whole = text.strip(SHELL_BLANKS)
        if len(words) > 1 and (out and out[-1] in SEPARATE or not _options(words)):
            out.append(whole)  # one argument: the value of the option before it, or a path or define with a space
        else:
            out.extend(words)
    return tuple(out)


SHELL_BLANKS = " \t\r\n"  # what shlex splits at and strips


def _options(words: Sequence[str]) -> bool:
    """Whether each word is an option or the value of the option before it ("-I dir")."""
    return all(w.startswith("-") or (i > 0 and words[i - 1] in SEPARATE) for i, w in enumerate(words))


#: TORCH_CUDA_ARCH_LIST's names for architectures, as cpp_extension reads them
_NAMED_ARCHS = {
    "Kepler+Tesla": "3.7", "Kepler": "3.5+PTX", "Maxwell+Tegra": "5.3", "Maxwell": "5.0;5.2+PTX",
    "Pascal": "6.0;6.1+PTX", "Volta+Tegra": "7.2", "Volta": "7.0+PTX", "Turing": "7.5+PTX",
    "Ampere+Tegra": "8.7", "Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX", "Hopper": "9.0+PTX",
    "Blackwell+Tegra": "11.0", "Blackwell": "10.0;10.3;12.0;12.1+PTX",
}


def cuda_arch_flags(facts: Facts, given: Sequence[str] = ()) -> list[str]:
    """nvcc's targets as cpp_extension picks them: none where the caller's nvcc
    flags name an arch already (any flag with 'arch' in it); else
    $TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX", "native" for the GPUs present), else the
    GPUs present, each as SASS, plus PTX of the newest (so a newer GPU can JIT it);
    with neither, nvcc's own default. The flags are in the key, and the audit turns
    the result into `gpu.arch ~= ...`."""
    if any("arch" in flag for flag in given if "TORCH_EXTENSION_NAME" not in flag):
        return []
    listed = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(",", ";").replace(" ", ";")
    listed = "" if listed == "native" else listed
    archs = [n for a in listed.split(";") if a for n in _NAMED_ARCHS.get(a, a).split(";")]
    if not archs:
        present = sorted({d.split("_")[1] for d in (facts.get("gpu.arch") or "").split(",") if "_" in d})
        archs = [f"{d[:-1]}.{d[-1]}" for d in present]
        if archs:
            archs[-1] += "+PTX"
    flags = []
    for arch in archs:
        match = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", arch.strip())
        if match is None:
            raise UsageError(f"TORCH_CUDA_ARCH_LIST: {arch!r} is not an arch like 9.0, 9.0a or 9.0+PTX")
        num = f"{match.group(1)}{match.group(2)}{match.group(3)}"
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if match.group(4):
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def cudart_link(libs: Sequence[str]) -> list[str]:
    """libs for the link line: -lcudart names the runtime found first in the
    documented search order (env/cuda_probe.py), by its soname where the folder
    has no unversioned libcudart.so (the CUDA wheels ship none)."""
    if "-lcudart" not in libs:
        return list(libs)
    from ..env import cuda_probe

    for folder in cuda_probe.runtime_dirs():
        try:  # a listing, not a glob: this runs in every fresh process that loads a CUDA extension
            names = os.listdir(folder)
        except OSError:
            continue
        sonames = sorted(n for n in names if n.startswith("libcudart.so.") and n[13:].isdigit() and n[13:].isascii())
        plain = "libcudart.so" in names and os.path.exists(os.path.join(folder, "libcudart.so"))
        if plain or sonames:
            name = "-lcudart" if plain else f"-l:{sonames[-1]}"
            return [f"-L{folder}", *(name if lib == "-lcudart" else lib for lib in libs)]
    return list(libs)


def keep_copy(build_directory: Any, art: Artifact, sources: Mapping[str, str]) -> None:
    """build_directory: a copy of the output (and of the inline sources, with
    keep_intermediates) where the caller asked, as cpp_extension leaves them.
    What runs is always the checked file in the store."""
    if build_directory is None:
        return
    import shutil

    folder = Path(build_directory)
    folder.mkdir(parents=True, exist_ok=True)
    for name, code in sources.items():
        (folder / name).write_text(code)
    for name in art.files:
        target = folder / Path(name).name
        target.unlink(missing_ok=True)
        shutil.copy2(art.path / name, target)
