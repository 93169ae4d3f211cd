"""Tool identities, computed by one subprocess and memoized on disk.

The memo is keyed by the binary's (path, size, mtime, inode): an upgraded
compiler changes at least one of them, so its identity is re-read once.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ..values.digest import sha256_hex

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Callable, Sequence

_memo: dict[tuple[str, str], tuple[tuple[Any, ...], str]] = {}


#: programs that run the compiler named after them, and do not change its output
WRAPPERS = frozenset({"ccache", "sccache", "distcc", "icecc", "buildcache", "colorgcc"})


def command(variable: str, default: str) -> tuple[str, ...]:
    """$CC or $CXX as words (as make and the shell split them), or the default."""
    text = os.environ.get(variable, "")
    try:
        words = tuple(shell_words(text))
    except ValueError:  # an unbalanced quote: as the words the shell would refuse, keep them whole
        words = tuple(text.split())
    return words or (default,)


_BLANKS = str.maketrans("\t\r\n", "   ")  # shlex's whitespace, as spaces


def shell_words(text: str) -> list[str]:
    """shlex.split(text); without quotes or backslashes (the common case) its words are
    the runs between shlex's whitespace, found without importing shlex (0.3 ms a process)."""
    if any(c in text for c in "'\"\\"):
        import shlex

        return shlex.split(text)
    return [word for word in text.translate(_BLANKS).split(" ") if word]


def compiler_at(words: Sequence[str]) -> int:
    """The index of the compiler in a command: past any wrappers (and a
    wrapper's own options), the word that names the compiler."""
    i = 0
    while i < len(words) - 1 and os.path.basename(words[i]) in WRAPPERS:
        i += 1
        while i < len(words) - 1 and words[i].startswith("-"):
            i += 1
    return i


def which(command: str) -> Path | None:
    """Like shutil.which, with plain string paths: it runs on every first hit."""
    if os.sep in command:
        return Path(command) if _executable(command) else None
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", command)
        if _executable(candidate):
            return Path(candidate)
    return None


def _executable(path: str) -> bool:
    # access() first: one system call, and no exception, for each folder of PATH that lacks it
    return os.access(path, os.X_OK) and os.path.isfile(path)


def run_tool(argv: list[str]) -> str:
    """Run a version query; stdout and stderr together (gcc -v writes to stderr)."""
    import subprocess  # only when the on-disk memo misses

    done = subprocess.run(
        argv, capture_output=True, text=True, errors="replace", timeout=60, check=False
    )
    return done.stdout + done.stderr


def _stamp(path: Path) -> tuple[int, int, int, int]:
    """What a memo of the file is kept by. The change time too: a rewrite in place with the same
    size and its mtime set back (cp -p, touch -r, a package's files) moves only that."""
    st = path.stat()
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def memoized(
    path: Path, what: str, compute: Callable[[Path], str], memo_dir: Path | None
) -> str | None:
    """compute(path), remembered in memory and under memo_dir by the file's stat."""
    try:
        stamp = _stamp(path)
    except OSError:
        return None
    return memoized_by(stamp, f"{path}\0{what}", lambda: compute(path), memo_dir)


def memoized_by(
    stamp: tuple[Any, ...], what: str, compute: Callable[[], str], memo_dir: Path | None
) -> str:
    """compute(), remembered in memory and under memo_dir while `stamp` (file stats) is unchanged."""
    value = recall_by(stamp, what, memo_dir)
    if value is None:
        value = compute()
        remember_by(stamp, what, value, memo_dir)
    return value


def recall(path: Path, what: str, memo_dir: Path | None) -> str | None:
    """What memoized() remembers of path now, if anything; None also when path is gone."""
    try:
        return recall_by(_stamp(path), f"{path}\0{what}", memo_dir)
    except OSError:
        return None


def remember(path: Path, what: str, value: str, memo_dir: Path | None) -> None:
    """Remember value as memoized() would have computed it."""
    try:
        remember_by(_stamp(path), f"{path}\0{what}", value, memo_dir)
    except OSError:
        pass


def recall_by(stamp: tuple[Any, ...], what: str, memo_dir: Path | None) -> str | None:
    mem_key = (what, str(memo_dir))  # per memo_dir, so each store's disk memo gets written once
    cached = _memo.get(mem_key)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    value = _read_record(_memo_file(memo_dir, what), stamp)
    if value is not None:
        _memo[mem_key] = (stamp, value)
    return value


def remember_by(stamp: tuple[Any, ...], what: str, value: str, memo_dir: Path | None) -> None:
    _write_record(_memo_file(memo_dir, what), stamp, value)
    _memo[(what, str(memo_dir))] = (stamp, value)


def memo_file(path: Path, what: str, memo_dir: Path | None) -> Path | None:
    """Where memoized(path, what, ...) keeps its answer under memo_dir (hits/writer.py witnesses it)."""
    return _memo_file(memo_dir, f"{path}\0{what}")


def remembered_on_disk(stamp: tuple[Any, ...], what: str, memo_dir: Path | None) -> tuple[Path, str] | None:
    """(the memo file, its value) where the file under memo_dir holds a value for this
    stamp now: what a new process's recall_by reads (hits/cuda_witness.py witnesses it)."""
    record = _memo_file(memo_dir, what)
    value = _read_record(record, stamp)
    return None if record is None or value is None else (record, value)


def _memo_file(memo_dir: Path | None, what: str) -> Path | None:
    if memo_dir is None:
        return None
    digest = sha256_hex(what.encode())[:32]
    return memo_dir / f"{digest}.json"


def _read_record(record: Path | None, stamp: tuple[Any, ...]) -> str | None:
    if record is None:
        return None
    try:
        with open(record, "rb", opener=_no_follow) as file:
            if not _believed(os.fstat(file.fileno()), os.stat(record.parent)):
                return None  # another user's (a store an older version left open): computed again
            data = json.loads(file.read())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    seen = data.get("stamp")
    if seen != list(stamp) and seen != json.loads(json.dumps(list(stamp))):  # as JSON keeps it
        return None
    value = data.get("value")
    return value if isinstance(value, str) else None


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))


def _believed(st: os.stat_result, folder: os.stat_result) -> bool:
    """A memo steers keys (a compiler's identity): believed only where this user
    (or root) wrote it and nobody else can rewrite it, or, in a shared store
    (ABICACHE_SHARED: setgid folders), a member of its group did."""
    if os.name != "posix" or st.st_mode & stat.S_IWOTH:
        return os.name != "posix"
    if st.st_uid in (os.getuid(), 0) and not st.st_mode & stat.S_IWGRP:
        return True
    return bool(folder.st_mode & stat.S_ISGID) and st.st_gid == folder.st_gid and not folder.st_mode & stat.S_IWOTH


def _write_record(record: Path | None, stamp: tuple[Any, ...], value: str) -> None:
    if record is None:
        return
    try:
        os.makedirs(record.parent, mode=0o755, exist_ok=True)  # never group-writable, whatever the umask
        tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "w") as out:  # 0644 whatever the umask allows more: _believed reads it
            out.write(json.dumps({"stamp": list(stamp), "value": value}))
        os.replace(tmp, record)
    except OSError:
        pass  # a memo we cannot write only costs a subprocess next time
