"""The native front (front.c), built once per store with the C compiler, as the observer is:
`<root>/v3/tools/launch-<digest>/abicache-launch`, the digest of its source and of what is
compiled into it (abicache's version, the interpreter and the folder abicache is imported
from, which a miss runs). `abicache launcher` builds it and prints its path, for
CMAKE_CXX_COMPILER_LAUNCHER and CC="... gcc".

bench/launcher_floor.py measured the choice: Python's own start-up is 1.7x ccache's whole
hit; a native program that stats a record's witnesses and copies the object is 0.4x.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import __version__

SOURCE = Path(__file__).with_name("front.c")
PROGRAM = "abicache-launch"
#: the folder of links named after compilers, each the front (PATH="$(abicache launcher --links):$PATH")
LINKS = "bin"
COMPILERS = ("cc", "c++", "gcc", "g++", "clang", "clang++", "nvcc")
#: the folder abicache is imported from (the miss runs `python -c "... from abicache.cli import main"`)
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def config_header() -> bytes:
    """What is compiled into the front: the version its names hold, the interpreter and the
    folder a miss runs abicache with."""
    defines = {"ABICACHE_VERSION": __version__, "ABICACHE_PYTHON": sys.executable,
               "ABICACHE_PATH": repr(PACKAGE_PARENT)}
    return b"".join(b"#define %s %s\n" % (k.encode(), _c_string(os.fsencode(v))) for k, v in defines.items())


def _c_string(data: bytes) -> bytes:
    return b'"' + b"".join(b"\\%03o" % c if c < 32 or c > 126 or c in b'"\\?' else bytes([c]) for c in data) + b'"'


def path(tools: Path, compiler: str = "cc") -> tuple[Path | None, str]:
    """(the front, built where it is not yet; None and why where it cannot be)."""
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return None, "the native front is built on Linux only; the launcher runs in Python"
    if not sys.executable:
        return None, "no interpreter path to run misses with"
    header = config_header()
    source = SOURCE.read_bytes()
    folder = tools / f"launch-{hashlib.sha256(header + source).hexdigest()[:16]}"
    program = folder / PROGRAM
    if _ours(program):
        return program, ""
    return _build(source, header, folder, compiler)


def _ours(program: Path) -> bool:
    """A regular file of this user no one else may write, in a folder likewise."""
    try:
        for st in (os.lstat(program), os.lstat(program.parent)):
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                return False
        return stat.S_ISREG(os.lstat(program).st_mode)
    except OSError:
        return False


def _build(source: bytes, header: bytes, folder: Path, compiler: str) -> tuple[Path | None, str]:
    os.makedirs(folder.parent, mode=0o755, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="launch-", dir=folder.parent) as work:
        (Path(work) / "front.c").write_bytes(source)
        (Path(work) / "config.h").write_bytes(header)
        out = Path(work) / PROGRAM
        try:
            done = subprocess.run([compiler, "-O2", "-include", str(Path(work) / "config.h"), "-o", str(out),
                                   str(Path(work) / "front.c")], capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"compiling {SOURCE.name} with {compiler} failed ({exc})"
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            return None, f"compiling {SOURCE.name} with {compiler} failed ({said[-1] if said else done.returncode})"
        staged = Path(work) / "ready"
        staged.mkdir(mode=0o755)
        os.chmod(staged, 0o755)  # whatever the umask
        os.chmod(out, 0o555)
        os.replace(out, staged / PROGRAM)
        (staged / LINKS).mkdir(mode=0o755)
        os.chmod(staged / LINKS, 0o755)
        for name in COMPILERS:  # a link named after a compiler is that compiler's launcher (masquerading)
            os.symlink(f"../{PROGRAM}", staged / LINKS / name)
        try:
            os.rename(staged, folder)  # atomic: another process may have won, with the same bytes
        except OSError:
            if not _ours(folder / PROGRAM):
                return None, f"it could not be put in place at {folder}"
    return folder / PROGRAM, ""
