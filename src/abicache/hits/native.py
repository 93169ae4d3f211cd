"""witness.c: a hit record's witnesses checked in one native call, built once per store.

A torch extension's record holds ~680 witnesses (the system headers its build read): os.stat
checks them at ~4 us each, 2.5 ms of a call whose floor (importing the .so by path) is
1.4 ms; witness.c checks them at ~2 us each (one lstat: a record says which are links), on
a few threads at once where there are many. It is built with the C compiler beside a build
that made a large record (writer.py: a process that compiles anyway; a hit spawns nothing),
under the store's tools/ as the observer and the launcher's front are, and its path is in
the record (where this source's is not built yet, one an older source built with the same ABI
number: existing). A hit loads it with ctypes only where it is a regular file of this user in a
folder of this user, neither writable by anyone else (loading it runs its code); anything
else, and a record without one, is checked in Python (record.py _hold): the same verdicts,
tests/test_torch_hits.py checks both on the same witnesses.
"""

from __future__ import annotations

import os
from stat import S_ISDIR, S_ISREG

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Sequence

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "witness.c")
LIBRARY = "libabicache-witness.so"
#: a record with fewer witnesses of its build than this is checked in Python: loading the
#: library (~0.2 ms) costs about what 150 witnesses save, and building it (~0.1 s, once a
#: store) is paid beside builds that read this many files, not beside every small one
WORTH = 200
#: witness.c WITNESS_ABI: what its calls mean; a library an older source built serves while it is the same
ABI = 1

_loaded: dict[str, Any] = {}


class Native:
    """witness.c's calls (its comments say what each does)."""

    __slots__ = ("_library", "_hold", "_arm", "_holders", "_loaded", "_buffer", "_refused")

    def __init__(self, library: Any) -> None:
        import ctypes

        self._library = library
        self._hold, self._arm = library.abicache_hold, library.abicache_arm
        self._hold.restype = self._arm.restype = ctypes.c_int
        self._hold.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p)
        self._arm.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p)
        # a record names the library its writer built: one of an older witness.c has no holders
        self._holders = getattr(library, "abicache_holders", None)
        if self._holders is not None:
            self._holders.restype = ctypes.c_long
            self._holders.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_long)
        self._loaded = library.abicache_loaded
        self._loaded.restype = ctypes.c_int
        self._loaded.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int)
        self._buffer, self._refused = ctypes.create_string_buffer, ctypes.ArgumentError

    def hold(self, kinds: bytes, paths: bytes, numbers: bytes) -> bool:
        """paths: NUL-terminated, one after another; numbers: 4 x int64 a witness. Whether
        every witness holds."""
        try:
            return self._hold(len(kinds), kinds, paths, numbers) == -1
        except self._refused:  # never a traceback from a hit: the full lookup
            return False

    def loaded(self, soname: bytes) -> str | None:
        """The file of the library this process loaded by that soname (native/loaded.py's
        answer for it); None where it is not loaded or the helper cannot tell."""
        out = self._buffer(4096)
        try:
            if self._loaded(soname, out, 4096) != 0:
                return None
        except self._refused:
            return None
        return os.fsdecode(out.value)

    def arm(self, fd: int, paths: Sequence[str], masks: Sequence[int]) -> list[int] | None:
        """The watch descriptor of each path, armed for its mask; None where one was not."""
        from struct import pack, unpack

        n = len(paths)
        wds = self._buffer(4 * n or 4)
        blob = b"".join(os.fsencode(p) + b"\0" for p in paths)
        try:
            if self._arm(fd, n, blob, pack(f"{n}I", *masks), wds) != -1:
                return None
        except self._refused:
            return None
        return list(unpack(f"{n}i", wds.raw[:4 * n]))

    def abi(self) -> int | None:
        """witness.c WITNESS_ABI, or None for a library older than the number."""
        call = getattr(self._library, "abicache_witness_abi", None)
        return None if call is None else int(call())

    def holders(self, folders: Sequence[str]) -> list[str] | None:
        """store/watch.py _link_holders of each folder, one after another; None where the
        library could not tell (watch.py asks Python then)."""
        if self._holders is None:
            return None
        blob = b"".join(os.fsencode(folder) + b"\0" for folder in folders)
        size = 2 * len(blob) + 4096  # a holder is a prefix of its folder: more only where most parts are links
        out = self._buffer(size)
        try:
            used = self._holders(len(folders), blob, out, size)
        except self._refused:
            return None
        if used < 0:
            return None
        return [os.fsdecode(holder) for holder in out.raw[:used].split(b"\0")[:-1]] if used else []


def holder(path: str) -> Native | None:
    """witness.c's calls, loaded from path; None where it may not be loaded (module docstring)."""
    found = _loaded.get(path)
    if found is None:
        found = _load(path)
        if found is not None and found.abi() not in (None, ABI):  # None: older than the number, which began at 1
            found = None  # a record of an abicache whose calls mean other things: checked in Python
        found = _loaded[path] = found or False
    return found or None


def _load(path: str) -> Native | None:
    euid = os.geteuid()
    try:
        for st, kind in ((os.lstat(path), S_ISREG), (os.lstat(os.path.dirname(path)), S_ISDIR)):
            if not kind(st.st_mode) or st.st_uid != euid or st.st_mode & 0o022:
                return None
        import ctypes

        return Native(ctypes.CDLL(path))
    except (OSError, AttributeError):
        return None  # another machine's build in a shared store, or not ours


def _target(tools: str) -> str | None:
    """Where this source's library is built for this kind of machine; None without the source
    (an install that left it out: checked in Python)."""
    import hashlib

    try:
        with open(SOURCE, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
    except OSError:
        return None
    return os.path.join(tools, f"witness-{digest}-{os.uname().machine}", LIBRARY)


def existing(tools: str) -> str | None:
    """The library under tools/, where one was built and may be loaded; where this source's
    was not built yet (an upgrade changed it, and no build has run in this store since: a hit
    spawns no compiler), one an older source built whose calls mean the same (ABI; a call it
    lacks is then made in Python), else None."""
    target = _target(tools)
    if target is None:
        return None
    if _load(target) is not None:
        return target
    machine = f"-{os.uname().machine}"
    try:
        folders = sorted((name for name in os.listdir(tools) if name.startswith("witness-") and name.endswith(machine)),
                         reverse=True)
    except OSError:
        return None
    for folder in folders:
        path = os.path.join(tools, folder, LIBRARY)
        found = _load(path)
        if found is not None and found.abi() == ABI:
            return path
    return None


def build(tools: str, compiler: str) -> str | None:
    """The library's path under tools/, built where it is not yet; None where it cannot be."""
    import subprocess
    import tempfile

    target = _target(tools)
    if target is None:
        return None
    folder = os.path.dirname(target)
    if _load(target) is not None:
        return target
    try:
        os.makedirs(tools, mode=0o755, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="witness-", dir=tools) as work:
            out = os.path.join(work, "ready")
            os.mkdir(out, 0o755)
            os.chmod(out, 0o755)  # whatever the umask
            done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-pthread", "-o", os.path.join(out, LIBRARY),
                                   SOURCE],
                                  capture_output=True, timeout=120)
            if done.returncode != 0:
                return None
            os.chmod(os.path.join(out, LIBRARY), 0o555)
            try:
                os.rename(out, folder)  # atomic: another process may have won, with the same bytes
            except OSError:
                pass
    except (OSError, subprocess.SubprocessError):
        return None
    return target if _load(target) is not None else None
