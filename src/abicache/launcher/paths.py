"""Where a compile ran, made location-free: the base folder (ABICACHE_BASE_DIR, as
ccache's base_dir) and what of the working directory a key must hold.

Two clones of a project at different places share hits when every path a compile is
given is relative. Build systems give absolute ones (CMake names every source and include
folder by its full path), so with a base folder set, each word that names a path under it
is rewritten relative to the working directory before the compiler runs — as ccache does:
the compiler then reads the same files, and writes relative paths into `__FILE__`, its
messages and its dependency file, the same in every clone. Paths outside the base folder
are left as written (and the key holds them).

The files a compile read are recorded relative to the working directory where they were
named so (engine/record.py keeps '..'), so a hit in another clone checks that clone's
files. The working directory itself enters the key only where the output embeds it: debug
information (DW_AT_comp_dir), unless a prefix map the command gives rewrites it.
"""

from __future__ import annotations

import os

from ..engine.roots import under

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence

#: options whose value, joined to them or as the next word, is a path (gcc, clang, nvcc)
PATH_OPTIONS = ("-I", "-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-MF", "-o", "-L", "-B",
                "-isysroot", "--sysroot=", "--include-path=", "--system-include=", "--pre-include=",
                "--output-file=", "--dependency-output=", "-Wp,-MD,", "-Wp,-MMD,")
#: those of PATH_OPTIONS that take the next word when nothing is joined
_SEPARATE = frozenset({"-I", "-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-MF", "-o", "-L", "-B",
                       "-isysroot", "--sysroot", "--include-path", "--system-include", "--pre-include",
                       "--output-file", "--dependency-output"})
#: options that map a path prefix in what the compiler writes (OLD=NEW)
PREFIX_MAPS = ("-ffile-prefix-map=", "-fdebug-prefix-map=", "-fmacro-prefix-map=")


def base_folder(value: str) -> str | None:
    """The base folder a setting names: absolute and normal, or None (unset, or '/': everything
    would be relative, and a file of the system would be named by '../../usr')."""
    value = value.strip()
    if not value or not os.path.isabs(value):
        return None
    folder = os.path.normpath(value)
    return None if folder == "/" else folder


def relative(words: Sequence[str], cwd: str, base: str | None) -> list[str]:
    """words with every path under base written relative to cwd (cwd itself under base);
    as written where there is no base or cwd is outside it."""
    if base is None or not under(cwd, [base]):
        return list(words)
    out: list[str] = []
    following = False  # this word is the value of the option before it
    for word in words:
        if following:
            out.append(_rel(word, cwd, base))
            following = False
        elif word in _SEPARATE:
            out.append(word)
            following = True
        elif word.startswith("/"):
            out.append(_rel(word, cwd, base))
        else:
            option = next((o for o in PATH_OPTIONS if word.startswith(o) and len(word) > len(o)), None)
            out.append(option + _rel(word[len(option):], cwd, base) if option else word)
    return out


def key_words(words: Sequence[str], cwd: str, base: str | None) -> list[str]:
    """words as the key holds them: a prefix map's folder under base relative to cwd, as the
    other paths are (the command keeps it absolute: gcc matches it against the absolute
    folders it writes, and what it writes then holds the new prefix, not the folder)."""
    if base is None or not under(cwd, [base]):
        return list(words)
    out = []
    for word in words:
        option = next((o for o in PREFIX_MAPS if word.startswith(o)), None)
        if option is not None:
            old, equals, new = word[len(option):].partition("=")
            word = option + _rel(old, cwd, base) + equals + new
        out.append(word)
    return out


def key_folder(words: Sequence[str], cwd: str) -> str:
    """What of the working directory the output holds: '' where nothing (no debug
    information), else the folder as debug information names it after the command's
    prefix maps (the last matching one wins, as in gcc)."""
    if not _debug_info(words):
        return ""
    mapped = cwd
    for word in words:
        option = next((o for o in PREFIX_MAPS[:2] if word.startswith(o)), None)
        if option is None:
            continue
        old, _, new = word[len(option):].partition("=")
        old = old.rstrip("/") or "/"
        if cwd == old or cwd.startswith(old + "/"):
            mapped = new + cwd[len(old):]
    return mapped


def _debug_info(words: Sequence[str]) -> bool:
    """-g in any form but -g0 (the last one wins), as gcc reads it."""
    level = False
    for word in words:
        if word.startswith("-g") and not word.startswith(("-gno-", "-gsplit-dwarf", "-gz", "-gcolumn-info",
                                                            "-gstrict-dwarf", "-grecord-gcc-switches")):
            level = word != "-g0"
    return level


def _rel(path: str, cwd: str, base: str) -> str:
    """path relative to cwd where it is under base. A '..' is resolved through the links it
    meets, so it is never collapsed on the string: the part before the first one is made
    relative and the rest kept (CMake writes `-I<source>/ggml/src/../include`), where the
    string leads under base at all."""
    if not path.startswith("/") or not under(os.path.normpath(path), [base]):
        return path
    cut = (path + "/").find("/../")
    head, tail = (path, "") if cut < 0 else (path[:cut], path[cut:])
    normal = os.path.normpath(head)
    if not under(normal, [base]):
        return path
    rel = os.path.relpath(normal, cwd)
    if tail:
        return rel + tail
    return rel + "/" if path.endswith("/") and rel != "." else rel

