"""Watching a build: every file its tools read or looked for and did not
find, the environment variables they read and the programs that ran.

Dependency files list the headers the preprocessor found, and nothing else:
not the specs, response files, `.incbin` data, archives and linker scripts
the driver, assembler and linker read, nor the headers that were looked for
first and not found (a header that would shadow the one used, a
`__has_include` probe). observe.c, preloaded into the compiler driver and
every tool it runs, reports all of it (../shared notes: about 0-4% of a
compile). It is compiled once per store with the C compiler (tools/observe-*),
and used wherever it loads: a tool that it cannot reach (a static binary)
leaves only its depfile, which the engine records as before.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping, NamedTuple, Sequence

SOURCE = Path(__file__).with_name("observe.c")
LIBRARY = "libabicache_observe.so"
FD_VARIABLE = "ABICACHE_TRACE_FD"


class Observed(NamedTuple):
    """What the processes of one command did (absolute paths, as they named them)."""

    read: frozenset[str]  # opened for reading
    found: frozenset[str]  # found by stat or access
    missing: frozenset[str]  # looked for, not there
    env: frozenset[str]  # variables read
    programs: frozenset[str]  # the programs that ran

    @property
    def complete(self) -> bool:
        """Whether the command's own program reported (the library loaded there)."""
        return bool(self.programs)


def parse(data: bytes) -> Observed:
    sets: dict[str, set[str]] = {k: set() for k in "rsmex"}
    for record in data.split(b"\0"):
        if len(record) > 1:
            kind = chr(record[0])
            if kind in sets:
                sets[kind].add(os.fsdecode(record[1:]))
    return Observed(*(frozenset(sets[k]) for k in "rsmex"))


class Session(NamedTuple):
    """One command watched: what to add to its environment, the descriptor it
    inherits, and the file the records land in."""

    env: Mapping[str, str]
    fds: tuple[int, ...]
    log: Path

    def result(self) -> Observed:
        try:
            return parse(self.log.read_bytes())
        except OSError:
            return Observed(frozenset(), frozenset(), frozenset(), frozenset(), frozenset())


@contextmanager
def watching(library: Path | None, scratch: str) -> Iterator[Session | None]:
    """A Session for one command (None without the library). The command's
    temporary files go to a folder inside scratch, so they are not inputs."""
    if library is None:
        yield None
        return
    folder = Path(scratch)
    log = folder / f"observed-{os.getpid()}-{os.urandom(6).hex()}"
    tmp = folder / "tmp"
    tmp.mkdir(exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        preload = " ".join(p for p in (str(library), os.environ.get("LD_PRELOAD", "")) if p)
        yield Session({"LD_PRELOAD": preload, FD_VARIABLE: str(fd), "TMPDIR": str(tmp)}, (fd,), log)
    finally:
        os.close(fd)


#: per process: tools folder -> the library, or None where it cannot be built
_built: dict[str, Path | None] = {}


def library(tools: Path, compiler: Sequence[str] = ("cc",),
            trusted: Callable[[os.stat_result], bool] | None = None) -> Path | None:
    """The observer library of this store, compiled on first use with the C
    compiler; None where it cannot be built or loaded, or where it or its
    folder could have been written by another user (trusted: the store's
    owner and mode check): it runs in every compiler process. Without it the
    engine falls back to depfiles."""
    from .. import config

    if os.name != "posix" or not config.flag("ABICACHE_OBSERVE"):
        return None
    source = SOURCE.read_bytes()
    folder = tools / f"observe-{hashlib.sha256(source).hexdigest()[:16]}"
    known = _built.get(str(folder), ...)
    if known is not ...:
        return known  # type: ignore[return-value]
    target = folder / LIBRARY
    found = target if target.is_file() else _compile(source, folder, compiler)
    if found is not None and trusted is not None and not _owned(found, trusted):
        import warnings

        from ..errors import AbicacheWarning

        warnings.warn(f"abicache: {found} (or its folder) could have been written by another user; it is not "
                      "preloaded into compilers, and only dependency files are recorded. Remove that folder.",
                      AbicacheWarning, stacklevel=3)
        found = None
    _built[str(folder)] = found
    return found


def _owned(path: Path, trusted: Callable[[os.stat_result], bool]) -> bool:
    try:
        return all(trusted(os.lstat(p)) for p in (path, path.parent))
    except OSError:
        return False


def _compile(source: bytes, folder: Path, compiler: Sequence[str]) -> Path | None:
    import subprocess
    import tempfile

    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="observe-", dir=folder.parent) as work:
        src = Path(work) / "observe.c"
        src.write_bytes(source)
        out = Path(work) / LIBRARY
        try:
            done = subprocess.run([*compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(src), "-ldl"],
                                  capture_output=True, timeout=120, env=_plain_env())
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0 or not _loads(out):
            return None
        os.chmod(out, 0o555)
        staged = Path(work) / "ready"
        staged.mkdir()
        os.replace(out, staged / LIBRARY)
        try:
            os.rename(staged, folder)  # atomic: another process may have won, with the same bytes
        except OSError:
            if not (folder / LIBRARY).is_file():
                return None
    return folder / LIBRARY


def _plain_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


def _loads(path: Path) -> bool:
    """Whether a program runs with it preloaded and it reports (this machine's
    loader accepts it, and it finds its file descriptor)."""
    import subprocess

    probe = path.with_name("probe.log")
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        env = {**_plain_env(), "LD_PRELOAD": str(path), FD_VARIABLE: str(fd)}
        subprocess.run(["/bin/sh", "-c", ":"], env=env, pass_fds=(fd,), capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        os.close(fd)
    return parse(probe.read_bytes()).complete
