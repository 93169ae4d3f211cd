"""Watching a build: every file its tools read or looked for and did not
find, the environment variables they read and the programs that ran.

Dependency files list the headers the preprocessor found, and nothing else:
not the specs, response files, `.incbin` data, archives and linker scripts
the driver, assembler and linker read, nor the headers that were looked for
first and not found (a header that would shadow the one used, a
`__has_include` probe). observe.c, preloaded into the compiler driver and
every tool it runs, reports all of it (at about 0-4% of a compile's time,
measured when it was written). It is compiled once per store with the C compiler (tools/observe-*),
and used wherever it loads.

A trace is whole only if every process of the build reported: each process
is named by the one that starts it (an exec, a spawn) and names itself when it
starts, and the command's own program says it was started by abicache. A
process the observer cannot enter (statically linked, setuid, a wrapper that
clears LD_PRELOAD) is an exec with no start after it: the trace is incomplete
(Observed.unobserved names it), and the engine does not cache what it built.
"""

from __future__ import annotations

import hashlib
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

SOURCE = Path(__file__).with_name("observe.c")
LIBRARY = "libabicache_observe.so"
AUDITOR = "libabicache_observe_audit.so"  # the same source, built as the loader's auditor (LD_AUDIT)
FD_VARIABLE = "ABICACHE_TRACE_FD"
PARENT_VARIABLE = "ABICACHE_TRACE_PARENT"  # parent_value(): the command's own program reports it


class Observed(NamedTuple):
    """What the processes of one command did (absolute paths, as they named them)."""

    read: frozenset[str]  # opened for reading
    found: frozenset[str]  # found by stat or access
    missing: frozenset[str]  # looked for, not there
    env: frozenset[str]  # variables read
    programs: frozenset[str]  # the programs that ran (and reported)
    unobserved: frozenset[str] = frozenset()  # programs that ran and did not report, as they were named
    rooted: bool = False  # the command's own program reported
    listed: frozenset[str] = frozenset()  # folders listed (a tool that picks among what a folder holds)
    written: frozenset[str] = frozenset()  # created, written, removed or renamed by the build
    commands: frozenset[str] = frozenset()  # command strings given to a shell (sh -c, system, popen)

    @property
    def complete(self) -> bool:
        """Whether every process of the command reported: its own program, and every one
        that a process of it started."""
        return self.rooted and not self.unobserved


#: the command's own program, where it never reported (named so in Observed.unobserved)
COMMAND = "the command's own program"


def parse(data: bytes) -> Observed:
    sets: dict[str, set[str]] = {k: set() for k in "rsmexUlwc"}
    pending: dict[bytes, bytes] = {}  # pid -> the program it is about to exec
    spawned: dict[bytes, bytes] = {}  # pid -> the program it was spawned to run
    started: set[bytes] = set()  # pids that reported a start
    rooted = False
    for record in data.split(b"\0"):
        if len(record) < 2:
            continue
        kind = chr(record[0])
        if kind in "xXFSR":
            pid, _, path = record[1:].partition(b":")
            if kind == "x":
                started.add(pid)
                execd = pending.pop(pid, None)
                sets["x"].add(os.fsdecode(path))  # where the program is (links resolved) ...
                if execd and execd.startswith(b"/"):
                    sets["x"].add(os.fsdecode(execd))  # ... and where it was found: a link retargeted moves it
            elif kind == "X":
                pending[pid] = path
            elif kind == "F":
                pending.pop(pid, None)
            elif kind == "S":
                spawned[pid] = path
            else:
                rooted = True
        elif kind in sets:
            sets[kind].add(os.fsdecode(record[1:]))
    # a spawned process may report before its parent names it: matched over the whole trace
    lost = [*pending.values(), *(path for pid, path in spawned.items() if pid not in started)]
    sets["x"].update(os.fsdecode(path) for pid, path in spawned.items() if pid in started and path.startswith(b"/"))
    unobserved = frozenset({os.fsdecode(p) for p in lost} | sets["U"] | (set() if rooted else {COMMAND}))
    return Observed(*(frozenset(sets[k]) for k in "rsmex"), unobserved, rooted,
                    *(frozenset(sets[k]) for k in "lwc"))


class Session(NamedTuple):
    """One command watched: what to add to its environment, the descriptor it
    inherits, and the file the records land in."""

    env: Mapping[str, str]
    fds: tuple[int, ...]
    log: Path

    def result(self, command: Sequence[str] = (), cwd: str = "") -> Observed:
        """What the command did. command (and the folder it ran in): its own program, which
        abicache started, is checked here as the observer checks every later one by its exec;
        one the observer cannot enter makes the trace incomplete, whatever it ran after."""
        try:
            seen = parse(self.log.read_bytes())
        except OSError:
            seen = Observed(frozenset(), frozenset(), frozenset(), frozenset(), frozenset(), frozenset({COMMAND}))
        if not command:
            return seen
        why = unobservable(command[0], cwd)
        if why:
            return seen._replace(unobserved=seen.unobserved | {why})
        at = _found(command[0], cwd)  # the command's program where it was found, links and all
        if at and seen.rooted:
            seen = seen._replace(programs=seen.programs | {at})
        strings = "\n".join(seen.commands).encode(errors="surrogateescape")
        return seen._replace(env=seen.env | script_variables(seen.programs) | named_variables(strings))


#: what a script reads at most, looking for the variables it names
SCRIPT_BYTES = 1 << 20


def script_variables(programs: Iterable[str]) -> frozenset[str]:
    """The variables the scripts among programs name: a shell or an interpreter reads its
    environment whole at its start (no getenv to see), so a wrapper that picks a compiler or
    a flag from a variable is steered by every variable it names (named_variables)."""
    names: set[str] = set()
    for path in programs:
        try:
            with open(path, "rb") as f:
                text = f.read(SCRIPT_BYTES) if f.read(2) == b"#!" else b""  # a compiler's MBs: 2 bytes read
        except OSError:
            continue
        names |= named_variables(text)
    return frozenset(names)


def named_variables(text: bytes) -> frozenset[str]:
    """`$NAME`, `${NAME...}`, `environ["NAME"]`, `environ.get("NAME")`, `getenv("NAME")` and
    `$ENV{NAME}` in a script or a shell's command string. A name the script sets itself is
    named too (unset, mostly): a needless input, never a missed one."""
    import re

    pattern = re.compile(rb"""\$\{?([A-Za-z_][A-Za-z0-9_]*)|"""
                         rb"""(?:environ(?:\.get)?\s*[\[(]\s*|getenv\s*\(\s*|\$ENV\{\s*)["']?([A-Za-z_][A-Za-z0-9_]*)""")
    return frozenset(os.fsdecode(a or b) for a, b in pattern.findall(text))


def _found(program: str, cwd: str) -> str | None:
    """Where a command's program is found (PATH, or the folder it runs in), not resolved."""
    import shutil

    path = program if "/" in program else shutil.which(program)
    if path is None:
        return None  # not found: the command fails, and says so
    return os.path.join(cwd, path) if cwd and not os.path.isabs(path) else path


def unobservable(program: str, cwd: str = "") -> str | None:
    """The program as it would run, named with why the preload cannot enter it (statically
    linked, setuid or setgid, file capabilities: the loader's secure mode), or None. A script
    is judged by its interpreter."""
    path = _found(program, cwd)
    if path is None:
        return None
    for _ in range(4):  # a script's interpreter, and its interpreter (env, then the real one)
        try:
            st = os.stat(path)
            with open(path, "rb") as f:
                head = f.read(4096)
        except OSError:
            return None
        if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            return f"{path} (setuid or setgid)"
        if _has_capabilities(path):
            return f"{path} (file capabilities)"
        if head.startswith(b"#!"):
            words = head[2:].split(b"\n", 1)[0].split()
            if not words:
                return None
            path = os.fsdecode(words[0])
            continue
        return f"{path} (statically linked)" if _static_elf(path, head) else None
    return None


def _has_capabilities(path: str) -> bool:
    try:
        return bool(os.getxattr(path, "security.capability"))
    except OSError:
        return False


def _static_elf(path: str, head: bytes) -> bool:
    """An ELF executable without a program interpreter (PT_INTERP): the loader never runs, nor
    LD_PRELOAD. Read from its program headers (the first 4 KiB, where linkers put them)."""
    import struct

    if head[:4] != b"\x7fELF" or len(head) < 64:
        return False
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    if wide:
        phoff, = struct.unpack_from(order + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 54)
    else:
        phoff, = struct.unpack_from(order + "I", head, 28)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 42)
    if phoff + phentsize * phnum > len(head):
        try:
            with open(path, "rb") as f:
                f.seek(phoff)
                table = f.read(phentsize * phnum)
        except OSError:
            return False
        phoff = 0
    else:
        table = head
    try:
        types = [struct.unpack_from(order + "I", table, phoff + i * phentsize)[0] for i in range(phnum)]
    except struct.error:
        return False  # cut short: not a program the loader runs either
    return 3 not in types  # PT_INTERP


def parent_value() -> str:
    """ABICACHE_TRACE_PARENT: this process's pid and, on Linux, its start time (/proc/self/stat's
    22nd field, clock ticks since boot): a command orphaned as it started dies where its builder
    is gone (observe.c start), and a pid alone may name another process by then (pids are
    reused: 32768 of them where pid_max is the default)."""
    global _parent
    pid = os.getpid()
    if _parent[0] != pid:  # the first command, or a forked child's: its own
        try:
            text = Path("/proc/self/stat").read_bytes()
            _parent = (pid, f"{pid}:{int(text[text.rindex(b')') + 2:].split()[19])}")
        except (OSError, ValueError, IndexError):
            _parent = (pid, str(pid))
    return _parent[1]


_parent: tuple[int, str] = (0, "")


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
        auditor = library.with_name(library.name.replace(LIBRARY, AUDITOR))
        audit = ":".join(p for p in (str(auditor), os.environ.get("LD_AUDIT", "")) if p)  # the loader's own reads
        yield Session({"LD_PRELOAD": preload, "LD_AUDIT": audit, FD_VARIABLE: str(fd),
                       PARENT_VARIABLE: parent_value(), "TMPDIR": str(tmp)}, (fd,), log)
    finally:
        os.close(fd)


#: per process: tools folder -> the library, or None where it cannot be had, and why not
_built: dict[str, Path | None] = {}
_why_not: dict[str, str] = {}
#: LD_PRELOAD splits its list at these: a library whose path holds one cannot be preloaded from there
_SPLITS = (" ", ":")


def library(tools: Path, compiler: Sequence[str] = ("cc",),
            trusted: Callable[[os.stat_result], bool] | None = None) -> Path | None:
    """The observer library of this store, compiled on first use with the C
    compiler; None where it cannot be built or loaded, or where it or its
    folder could have been written by another user (trusted: the store's
    owner and mode check): it runs in every compiler process. Without it the
    engine falls back to depfiles, and says so once (never silently)."""
    from ..settings import config

    if os.name != "posix" or not config.flag("ABICACHE_OBSERVE"):
        return None
    source = SOURCE.read_bytes()
    folder = tools / f"observe-{hashlib.sha256(source).hexdigest()[:16]}"
    known = _built.get(str(folder), ...)
    if known is not ...:
        return known  # type: ignore[return-value]
    found, why = _find(source, folder, compiler, trusted)
    if found is None and _runnable(compiler[0]):  # no compiler at all: the build's own error says so, once
        import warnings

        from ..errors import AbicacheWarning

        warnings.warn(f"abicache: the observer (observe.c) cannot run here: {why}. Only dependency files are "
                      "recorded, and a build without one is not cached (ABICACHE_OBSERVE=0 says this is meant).",
                      AbicacheWarning, stacklevel=3)
    _built[str(folder)], _why_not[str(folder)] = found, why
    return found


def _runnable(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None


def status(tools: Path, compiler: Sequence[str] = ("cc",),
           trusted: Callable[[os.stat_result], bool] | None = None) -> str:
    """For `abicache env` and `doctor`: "on (<path>)", or off and why."""
    from ..settings import config

    if os.name != "posix":
        return "off: not a POSIX system"
    if not config.flag("ABICACHE_OBSERVE"):
        return "off: ABICACHE_OBSERVE=0"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = library(tools, compiler, trusted)
    folder = tools / f"observe-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]}"
    return f"on ({found})" if found is not None else f"off: {_why_not.get(str(folder), 'unknown')}"


def _find(source: bytes, folder: Path, compiler: Sequence[str],
          trusted: Callable[[os.stat_result], bool] | None) -> tuple[Path | None, str]:
    target = folder / LIBRARY
    if not (target.is_file() and (folder / AUDITOR).is_file()):
        made, why = _compile(source, folder, compiler)
        if made is None:
            return None, why
        target = made
    if trusted is not None:
        _close(folder, trusted)
        if not (_owned(target, trusted) and _owned(folder / AUDITOR, trusted)):
            return None, (f"{target} (or its folder) could have been written by another user, so it is not "
                          "preloaded into compilers; remove that folder")
    return _preloadable(target)


def _close(folder: Path, trusted: Callable[[os.stat_result], bool]) -> None:
    """A folder of ours that an older abicache left group-writable (made under umask 002,
    then refused for ever): closed, as the store's own folders are repaired."""
    try:
        st = os.lstat(folder)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not trusted(st):
            os.chmod(folder, 0o755)
    except OSError:
        pass


def _owned(path: Path, trusted: Callable[[os.stat_result], bool]) -> bool:
    try:
        return all(trusted(os.lstat(p)) for p in (path, path.parent))
    except OSError:
        return False


def _preloadable(target: Path) -> tuple[Path | None, str]:
    """target, or where its path holds a character LD_PRELOAD splits at (a store under a
    folder with a space or a colon), a private copy at a path without one."""
    if not any(c in os.fsdecode(target) for c in _SPLITS):
        return target, ""
    digest = hashlib.sha256(target.read_bytes()).hexdigest()[:16]
    tried = []
    for base in _private_bases():
        private = base / f"abicache-observe-{os.geteuid()}"
        copy = _private_copy(target, private, f"{digest}-{LIBRARY}")
        auditor = _private_copy(target.with_name(AUDITOR), private, f"{digest}-{AUDITOR}")
        if copy is not None and auditor is not None and _loads(copy):
            return copy, ""
        tried.append(str(base))
    return None, (f"its path {target} holds a space or a colon, at which LD_PRELOAD splits, and no private copy "
                  f"could be made and loaded in {', '.join(tried) or 'any folder'}")


def _private_bases() -> list[Path]:
    bases = [os.environ.get("XDG_RUNTIME_DIR", ""), "/tmp", "/var/tmp", "/dev/shm"]
    return [Path(b) for b in bases if os.path.isabs(b) and not any(c in b for c in _SPLITS)]


def _private_copy(target: Path, folder: Path, name: str) -> Path | None:
    """target copied to folder/name, the folder ours alone (made 0700, or checked: a folder
    of that name made by another user in /tmp is never used)."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        copy = folder / name
        if not copy.is_file():
            temp = folder / f".{name}.{os.getpid()}"
            temp.write_bytes(target.read_bytes())
            os.chmod(temp, 0o500)
            os.replace(temp, copy)
        return copy
    except OSError:
        return None


def _compile(source: bytes, folder: Path, compiler: Sequence[str]) -> tuple[Path | None, str]:
    import subprocess
    import tempfile

    os.makedirs(folder.parent, mode=0o755, exist_ok=True)  # never group-writable, whatever the umask
    with tempfile.TemporaryDirectory(prefix="observe-", dir=folder.parent) as work:
        src = Path(work) / "observe.c"
        src.write_bytes(source)
        out, auditor = Path(work) / LIBRARY, Path(work) / AUDITOR
        for target, defines in ((out, []), (auditor, ["-DABICACHE_LOADER_AUDIT"])):
            try:
                done = subprocess.run([*compiler, "-shared", "-fPIC", "-O2", *defines, "-o", str(target), str(src),
                                       "-ldl"], capture_output=True, timeout=120, env=_plain_env())
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, f"compiling it with {' '.join(compiler)} failed ({exc})"
            if done.returncode != 0:
                said = done.stderr.decode(errors="replace").strip().splitlines()
                return None, f"compiling it with {' '.join(compiler)} failed ({said[-1] if said else done.returncode})"
        if not _loads(out):
            loaded, why = _preloadable(out)  # a store path LD_PRELOAD cannot carry: try it from a copy
            if loaded is None or not _loads(loaded):
                return None, why or "it compiled, but does not load or report when preloaded here"
        staged = Path(work) / "ready"
        staged.mkdir(mode=0o700)
        os.chmod(staged, 0o755)  # whatever the umask: a group-writable folder is refused (and stays)
        for built in (out, auditor):
            os.chmod(built, 0o555)
            os.replace(built, staged / built.name)
        try:
            os.rename(staged, folder)  # atomic: another process may have won, with the same bytes
        except OSError:
            if not ((folder / LIBRARY).is_file() and (folder / AUDITOR).is_file()):
                return None, f"it could not be put in place at {folder}"
    return folder / LIBRARY, ""


def _plain_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("LD_AUDIT", None)
    return env


def _loads(path: Path) -> bool:
    """Whether a program runs with it preloaded (and its auditor beside it, LD_AUDIT) and it
    reports: this machine's loader accepts both (a refused auditor is a warning on every
    compile's stderr), and it finds its file descriptor."""
    import subprocess

    probe = path.with_name("probe.log")
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    auditor = path.with_name(path.name.replace(LIBRARY, AUDITOR))
    try:
        env = {**_plain_env(), "LD_PRELOAD": str(path), "LD_AUDIT": str(auditor), FD_VARIABLE: str(fd)}
        done = subprocess.run(["/bin/sh", "-c", ":"], env=env, pass_fds=(fd,), capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        os.close(fd)
    seen = parse(probe.read_bytes())
    return bool(seen.programs) and bool(seen.read) and not done.stderr
