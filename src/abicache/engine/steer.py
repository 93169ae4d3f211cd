"""What steers a build besides its sources and flags: one definition, used by
the keys, the recorded dependencies and every in-process memo alike.

- The compiler command: every word of $CC/$CXX. A wrapper (ccache, sccache,
  distcc, icecc) runs the compiler named after it, whose identity is the one
  that counts; the words after the compiler are flags like any other.
- The compiler's environment: the variables the compilers abicache drives
  document as changing what they do (ENVIRONMENT below) go into the key with
  their values when set. Any other variable a tool was seen reading (the
  observer, observe.c) is recorded with the entry and compared on every
  lookup, except those known to change nothing in the output (HARMLESS).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Sequence

__all__ = ["ENVIRONMENT", "HARMLESS", "compiler_flags", "environment", "fingerprint",
           "for_cxx", "key_extra", "recorded_env"]

#: documented to steer gcc/g++/clang (preprocessor search lists, libraries, the
#: driver's own command line), GNU ld and as, nvcc, and torch's CUDA builds
ENVIRONMENT = (
    "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "OBJCPLUS_INCLUDE_PATH",
    "LIBRARY_PATH", "LPATH", "GCC_EXEC_PREFIX", "COMPILER_PATH", "SOURCE_DATE_EPOCH", "GCC_COMPARE_DEBUG",
    "CCC_OVERRIDE_OPTIONS", "LD_RUN_PATH", "GNUTARGET", "LDEMULATION",
    "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CUDAHOSTCXX",
    # nvcc.profile appends its own to these ("INCLUDES += ..."): set in the environment, they steer nvcc
    "INCLUDES", "SYSTEM_INCLUDES", "LIBRARIES",
    # GNU getopt (ld, as, every binutils tool): options after the first file are taken for files
    "POSIXLY_CORRECT",
)
#: steer nvcc only: not in the key of a build that runs no nvcc (no needless rebuild)
NVCC_ONLY = frozenset({"NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CUDAHOSTCXX", "INCLUDES",
                       "SYSTEM_INCLUDES", "LIBRARIES"})
#: read by frontends to make flags (TORCH_CUDA_ARCH_LIST -> nvcc's -gencode, in the key
#: as flags): in-process memos must see them change, keys see their effect
FLAG_SOURCES = ("TORCH_CUDA_ARCH_LIST", "CC", "PYTORCH_NVCC")

#: read by the tools without changing their output: temporary folders, the
#: terminal and diagnostics, the driver's messages to its own children, make's
#: job server, and the working directory (mapped away by -ffile-prefix-map).
#: Not here, though each looked harmless once: POSIXLY_CORRECT (binutils' option
#: parsing), and nvcc.profile's INCLUDES and LIBRARIES (a value set in the
#: environment is added to nvcc's search paths: measured, tests/test_fidelity.py).
HARMLESS = frozenset({
    "TMPDIR", "TMP", "TEMP", "TERM", "COLUMNS", "LINES", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PWD",
    "COLLECT_GCC", "COLLECT_GCC_OPTIONS", "COLLECT_LTO_WRAPPER", "COLLECT_NO_DEMANGLE", "COLLECT_VERBOSE",
    "GCC_COLORS", "GCC_URLS", "TERM_URLS", "GCC_EXTRA_DIAGNOSTIC_OUTPUT", "LIBCTF_DEBUG",
    "DEPENDENCIES_OUTPUT", "SUNPRO_DEPENDENCIES", "CC_PRINT_OPTIONS", "CC_PRINT_HEADERS", "CC_LOG_DIAGNOSTICS",
    "LD_PRELOAD", "ABICACHE_TRACE_FD", "PATH", "HOME", "USER", "LOGNAME", "SHELL",
    "LANGUAGE", "LC_MESSAGES", "NO_COLOR", "CLICOLOR", "CLICOLOR_FORCE",
    # nvcc sets these itself, from nvcc.profile, for the tools it runs (TOP with "=", which overrides)
    "_HERE_", "_THERE_", "_TARGET_SIZE_", "_TARGET_DIR_", "TOP", "CUDAFE_FLAGS_INTERNAL",
})

def __getattr__(name: str) -> Any:
    """command and compiler_at (env/toolid.py), resolved at first use: the roots' memo
    (engine/roots.py) reads fingerprint() without them."""
    if name in ("command", "compiler_at"):
        from ..env import toolid

        return getattr(toolid, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def environment() -> tuple[tuple[str, str], ...]:
    """(name, value) of each steering variable that is set: part of the key."""
    return tuple((name, os.environ[name]) for name in ENVIRONMENT if name in os.environ)


#: variables asked for -> their keys as os.environ stores them
_encoded: dict[tuple[str, ...], tuple[Any, ...]] = {}


def fingerprint(*variables: str) -> tuple[Any, ...]:
    """A cheap picture of these variables and of every steering one, for
    in-process memos (never looser than the key), read from os.environ's own
    table (os.environ.get costs 100 ns a name). The frontends' memo compares the
    whole table instead (hits/__init__.py _load_once): one comparison, where this cost 2.7 us."""
    keys = _encoded.get(variables)
    if keys is None:
        names = (*variables, *ENVIRONMENT, *FLAG_SOURCES)
        keys = _encoded[variables] = tuple(map(os.environ.encodekey, names))  # type: ignore[attr-defined]
    return tuple(map(os.environ._data.get, keys))  # type: ignore[attr-defined]


def compiler_flags(words: Sequence[str]) -> tuple[str, ...]:
    """The words after the compiler: flags, for the key."""
    from ..env.toolid import compiler_at

    return tuple(words[compiler_at(words) + 1:])


#: what an engine-built entry records of its build (engine/record.py). Entries made
#: before the observer recorded neither missing paths nor system headers: a new key,
#: so they are never taken for what a fresh build would make.
RECORD = "observed-1"


def key_extra(*commands: tuple[str, Sequence[str]], cuda: bool = True) -> dict[str, str]:
    """What the key holds of the compiler commands and the environment, beyond
    the tools' identities: the scheme of the entry's record (RECORD), the
    words after each compiler, and each steering variable that is set;
    nvcc's variables only where nvcc runs."""
    out = {"record": RECORD}
    out.update({f"{name}.words": " ".join(compiler_flags(words)) for name, words in commands if compiler_flags(words)})
    out.update({f"env.{name}": value for name, value in environment() if cuda or name not in NVCC_ONLY})
    return out


def for_cxx(cuda: bool = False) -> tuple[tuple[str, str], ...]:
    """key_extra of a C++ job driven by $CXX (the torch and tvm-ffi frontends), as Job.steer holds it."""
    from ..env.toolid import command

    return tuple(sorted(key_extra(("cxx", command("CXX", "c++")), cuda=cuda).items()))


def recorded_env(names: frozenset[str] | set[str]) -> list[str]:
    """The variables a build was seen reading that its entry must record."""
    return sorted(n for n in names if n not in HARMLESS and not n.startswith("ABICACHE_"))
