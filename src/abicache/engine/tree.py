"""Where the sources of a build live, and how they are named in keys.

Sources come in three forms: a str is code (named after the artifact:
add.cpp, then add_1.cpp, ..., so the compiler's messages name it), a mapping is
{file name: code} (headers included), and a path is a file on disk. Inline
sources are written to a scratch folder at build time; files are compiled
where they are, so `#include "sibling.h"` and relative -I work exactly as
with the compiler run by hand in this process's working directory.

Keys never hold a path. A file source is named relative to the folder that
holds all file sources (base "src"); an absolute include folder becomes a
placeholder in the key's flags (base "incN", "{incN}") while the command line
keeps the real path; a relative one stays as written (relative to the
working directory, base "cwd"). The files a compiler reads under a base are
recorded against it, so two checkouts of one project at different paths
share one entry when the bytes are the same.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from collections.abc import Mapping


from ..errors import AbicacheError
from ..values.records import named_tuple
from ..store.manifest import Dependency
from . import roots

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Callable, Sequence, Union

    Source = Union[str, "os.PathLike[str]", Mapping[str, str]]

COMPILED = (".c", ".cc", ".cpp", ".cxx", ".c++", ".cu")
_INCLUDE_FLAGS = ("--include-path=", "-I", "-isystem", "-iquote", "-idirafter")


@named_tuple
class File:
    name: str  # location-free name: the key's, and the object's
    code: str
    path: str | None  # where it lives; None for inline code (written to scratch at build time)

    @property
    def compiled(self) -> bool:
        return self.name.endswith(COMPILED)


@named_tuple
class Tree:
    files: tuple[File, ...]
    bases: Mapping[str, str]  # base name -> absolute folder
    flags: tuple[str, ...]  # include flags for the command line (real paths)
    key_flags: tuple[str, ...]  # the same flags as they go into keys

    @property
    def units(self) -> tuple[File, ...]:
        return tuple(f for f in self.files if f.compiled)

    def key_sources(self) -> dict[str, str]:
        return {f.name: f.code for f in self.files}

    def inline(self) -> tuple[File, ...]:
        return tuple(f for f in self.files if f.path is None)

    def place(self, scratch: Path) -> dict[str, str]:
        """Write inline files into scratch; unit name -> the path to compile."""
        for f in self.inline():
            target = scratch / f.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.code.encode("utf-8", "surrogateescape"))
        return {f.name: f.path or str(scratch / f.name) for f in self.units}


def make(sources: Sequence[Source] | Source, ext: str, include_flags: Sequence[str] = (),
         compiled: tuple[str, ...] = COMPILED, label: str = "source") -> Tree:
    """Read file sources, name everything, and find the bases (label: the artifact's
    name, which names its inline code)."""
    # Cheap checks first: the first isinstance() against an ABC such as Mapping
    # costs a tenth of a millisecond per type, and this runs on every lookup.
    if type(sources) not in (list, tuple) and isinstance(sources, (str, os.PathLike, Mapping)):
        sources = [sources]
    files: list[File] = []
    paths: list[str] = []
    cwd = os.getcwd()
    stem = _stem(label)
    for i, item in enumerate(sources):
        if isinstance(item, str):
            files.append(File(f"{stem}{f'_{i}' if i else ''}{ext}", item, None))
        elif hasattr(item, "__fspath__"):
            paths.append(roots.normal(os.fspath(item), cwd))
        elif isinstance(item, Mapping):
            files += [File(_inline_name(k), str(v), None) for k, v in item.items()]
        else:
            raise AbicacheError(f"source {i} is a {type(item).__name__}; pass str code, a Path or a dict")
    bases: dict[str, str] = {"cwd": cwd}
    if paths:
        top = os.path.commonpath([os.path.dirname(p) for p in paths])
        bases["src"] = top
        files += [File(_inside(p, top), read_source(p), p) for p in paths]
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise AbicacheError(f"two sources share a name: {sorted(n for n in names if names.count(n) > 1)}")
    if not any(n.endswith(compiled) for n in names):
        raise AbicacheError(f"no source to compile ({', '.join(compiled)}) among " + ", ".join(names))
    flags, key_flags = include_bases(include_flags, bases)
    return Tree(tuple(files), bases, flags, key_flags)


def _stem(label: str) -> str:
    """A file name for inline code from the artifact's name: the characters a
    shell and a compiler take as they are, the rest '_'."""
    stem = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in label[:64]).strip(".")
    return stem or "source"


def _inline_name(name: object) -> str:
    """A {name: code} source's name: a relative path that stays in the scratch
    folder it is written to (an absolute one or '..' would write elsewhere)."""
    text = str(name)
    parts = text.split("/")
    if not text or text.startswith("/") or "\0" in text or any(p in ("", ".", "..") for p in parts):
        raise AbicacheError(f"source name {text!r} must be a relative path such as 'kernels/add.cpp' "
                            "(no leading '/', no empty, '.' or '..' parts): it is written into a scratch folder")
    return text


def _inside(path: str, top: str) -> str:
    """os.path.relpath for a normal path below top, without its cost (a lookup runs this per source)."""
    prefix = top if top.endswith("/") else top + "/"
    return path[len(prefix):] if path.startswith(prefix) else os.path.relpath(path, top)


def read_source(path: str) -> str:
    """A source file's bytes as text: UTF-8, with any other byte kept as a
    lone surrogate (surrogateescape), and line ends as they are. The key
    hashes exactly the bytes the compiler reads, whatever the locale; a
    Latin-1 comment is no error (gcc takes it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise AbicacheError(f"cannot read source file {path}: {exc.strerror}") from None
    try:
        chunks = [os.read(fd, os.fstat(fd).st_size + 1)]  # one read for a file that does not grow
        while chunks[-1]:
            chunks.append(os.read(fd, 1 << 20))
    except OSError as exc:
        raise AbicacheError(f"cannot read source file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def include_bases(flags: Sequence[str], bases: dict[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(command-line flags, key flags); every include folder becomes a base."""
    out, key = [], []
    items = list(flags)
    i = 0
    while i < len(items):
        flag = items[i].strip()
        i += 1
        option = next((o for o in _INCLUDE_FLAGS if flag.startswith(o)), None)
        if option is None:
            out.append(flag)
            key.append(flag)
            continue
        folder = flag[len(option):]
        if not folder and i < len(items):  # "-I dir" as two words
            folder = items[i].strip()
            i += 1
        name = f"inc{sum(1 for b in bases if b.startswith('inc'))}"
        bases[name] = roots.normal(folder)
        out.append(option + folder)
        key.append(option + ("{" + name + "}" if os.path.isabs(folder) else folder))
    return tuple(out), tuple(key)


def prefix_maps(bases: Mapping[str, str], scratch: str | None) -> list[str]:
    """Make __FILE__ and debug info independent of where things are: each base
    (and the scratch folder) is mapped to its name; the longest last, as gcc
    applies the last match."""
    pairs = sorted(((path, name) for name, path in bases.items()), key=lambda p: len(p[0]))
    if scratch:
        pairs.append((scratch, "inline"))
    return [f"-ffile-prefix-map={path}={'.' if name == 'cwd' else name}" for path, name in pairs]


def every_file(bases: Mapping[str, str], names: Sequence[str], limit: int = 20_000) -> list[Dependency]:
    """Every file under the named bases: the dependencies of a compiler that
    cannot say what it read (NVRTC), so a change anywhere there is a miss."""
    from ..store import blobs

    out = []
    for name in names:
        for folder, dirs, files in os.walk(bases[name]):
            dirs.sort()
            for file in sorted(files):
                path = os.path.join(folder, file)
                if not os.path.isfile(path):
                    continue
                if len(out) >= limit:
                    raise AbicacheError(f"include folder {bases[name]} holds over {limit} files; "
                                        "point NVRTC at the headers it needs")
                sha, _ = blobs.hash_file(Path(path))
                out.append(Dependency(name, os.path.relpath(path, bases[name]), sha))
    return out


def locate(path: str, bases: Mapping[str, str]) -> tuple[str, str]:
    """(base, path relative to it) by the longest base that holds path; ("abs", path) if none does."""
    best = None
    for name, root in bases.items():
        if roots.under(path, [root]) and (best is None or len(root) > len(bases[best])):
            best = name
    if best is None:
        return "abs", path
    return best, _inside(path, bases[best])


def dependency(path: str, bases: Mapping[str, str]) -> Dependency:
    from ..store import blobs

    base, rel = _located(path, tuple(bases.items()))
    return Dependency(base, rel, _sha256(path, blobs.hash_file))


@functools.lru_cache(maxsize=1 << 16)
def _located(path: str, bases: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """locate, remembered: the units of a tree record the same headers under the same bases."""
    return locate(path, dict(bases))


#: (path, inode, size, mtime, ctime) -> sha256 of the headers hashed in this process: the
#: units of a tree read the same headers (8 units x 200 headers hashed 200 times, not 1,600)
_hashed: dict[tuple[str, int, int, int, int], str] = {}


def _sha256(path: str, hash_file: Callable[[Path], tuple[str, int]]) -> str:
    """A file's sha256, remembered under its stat witness: any write changes the
    ctime, so a header edited since (even with size and mtime restored) is hashed again."""
    st = os.stat(path)
    witness = (path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    sha = _hashed.get(witness)
    if sha is None:
        sha, _ = hash_file(Path(path))
        if os.stat(path).st_ctime_ns == st.st_ctime_ns:  # not written while we read it
            if len(_hashed) > 100_000:
                _hashed.clear()
            _hashed[witness] = sha
            from ..store import deps

            deps.learn(path, witness[1:], sha)
    return sha
