"""What a compiler command line asks for, as a launcher in front of the compiler sees it
(`abicache g++ -c x.cpp -o x.o`, `CMAKE_CXX_COMPILER_LAUNCHER=abicache`): one compile it
may cache (a `Compile`: the compiler, the source, every file the flags make it write) or
a command it runs unchanged (an `Uncacheable`, with the reason `abicache stats` counts).

Pure: it reads nothing but the words and the environment given. Like ccache, it caches a
compile of one source to an object (or, for nvcc, to a PTX, cubin or fatbin) and nothing
else: a link, `-E`, several sources, a response file, an option that writes an output it
cannot name, a compiler it does not know. Where a word is not understood, the command is
run as written, never guessed at: a wrong guess would keep the wrong file.

The outputs are named as the compiler names them (gcc's manual, "Options Controlling the
Kind of Output" and "Options Controlling the Preprocessor"; nvcc's "File and Path
Specifications"), and tests/test_launcher_command.py runs the real compiler to check each
name it predicts.
"""

from __future__ import annotations

import os

from ..values.records import named_tuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Sequence

#: a source's language by its extension (gcc's -x names; nvcc compiles .cu)
LANGUAGES = {
    ".c": "c", ".i": "cpp-output",
    ".cc": "c++", ".cp": "c++", ".cxx": "c++", ".cpp": "c++", ".CPP": "c++", ".c++": "c++", ".C": "c++",
    ".ii": "c++-cpp-output",
    ".s": "assembler", ".S": "assembler-with-cpp", ".sx": "assembler-with-cpp",
    ".cu": "cuda",
}
#: gcc and clang options whose value is the next word (when not joined to the option)
_GCC_VALUE = frozenset({
    "-o", "-x", "-MF", "-MT", "-MQ", "-I", "-D", "-U", "-include", "-imacros", "-isystem", "-iquote",
    "-idirafter", "-iprefix", "-iwithprefix", "-iwithprefixbefore", "-isysroot", "--sysroot", "-imultilib",
    "-Xpreprocessor", "-Xassembler", "-Xclang", "-target", "--target", "-arch", "--param", "-aux-info",
    "-L", "-l", "-Xlinker", "-T", "-u", "-z", "-e", "-B", "-G", "-A", "-wrapper", "-specs", "--specs",
    "-include-pch", "-ivfsoverlay", "-resource-dir", "-gcc-toolchain", "--gcc-toolchain", "-mllvm",
})
#: gcc and clang options (each a prefix of the words it refuses) that make the compiler
#: write files the launcher cannot name, or read inputs by names it does not see
_GCC_REFUSED = {
    "-save-temps": "-save-temps", "--save-temps": "-save-temps", "-fdump-": "-fdump-*",
    "-fcallgraph-info": "-fcallgraph-info", "-aux-info": "-aux-info", "-ftime-report": "-ftime-report",
    "-fopt-info": "-fopt-info", "-MJ": "-MJ (a compilation database)",
    "-fprofile-generate": "profile instrumentation", "-fprofile-instr-generate": "profile instrumentation",
    "-fprofile-use": "profile feedback", "-fprofile-instr-use": "profile feedback",
    "-fprofile-sample-use": "profile feedback", "-fauto-profile": "profile feedback",
    "-fbranch-probabilities": "profile feedback",
    "-fmodules": "C++ modules", "-fmodule-": "C++ modules", "-gmodules": "C++ modules",
    "-fpch-preprocess": "precompiled headers",
}
#: nvcc options whose value is the next word (when not joined by '=')
_NVCC_VALUE = frozenset({
    "-o", "--output-file", "-x", "--x", "-I", "--include-path", "-isystem", "--system-include", "-D",
    "--define-macro", "-U", "--undefine-macro", "-include", "--pre-include", "-L", "--library-path", "-l",
    "--library", "-ccbin", "--compiler-bindir", "-arch", "--gpu-architecture", "-code", "--gpu-code",
    "-gencode", "--generate-code", "-Xcompiler", "--compiler-options", "-Xlinker", "--linker-options",
    "-Xptxas", "--ptxas-options", "-Xnvlink", "--nvlink-options", "-Xarchive", "--archive-options",
    "-Xfatbin", "--fatbin-options", "-MF", "--dependency-output", "-MT", "--dependency-target-name",
    "-maxrregcount", "--maxrregcount", "-t", "--threads", "-std", "--std", "-rdc",
    "--relocatable-device-code", "-default-stream", "--default-stream", "-diag-suppress", "--diag-suppress",
    "-split-compile", "--split-compile", "-Werror", "--Werror", "-ftz", "--ftz", "-prec-div", "--prec-div",
    "-prec-sqrt", "--prec-sqrt", "-fmad", "--fmad", "-Xcudafe", "--cudafe-options", "-odir",
    "--output-directory", "-ldir", "--libdevice-directory",
})
#: nvcc modes: the option, what it writes, its default suffix
_NVCC_MODES = {"-c": ".o", "--compile": ".o", "-dc": ".o", "--device-c": ".o", "-dw": ".o", "--device-w": ".o",
               "-ptx": ".ptx", "--ptx": ".ptx", "-cubin": ".cubin", "--cubin": ".cubin",
               "-fatbin": ".fatbin", "--fatbin": ".fatbin", "-optix-ir": ".optixir", "--optix-ir": ".optixir"}
_NVCC_UNCACHEABLE = {
    "-E": "preprocessing only (-E)", "--preprocess": "preprocessing only (-E)", "-M": "dependencies only (-M)",
    "--generate-dependencies": "dependencies only (-M)", "-MM": "dependencies only (-M)",
    "-keep": "--keep", "--keep": "--keep", "-save-temps": "--keep", "--save-temps": "--keep",
    "-dlink": "link", "--device-link": "link", "-lib": "link", "--lib": "link", "-link": "link", "--link": "link",
    "-run": "link", "--run": "link", "-cuda": "preprocessing only (-E)", "--cuda": "preprocessing only (-E)",
    "-dryrun": "--dryrun", "--dryrun": "--dryrun", "-lto": "link-time optimization", "-dlto": "link-time optimization",
    "--list-gpu-code": "a query", "--list-gpu-arch": "a query", "-V": "a query", "--version": "a query",
    "--help": "a query", "-h": "a query", "-time": "--time (a timing file)", "--time": "--time (a timing file)",
}
#: variables that make gcc write a dependency file by a name the command line does not show
DEPENDENCY_VARIABLES = ("DEPENDENCIES_OUTPUT", "SUNPRO_DEPENDENCIES")


@named_tuple
class Depfile:
    """The dependency file a compile is asked to write (-MD or -MMD)."""

    path: str  # as the compiler names it (-MF, or from the output)
    targets: tuple[str, ...]  # -MT/-MQ words in order (('-MT', 'x.o'), flattened as given); () = the output
    system: bool  # -MD (system headers listed) rather than -MMD
    phony: bool  # -MP


class _DepWords:
    """The dependency-file words met so far on a command line."""

    __slots__ = ("system", "path", "targets", "phony")

    def __init__(self) -> None:
        self.system: bool | None = None  # None: neither -MD nor -MMD (then -MF, -MT are flags only)
        self.path: str | None = None
        self.targets: list[str] = []
        self.phony = False


@named_tuple
class Compile:
    """One compile the launcher may cache."""

    compiler: tuple[str, ...]  # the compiler command as written (its first word, for now)
    family: str  # "gcc" (gcc, clang and their names) or "nvcc"
    source: str  # as written
    language: str  # -x's, or the source's extension's
    output: str  # as written, or the compiler's default
    flags: tuple[str, ...]  # every other word, in order, except the source and '-o OUTPUT'
    depfile: Depfile | None
    extra: tuple[str, ...]  # other files the flags make it write: .dwo, .gcno, .su

    @property
    def outputs(self) -> tuple[str, ...]:
        """Every file the compile writes, the output first."""
        return (self.output, *self.extra, *([self.depfile.path] if self.depfile else []))


@named_tuple
class Uncacheable:
    """A command run as written; reason: what `abicache stats` counts it under."""

    reason: str


def family(word: str) -> str | None:
    """'gcc' for gcc, g++, cc, c++, clang, clang++ (any target prefix or version suffix:
    x86_64-linux-gnu-g++-12, clang-17), 'nvcc' for nvcc; None for anything else."""
    name = os.path.basename(word)
    if name == "nvcc":
        return "nvcc"
    stem = name.rstrip("0123456789.").rstrip("-") if name[-1:].isdigit() else name
    for known in ("clang++", "clang", "g++", "gcc", "c++", "cc"):
        if stem == known or stem.endswith("-" + known):
            return "gcc"
    return None


def classify(argv: Sequence[str], environ: Mapping[str, str] = {}) -> Compile | Uncacheable:
    """What argv (the compiler and its arguments, as the build system gave them) asks for."""
    if not argv:
        return Uncacheable("no compiler named")
    kind = family(argv[0])
    if kind is None:
        return Uncacheable("unknown compiler")
    if any(environ.get(name) for name in DEPENDENCY_VARIABLES):  # nvcc's host compiler reads them too
        return Uncacheable("DEPENDENCIES_OUTPUT set")  # gcc writes a depfile the words do not name
    return (_gcc if kind == "gcc" else _nvcc)(tuple(argv[:1]), list(argv[1:]))


def _gcc(compiler: tuple[str, ...], words: list[str]) -> Compile | Uncacheable:
    flags: list[str] = []
    sources: list[tuple[str, str]] = []
    output: str | None = None
    language: str | None = None  # -x's, for the sources after it
    compile_only = False
    dep = _DepWords()
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("@"):
            return Uncacheable("response file")
        reason = _gcc_refused(word) if word.startswith("-") else None
        if reason:
            return Uncacheable(reason)
        value = words[i + 1] if word in _GCC_VALUE and i + 1 < len(words) else None
        if word in _GCC_VALUE and value is None:
            return Uncacheable(f"{word} without its value")
        step = 2 if value is not None else 1
        if word == "-":
            return Uncacheable("source from standard input")
        if word.startswith("-o"):
            output = value if value is not None else word[2:]
            if output == "-":
                return Uncacheable("output to standard output")
        elif word == "-c":
            compile_only = True
            flags.append(word)
        elif word.startswith("-x"):
            language = value if value is not None else word[2:]
            language = None if language == "none" else language
            flags.extend(words[i:i + step])
        elif word in ("-MD", "-MMD"):
            dep.system = word == "-MD"
            flags.append(word)
        elif word.startswith(("-Wp,-MD,", "-Wp,-MMD,")):
            dep.system, dep.path = word.startswith("-Wp,-MD,"), word.split(",", 2)[2]
            flags.append(word)
        elif word.startswith("-MF"):
            dep.path = value if value is not None else word[3:]
            flags.extend(words[i:i + step])  # the key holds the name as given; a hit writes it there
        elif word.startswith(("-MT", "-MQ")):
            dep.targets += [word[:3], value if value is not None else word[3:]]
            flags.extend(words[i:i + step])
        elif word == "-MP":
            dep.phony = True
            flags.append(word)
        elif word in ("-M", "-MM"):
            return Uncacheable("dependencies only (-M)")
        elif word in ("-E", "-S"):
            return Uncacheable("preprocessing only (-E)" if word == "-E" else "assembly output (-S)")
        elif word.startswith("-") or value is not None:
            flags.extend(words[i:i + step])
        else:
            sources.append((word, language or _language(word)))
        i += step
    if not compile_only:
        return Uncacheable("link")
    return _compile_of(compiler, "gcc", sources, output, flags, dep, ".o")


def _gcc_refused(word: str) -> str | None:
    return next((reason for prefix, reason in _GCC_REFUSED.items() if word.startswith(prefix)), None)


def _nvcc(compiler: tuple[str, ...], words: list[str]) -> Compile | Uncacheable:
    flags: list[str] = []
    sources: list[tuple[str, str]] = []
    output: str | None = None
    language: str | None = None
    suffix: str | None = None
    dep = _DepWords()
    i = 0
    while i < len(words):
        word = words[i]
        name, joined, joined_value = word.partition("=")
        if word.startswith("@") or name in ("--options-file", "-optf"):
            return Uncacheable("response file")
        if name in _NVCC_UNCACHEABLE:
            return Uncacheable(_NVCC_UNCACHEABLE[name])
        takes = name in _NVCC_VALUE and not joined
        value = words[i + 1] if takes and i + 1 < len(words) else None
        if takes and value is None:
            return Uncacheable(f"{word} without its value")
        given = value if value is not None else joined_value
        step = 2 if value is not None else 1
        if name in ("-o", "--output-file"):
            output = given
        elif name in _NVCC_MODES:
            if suffix is not None and suffix != _NVCC_MODES[name]:
                return Uncacheable("several output kinds")
            suffix = _NVCC_MODES[name]
            flags.append(word)
        elif name in ("-x", "--x"):
            language = "cuda" if given == "cu" else given
            flags.extend(words[i:i + step])
        elif name in ("-MD", "--generate-dependencies-with-compile", "-MMD", "--generate-nonsystem-dependencies-with-compile"):
            dep.system = name in ("-MD", "--generate-dependencies-with-compile")
            flags.append(word)
        elif name in ("-MF", "--dependency-output"):
            dep.path = given
            flags.extend(words[i:i + step])
        elif name in ("-MT", "--dependency-target-name"):
            dep.targets += ["-MT", given]
            flags.extend(words[i:i + step])
        elif name in ("-odir", "--output-directory"):
            return Uncacheable("--output-directory")  # moves the depfile's default: not named here yet
        elif word.startswith("-") or value is not None:
            flags.extend(words[i:i + step])
        else:
            sources.append((word, language or _language(word)))
        i += step
    if suffix is None:
        return Uncacheable("link")
    return _compile_of(compiler, "nvcc", sources, output, flags, dep, suffix)


def _compile_of(compiler: tuple[str, ...], kind: str, sources: list[tuple[str, str]], output: str | None,
                flags: list[str], dep: _DepWords, suffix: str) -> Compile | Uncacheable:
    if not sources:
        return Uncacheable("no source")
    if len(sources) > 1:
        return Uncacheable("several sources")
    source, language = sources[0]
    if language == "unknown":
        return Uncacheable("not a source (linker input with -c)")
    if output is None:  # the compiler's default: the source's base name, its suffix replaced, here
        output = _replace_suffix(os.path.basename(source), suffix)
    depfile = None
    if dep.system is not None:  # -MF or -MT without -MD/-MMD write nothing: they are flags like any other
        path = dep.path or (_replace_suffix(output, ".d") if kind == "gcc" else None)
        if not path:
            return Uncacheable("-MD without -MF")  # nvcc's default name is not the one gcc's rule gives
        depfile = Depfile(path, tuple(dep.targets), dep.system, dep.phony)
    extra = tuple(_extra_outputs(kind, flags, output))
    return Compile(compiler, kind, source, language, output, tuple(flags), depfile, extra)


def _extra_outputs(kind: str, flags: Sequence[str], output: str) -> list[str]:
    """Files beside the output that the flags ask gcc to write, named after the output."""
    if kind != "gcc":
        return []
    extra = []
    if any(f == "-gsplit-dwarf" or f.startswith("-gsplit-dwarf=") for f in flags) and "-gno-split-dwarf" not in flags:
        extra.append(_replace_suffix(output, ".dwo"))
    if any(f in ("--coverage", "-ftest-coverage") for f in flags):
        extra.append(_replace_suffix(output, ".gcno"))
    if "-fstack-usage" in flags:
        extra.append(_replace_suffix(output, ".su"))
    return extra


def _language(source: str) -> str:
    return LANGUAGES.get(os.path.splitext(source)[1], "unknown")


def _replace_suffix(path: str, suffix: str) -> str:
    head, tail = os.path.split(path)
    stem, dot, _ = tail.rpartition(".")
    return os.path.join(head, (stem if dot and stem else tail) + suffix)
