"""Hit records: a fresh process's hit at the floor of loading the file by path. This package's
own module is the hit path: everything a served call runs, and nothing else.

A full lookup (core/) imports the store, computes the key (the compiler's identity), reads
the manifest, checks requirements, stamps and recorded dependencies: 25 ms of imports and a
few of work, where `ctypes.CDLL` of the same file takes one. After a full lookup found (or
made) the entry a frontend call asked for, writer.py writes a *hit record*: the file to
load and a witness of everything that lookup consulted (the store's folders and their
owners, the entry's files and stamp, every dependency, missing path and system file the
build recorded, the compiler that PATH finds and its identity's memo, the config files),
under a name that holds everything else it depended on (name, below). The next process
making the same call reads the record (record.py says its format), judges it and loads the
file: one file read, a stat a witness (or the store's keeper's word for them: keeper.py),
no import of the store, pathlib, re, json or typing. Any witness that moved, a deadline
passed (the entry's re-verification age, its next last-use touch), a record not of this
user: the full lookup runs, as if no record were there, and writes the record again.

A record is never looser than the lookup it stands for: what the lookup would decide from
something a record cannot witness (a fact beyond the name, several variants to rank, a
check sampled by ABICACHE_CHECK, a Cache given settings) is never recorded (writer.py).
Hits served so are counted as every hit is (tally.py).

Why the hit path is here, in one module: after `import torch` a served call's cost was
mostly Python loading the code it runs, each module a few tens of microseconds to find and
open (a package's first submodule more: its folder is listed), and each function, class and
name in it ~10 us a kilobyte of bytecode to unmarshal, cold (issue 49). So this module holds
only what a served call runs; what only a miss, a writer or a process's own check runs is in
the package's other modules (record.py: the format's writing and the check a process makes
itself; writer.py; keeper.py; tally.py). In order:

- the call's load, once per process (the frontends' memo: cc.py, torch.py, tvm_ffi.py);
- the record's name: everything a lookup depends on that its witnesses do not cover;
- the record on disk: read, parsed and judged;
- the keeper's word: whether a large record's witnesses still hold, asked of the store's
  keeper (keeper.py) instead of checked here.

The record's name holds the call (frontend, name, sources, flags), the working directory
(relative paths), the store as written, the user and groups (whose store is trusted), the
interpreter, the machine (os.uname: a store on a filesystem several hosts mount), the C
library, and the whole environment (every setting, PATH, $CXX, every variable a compiler
reads: a record is per environment, never judged by the variables a build happened to
read). A record of another name is another record: none is ever taken for a call it was
not written for.

The keeper's address is an abstract Unix socket named from everything its verdicts depend
on: the user, the mount and user namespaces and the root folder (which files a path names),
the store's real root, the protocol and abicache's version. Each end checks the other's user
(SO_PEERCRED): an abstract name can be bound by anyone, answered only by this user's keeper.

Why a keeper's slot may be trusted (Vouched.find, Vouched.unchanged): inotify queues an event
in the system call that changes a file, before that call returns. The keeper bumps its
state's sequence number to odd before it reads events and to even after it has cleared the
slots of the records they touched, one pass at a time. A process that finds, in this order,
nothing queued on the instance (FIONREAD), the sequence even, and its record's generation in
its slot knows that every change made before it looked was read (the queue is empty), that
the pass which read it had finished (an even sequence after the read), so its clearing shows,
and that its record's was not among them. Anything else (an event in flight: it asks the
keeper to catch up, once; a keeper gone, whose queue then only grows) and the process checks
for itself (record.py check).

A call likely to ask (a torch extension's) connects first (reach), so that the keeper wakes
while the call is named and its record read. Nothing here imports more than os, sys, time,
stat, struct, fcntl, _socket (socket.py imports enum: ~1 ms where torch has not imported it) and
_blake2 (the names: _digest).
"""

from __future__ import annotations

from _collections_abc import Mapping  # collections.abc's, without importing collections
import os
import sys
import time
from stat import S_ISREG
from struct import Struct

from .. import __version__

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    import socket  # _socket's, which the calls here use
    from types import ModuleType
    from typing import Any, Callable, Sequence, Union

    from ..core.artifact import Artifact
    from ..core.cache import Cache
    from ..store.watch import Watch

    Source = Union[str, "os.PathLike[str]", Mapping[str, str]]  # cc.py's


# ---- the call's load, once per process ------------------------------------------------

#: memo -> (the artifact or the record that served it, what loading it made, the environment then)
_loaded: dict[tuple[Any, ...], Any] = {}
#: os.environ's own table (str on Windows, bytes elsewhere): what the memo compares
_ENVIRON = os.environ._data  # type: ignore[attr-defined]
_DIR_VARIABLE = os.environ.encodekey("ABICACHE_DIR")  # type: ignore[attr-defined]  # its key in that table


def _load_once(memo: tuple[Any, ...], get: Callable[[], Artifact], load: Callable[[Artifact], Any],
               serve: Callable[..., tuple[Served, Any] | None] | None = None) -> Any:
    """Load an artifact once per process, and again when a header it was compiled from
    changed (a notebook editing a header and loading again gets the new code). gc may remove
    the entry between lookup and load: then look it up (or build it) once more. serve: the
    first call's hit record, if one serves it (serve(False): the record alone, see record.py
    recorded). A memo entry holds the environment it was made in and serves no call after
    any variable changed: the compilers, $CC, the steering variables and every variable a
    compiler reads are in it (never looser than the key; a hit record's name holds the whole
    environment too: name below); one comparison of os.environ's table, where picking the
    steering variables out of it cost each call 2.7 us."""
    held = _loaded.get(memo)
    if held is not None and held[2] == _ENVIRON:
        if serve is not None and held[0].unasked():
            from . import record  # the second call after a full lookup: once a process

            if record.recorded(memo, held, serve):
                return held[1]
        if held[0].current():
            return held[1]
    if held is None and serve is not None:
        got = serve()
        if got is not None:
            _loaded[memo] = (*got, dict(_ENVIRON))
            return got[1]
    art = get()
    if held is not None and os.fspath(art.path) == os.fspath(held[0].path):  # touched, not changed: the same build
        _loaded[memo] = (art, held[1], dict(_ENVIRON))
        return held[1]
    try:
        loaded = load(art)
    except OSError:
        if art.path.exists():
            raise
        art = get()
        loaded = load(art)
    _loaded[memo] = (art, loaded, dict(_ENVIRON))
    return loaded


def _where(cache: Cache | None) -> Any:
    """Which store a memo entry belongs to, as written (a Cache's root before it is opened).
    The variable is read from os.environ's table: os.environ.get of a variable that is not
    set raises and catches a KeyError inside, ~1-2.5 us of every call's 8-14."""
    return cache.given_root if cache is not None else ("default", _ENVIRON.get(_DIR_VARIABLE))


def _fingerprint(sources: Sequence[Source] | Source, files: bool = False) -> Any:
    """A cheap, hashable picture of the sources for the in-process memo. files: every item is
    a file's path, a str too (torch's load: no pathlib object made a call, where making them
    was half of a repeated call's 150 us)."""
    single = type(sources) not in (list, tuple) and isinstance(sources, (str, os.PathLike, Mapping))
    out: list[Any] = []
    for item in [sources] if single else sources:  # cheap tests first: isinstance(x, Mapping) is slow
        if type(item) is str and not files:
            out.append(item)
        elif files or hasattr(item, "__fspath__"):
            try:
                st = os.stat(item)
                out.append((os.fspath(item), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
            except OSError:
                out.append((os.fspath(item), None))  # collect_sources reports it
        elif isinstance(item, Mapping):
            out.append(tuple(sorted(item.items())))
        else:
            out.append(item)
    return tuple(out)


def _record_root(cache: Cache | None) -> str | None:
    """The store a hit record of a call with this cache is kept in, as written; None where
    no record may stand for it (a Cache given settings, or changed since: hits/)."""
    if cache is not None and not cache.as_opened():
        return None
    if cache is not None and cache.given_root is not None:
        return os.fspath(cache.given_root)
    return default_root()


def _serve(call: bytes | None, cache: Cache | None, load: Callable[[str], Any], fresh: bool = True,
           root: str | None = None, real: str | None = None) -> tuple[Served, Any] | None:
    """(the record that served the call, what load made of its file), or None: the full lookup.
    fresh=False: the record alone, checked and its watch armed, its file not loaded (nor the
    hit counted): what the process loaded in its first call stands on it (_load_once). root,
    real: the store's, where the caller has them already (reach)."""
    root = root or (_record_root(cache) if call is not None else None)
    if root is None:
        return None
    served = serve(call, root, real)  # type: ignore[arg-type]
    if served is None:
        return None
    if not fresh:
        return served, None
    try:
        loaded = load(served.file)
    except OSError:
        return None  # removed between the check and the load (gc): the full lookup
    _count(served)
    served.warm()  # after the load, whose bytes pushed the watch's code out of the caches
    return served, loaded


#: the hits records served in this process, counted when it exits (hits/tally.py)
_served: list[tuple[str, float, str]] = []


def _count(served: Served) -> None:
    """A hit a record served, counted as the process exits, where the counts are written
    anyway: importing the counter on the call cost it ~0.15 ms (issue 49)."""
    if not _served:
        import atexit

        atexit.register(_count_at_exit)
    _served.append((served.root, served.seconds, served.path))


def _count_at_exit() -> None:
    from . import tally

    tally.count_served(_served)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_served.clear)  # a forked child's counts are its parent's (hits/tally.py)


#: module name -> the files imported under it in this process, in order
_imported: dict[str, list[str]] = {}


def import_extension(name: str, path: str | os.PathLike[str]) -> ModuleType:
    """Import the CPython extension module at path, as a cached build is imported. CPython
    keeps one module per name (a second file with the same PyInit_<name> gets the first
    module back), so a new build under a name already imported in this process (new code, or
    a header edit) is imported as `<name>_v<N>.<name>`: the init symbol is found, the module
    is new, the way cpp_extension's name_v1 is (without a rebuild). The first import under a
    name is also sys.modules[name]. Here, not in a module of its own: a torch extension's hit
    imports this module anyway, and each module more costs it ~0.1 ms (issue 49)."""
    import importlib.machinery
    # importlib.util's own module_from_spec, without the 3 ms importlib.util imports
    from importlib._bootstrap import module_from_spec

    seen = _imported.setdefault(name, [])
    key = os.fspath(path)
    if key not in seen:
        seen.append(key)
    version = seen.index(key)
    full = name if version == 0 else f"{name}_v{version}.{name}"
    loader = importlib.machinery.ExtensionFileLoader(full, key)
    spec = importlib.machinery.ModuleSpec(full, loader, origin=key)
    spec.has_location = True  # as spec_from_file_location makes it: the module's __file__ is its path
    module = module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[full] = module
    return module


# ---- the record's name ---------------------------------------------------------------

#: 2: the native check's path; 3: which files are links, the watch's plan; 4: the GPU facts' premise (record.py)
FORMAT = b"abicache-hit 4"
#: os.environ's own table of bytes (POSIX); elsewhere no record is named
_RAW = getattr(os.environ, "_data", None) if os.name == "posix" else None


def call_of(frontend: str, name: str, sources: Any, **args: Any) -> bytes | None:
    """The call as canonical bytes; None where a source or an argument is of a type a
    record does not name (the full lookup serves such calls). An argument: None, a str,
    bool or int, a list or tuple of str, a dict of str to str (its order kept)."""
    single = type(sources) not in (list, tuple)
    parts: list[Any] = [frontend, name]
    for item in [sources] if single else sources:
        if type(item) is str:
            parts.append(("code", item))
        elif hasattr(item, "__fspath__"):
            path = os.fspath(item)
            parts.append(("path", os.fsencode(path)))
        elif isinstance(item, dict) and all(type(k) is str and type(v) is str for k, v in item.items()):
            parts.append(("files", tuple(sorted(item.items()))))
        else:
            return None
    for key in sorted(args):
        value = args[key]
        if isinstance(value, (list, tuple)):
            if not all(type(v) is str for v in value):
                return None
            value = tuple(value)
        elif type(value) is dict:  # cpp_extension's functions={name: docstring}: in its order
            if not all(type(k) is str and type(v) is str for k, v in value.items()):
                return None
            value = ("dict", tuple(value.items()))
        elif value is not None and type(value) not in (str, bool, int):
            return None
        parts.append((key, value))
    return repr(parts).encode("utf-8", "surrogateescape")


#: the facts a torch call's record names (env/probes.py TORCH_FACTS)
TORCH_NAMED = ("torch.version", "torch.git", "torch.cuda", "torch.hip", "torch.cxx11abi", "torch.build", "torch.flavor",
               "torch.root")


def torch_facts() -> dict[str, str | None] | None:
    """The torch facts of the torch module this process imported, as env/probes.py reads them,
    or None where none is imported. A torch extension is keyed on the installed torch's build
    (torch.build: version, git, CUDA/HIP, C++ ABI) and found at its root: facts a C library's
    record does not name. Loading one imports torch anyway, so its record's name holds them as
    the live torch module gives them (the full lookup reads the same ones: env/probes.py
    _live_torch; tests/test_torch_hits.py keeps the two equal); a record is written only where
    the facts its lookup used are these (writer.py), and the files the lookup read of that
    torch beyond them are its witnesses (frontends/torch_lines.py files)."""
    mod = sys.modules.get("torch")
    version = getattr(mod, "version", None)
    where = getattr(mod, "__file__", None)
    if version is None or not where:
        return None
    abi = getattr(getattr(mod, "_C", None), "_GLIBCXX_USE_CXX11_ABI", None)
    found: dict[str, str | None] = {
        "torch.version": str(version.__version__),
        "torch.git": getattr(version, "git_version", None),
        "torch.cuda": getattr(version, "cuda", None),
        "torch.hip": getattr(version, "hip", None),
        "torch.cxx11abi": None if abi is None else str(int(bool(abi))),
        "torch.root": os.path.dirname(where),
    }
    found["torch.build"] = "/".join([found["torch.version"] or "unknown"] + [
        f"{k}={found[f'torch.{k}'] or 'none'}" for k in ("git", "cuda", "hip", "cxx11abi")])
    local = (found["torch.version"] or "").partition("+")[2]
    found["torch.flavor"] = ("cuda" if found["torch.cuda"] else "rocm" if found["torch.hip"]
                             else "xpu" if local.startswith("xpu") else "cpu")
    return found


def torch_call(frontend: str, name: str, sources: Any, args: Mapping[str, Any]
               ) -> tuple[bytes, dict[str, str | None]] | None:
    """(a torch call as a record names it, the torch facts it names), or None where no record
    may stand for it: no torch imported, a build folder to copy into on every call
    (build_directory), a verbose call, an argument of a type a record does not name. Here,
    with the rest of a name: a torch extension's hit imports this module anyway, and each
    module more costs it ~0.1 ms (issue 49)."""
    if args.get("build_directory") is not None or args.get("verbose"):
        return None  # a copy made on every call; what a verbose call says of its lookup
    named = torch_facts()
    if named is None:
        return None
    made = call_of(frontend, name, sources, torch=repr(sorted(named.items())),
                   **{k: v for k, v in args.items() if k != "cache"})
    return None if made is None else (made, named)


def default_root() -> str | None:
    """The default store (ABICACHE_DIR, else the platform's user cache folder) where the
    environment alone says it; None where the user's config file may name another (`dir`)."""
    explicit = os.environ.get("ABICACHE_DIR")
    if explicit:
        return os.path.expanduser(explicit)
    if _config_may_name_dir():
        return None
    if sys.platform != "linux" or hasattr(sys, "getandroidapilevel") or os.environ.get("ANDROID_ROOT"):
        return None  # platformdirs decides there (settings/config.py)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "abicache")
    home = os.environ.get("HOME", "")
    return os.path.join(home, ".cache", "abicache") if os.path.isabs(home) else None


def _config_may_name_dir() -> bool:
    """Whether the user's config file may set `dir`. A TOML key spells "dir" in its bytes
    unless written with \\u escapes: a file with neither cannot set it."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".config")
    try:
        fd = os.open(os.path.join(base, "abicache", "config.toml"),
                     os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        data = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    return b"dir" in data or b"\\u" in data or b"\\U" in data


def name(call: bytes, root: str | os.PathLike[str]) -> str | None:
    """The record's name for this call and store in this process, as it is now."""
    if _RAW is None:
        return None
    try:
        here = os.getcwd()
    except OSError:  # the working directory was removed: the full lookup says what that means
        return None
    env = b"\0".join(sorted(k + b"=" + v for k, v in _RAW.items()))
    uname = os.uname()
    who = f"{os.getuid()} {os.geteuid()} {os.getgid()} {os.getegid()} {sorted(os.getgroups())}"
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    where = "\0".join((who, sys.executable, sys.version, str(sys.implementation.cache_tag), " ".join(uname), libc))
    return _digest(b"\0\0".join((FORMAT, __version__.encode(), call, os.fsencode(root), os.fsencode(here),
                                 where.encode("utf-8", "surrogateescape"), env)))


def _digest(data: bytes) -> str:
    """The hex blake2b-256 of data: a record's name, the keeper's address, a slot's tag.
    CPython's own blake2b (hashlib's blake2b is this one, never OpenSSL's), imported once: a first
    sha256 through OpenSSL cost a torch extension's hit ~50 us (its digest's start-up), and
    one without OpenSSL loaded took values/digest.py, its package and _sha256: ~0.4 ms of a
    C library's hit, where _blake2 takes ~0.2."""
    global _blake2b
    if _blake2b is None:
        try:
            from _blake2 import blake2b as _blake2b
        except ImportError:  # pragma: no cover - an interpreter built without it
            from hashlib import blake2b as _blake2b
    return _blake2b(data, digest_size=32).hexdigest()


_blake2b: Any = None  # _blake2.blake2b, once a digest is asked


# ---- the record on disk --------------------------------------------------------------

#: the store's layout (store/layout.py LAYOUT_VERSION; tests/test_hits.py keeps them equal)
LAYOUT = "v3"
FOLDER = "hits"
#: a record's size at most (a build that read 10^4 headers: about 1 MiB)
MAX_BYTES = 8 << 20
_WITNESS = Struct("<4q")
_MASK = Struct("<I")
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_KINDS = frozenset(b"lsdtamcfnk")
#: the text's fields before the paths (record.py encode)
_HEAD = 11


def folder(root: str) -> str:
    return os.path.join(root, LAYOUT, FOLDER)


def read_identified(path: str) -> tuple[bytes, tuple[int, int, int, int]] | None:
    """A record's bytes, if it is a regular file of this user that no one else may write, and
    the file's inode, size, mtime and ctime (what the keeper is asked of: keeper.py)."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022 or st.st_size > MAX_BYTES:
            return None
        return os.read(fd, st.st_size + 1), (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        return None
    finally:
        os.close(fd)


class _Parsed:
    """A record's parts, as _parse finds them in the bytes read (the format: record.py): the
    head's fields, with the witnesses' numbers and the paths left where they are until asked
    (a torch extension's record is ~60 KB, of which a served call reads a few stats' worth)."""

    __slots__ = ("data", "n", "p", "at", "text", "fields", "kinds", "start", "paths", "plan", "built")

    def __init__(self, data: bytes, n: int, p: int, at: int, text: int, fields: list[bytes]) -> None:
        self.data, self.n, self.p, self.at, self.text, self.fields = data, n, p, at, text, fields
        self.kinds = fields[10]
        self.start = int(fields[7])
        self.paths: list[str] | None = None  # record.py decode: the paths, the plan, the build's witnesses

    def stored(self, only: str = "") -> list[tuple[str, str, tuple[int, ...]]]:
        """The store's witnesses (and the config files', the compiler's, the GPU facts'), as
        tuples; only: those of these kinds (no tuple made of the others: see record.py Built)."""
        kinds, data, at, size = self.kinds[:self.start].decode(), self.data, self.at, _WITNESS.size
        paths: list[bytes] | list[str]
        if self.paths is not None:
            paths = self.paths[:self.start]
        else:  # the store's paths alone, the first ones, split in C (a loop here: ~40 us of a torch
            paths = data[self.text:].split(b"\0", self.start)  # hit's ~95), the build's left in one piece
        return [(k, os.fsdecode(paths[i]), _WITNESS.unpack_from(data, at + i * size))
                for i, k in enumerate(kinds) if not only or k in only]


def _parse(data: bytes, real: str) -> _Parsed | None:
    """The record's parts, where it is one of this format and of this store; None otherwise."""
    head = data.find(b"\n")
    magic, count, planned, length = data[:head].rsplit(b" ", 3)
    n, p, size = int(count), int(planned), int(length)
    at = head + 1
    pos = at + n * _WITNESS.size + p * _MASK.size
    if magic != FORMAT or len(data) != pos + size:
        return None
    fields = []
    for _ in range(_HEAD):  # the fields before the paths, found in place: the paths are not copied
        end = data.find(b"\0", pos)
        end = end if end >= 0 else len(data)
        fields.append(data[pos:end])
        pos = end + 1
    kinds, root = fields[10], fields[1]
    if len(kinds) != n or not _KINDS.issuperset(kinds) or os.fsdecode(root) != real:
        return None
    return _Parsed(data, n, p, at, pos, fields)


def serve(call: bytes, root: str, real: str | None = None) -> Served | None:
    """The record of this call in this store (real: where root resolves, if known), if there
    is one and it holds now."""
    record_name = name(call, root)
    if record_name is None:
        return None
    real = real or os.path.realpath(root)
    got = read_identified(os.path.join(folder(real), record_name))
    if got is None:
        return None
    try:
        return _judge(got[0], real, record_name, got[1])
    except (ValueError, IndexError, OverflowError):
        return None  # not a record this abicache wrote: the full lookup writes one
    except OSError:
        return None  # the entry went while it was checked (gc): the full lookup


def _judge(data: bytes, real: str, record_name: str = "", identity: tuple[int, int, int, int] = (0, 0, 0, 0)
           ) -> Served | None:
    parsed = _parse(data, real)
    if parsed is None:
        return None
    deadline, _, file, entry, names, touch, seconds, _, helper, gpu = parsed.fields[:10]
    if time.time() >= float(deadline):
        return None  # the entry is due to be hashed in full again (its verify age): the full lookup does it
    if gpu:
        from . import cuda_witness  # GPU code's records only

        if not cuda_witness.holds(gpu.decode()):
            return None
    folder, count = os.fsdecode(entry), parsed.n - parsed.start
    large = helper and count >= _WORTH
    if large and record_name and wanted():  # the keeper's word, where one keeps the record: the build's
        vouched = ask(real, record_name, identity)  # paths are then read only where this process's watch is needed
        if vouched is not None:  # it vouched for all but what this process alone can check: the
            if not _own(parsed.stored("tc")):  # folders' owners and modes, the C++ runtime it loads
                return None
            _touch(folder, float(touch))
            return Served(os.fsdecode(file), folder, real, float(seconds), parsed, vouched)
    from . import record  # no keeper's word: this process checks for itself

    watch = record.check(parsed, folder, names, os.fsdecode(helper) if large else "")
    if watch is None:
        return None
    _touch(folder, float(touch))
    return Served(os.fsdecode(file), folder, real, float(seconds), parsed, watch)


#: native.py WORTH, here so that a record too small for the native check imports nothing more
#: (tests/test_torch_hits.py keeps them equal)
_WORTH = 200


class Served:
    """A record that held: the file to load, and whether it still holds later in this
    process (the in-process memo asks, as it asks an Artifact: current())."""

    __slots__ = ("file", "path", "root", "seconds", "_parsed", "_cwd", "_watch")

    def __init__(self, file: str, path: str, root: str, seconds: float, parsed: _Parsed,
                 watch: Watch | Vouched | None = None) -> None:
        self.file, self.path, self.root, self.seconds = file, path, root, seconds
        self._parsed = parsed  # the witnesses of what the build read, and their watch's plan: what current() asks
        self._cwd = _cwd()
        self._watch = watch

    def warm(self) -> None:
        """Ask the watch once, as the process's next call will: the first ask's own costs
        (ctypes' first ioctl, its code run cold) fall on the call the record served, which
        costs milliseconds, not on the next one (issue 49: 10-20 us of the second call's ~50).
        Its verdict is the next call's to act on; a watch that fell back to stats (no inotify)
        is not asked: making its witnesses' tuples after `import torch` sets off a collection."""
        if self._watch is not None and self._watch.marks is not None:  # the keeper's word (Vouched): marks ()
            self._watch.unchanged()

    def unasked(self) -> bool:
        """As Artifact.unasked: a served call armed its watch, asked once (warm)."""
        return False

    def current(self) -> bool:
        """What an entry's in-process memo asks (core/artifact.py Artifact.current): whether
        the files its build read still hold, microseconds once asked (store/watch.py); and
        the working directory its name was made of. The memo compares the environment, the
        rest of the name, itself (_load_once: every entry holds the one it was made in)."""
        if _cwd() != self._cwd:
            return False
        if self._watch is not None and self._watch.unchanged():
            return True
        from . import record

        watch = record.rewatched(self._parsed)
        if watch is None:
            return False
        self._watch = watch
        return True


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None  # removed: the full lookup says what that means


def _touch(folder: str, interval: float) -> None:
    """A use of the entry, at most once per interval (store/local.py Store.touch)."""
    try:
        if time.time() - os.stat(folder).st_mtime >= interval:
            os.utime(folder)
    except OSError:
        pass  # a read-only or shared store still serves hits


def _own(witnesses: Sequence[tuple[str, str, tuple[int, ...]]]) -> bool:
    """Whether the witnesses only this process can check stand (the keeper vouches for the rest):
    t, a folder's inode, mode, owner and group; c, the C++ runtime this process loads (record.py
    says the kinds; its _hold checks every other)."""
    for kind, path, w in witnesses:
        try:
            if kind == "t":
                st = os.lstat(path)
                if (st.st_ino, st.st_mode, st.st_uid, st.st_gid) != w:
                    return False
            else:
                st = os.stat(path)
                if not _runs(path) or (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != w:
                    return False
        except OSError:
            return False
    return True


def _runs(path: str) -> bool:
    """Whether the C++ runtime this process loads (or loaded already: a library brought in first
    is the one it keeps; not loaded yet, it loads it, as a C++ library would) is the file at
    path: the dynamic loader's own answer, two dlopen calls (the library by its soname, and
    that file only if it is loaded: the same handle where it is the same file). Asking which
    file it is (native/loaded.py, through dlinfo) imported two modules on a hit: ~0.3 ms."""
    import ctypes
    from _ctypes import dlopen

    try:
        loaded = dlopen("libstdc++.so.6", ctypes.DEFAULT_MODE)  # native/loaded.py LIBSTDCXX
        return dlopen(path, ctypes.DEFAULT_MODE | os.RTLD_NOLOAD) == loaded
    except (OSError, AttributeError):  # none of that file loaded, or no dynamic loader to ask
        return False


# ---- the keeper's word ---------------------------------------------------------------

#: the keeper's protocol: bumped when a message or the state's layout changes meaning
KEEPER_FORMAT = b"abicache-keeper 1"
PREFIX = b"\0abicache-keeper-"
#: how long an asker waits for the keeper: its word saves ~3 ms; a keeper that takes longer
#: (descheduled on a loaded machine) is not waited for, the process checks itself
ASK_SECONDS = 0.02
#: the state: a 64-bit sequence number, then SLOTS records, each its generation (64 bits, 0:
#: none) and its tag (the first 24 bytes of the digest of its name and identity: _digest)
SEQUENCE = 8
SLOT = 32
SLOTS = 4096
#: the slots a record may be in, from the one its name starts at
PROBE = 8
#: FIONREAD where Linux's generic ioctl numbers hold (store/inotify.py _FIONREAD)
_FIONREAD = 0x541B


def wanted() -> bool:
    """Whether a keeper may be asked: not where ABICACHE_KEEPER is 0 (none is started then,
    and a hit pays no connection for it)."""
    value = os.environ.get("ABICACHE_KEEPER")
    if not value:
        return True
    try:
        return float(value) != 0
    except ValueError:
        return True  # the full lookup's settings check names the bad value


def address(real_root: str) -> bytes | None:
    """The keeper's abstract socket name for this store and this process's view of files;
    None where that view cannot be read."""
    try:
        spaces = b",".join(os.fsencode(os.readlink(f"/proc/self/ns/{n}")) for n in ("mnt", "user"))
        top = os.stat("/")
    except OSError:
        return None
    parts = [KEEPER_FORMAT, b"%d" % os.geteuid(), spaces, b"%d:%d" % (top.st_dev, top.st_ino), os.fsencode(real_root),
             __version__.encode()]
    return PREFIX + _digest(b"\0\0".join(parts))[:40].encode()


def tag(record: str, identity: tuple[int, int, int, int]) -> bytes:
    """What a record's slot holds beside its generation: its name and the file's identity
    (_digest)."""
    return bytes.fromhex(_digest(b"%s %d %d %d %d" % (record.encode(), *identity)))[:SLOT - 8]


def first_slot(record: str) -> int:
    return int(record[:8], 16) % SLOTS


class Greeting:
    """The keeper's inotify instance and its state, as this process holds them: one pair a
    store, kept for the process (a keeper that left keeps its instance alive through them,
    and any change then waits in its queue: nothing is trusted that it did not read)."""

    __slots__ = ("events", "state")

    def __init__(self, events: int, state: int) -> None:
        self.events, self.state = events, state

    def close(self) -> None:
        for fd in (self.events, self.state):
            if fd >= 0:
                os.close(fd)
        self.events = self.state = -1

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


class Vouched:
    """The keeper's word that a record's witnesses held, and the means to know, later in this
    process, that they still do (module docstring)."""

    __slots__ = ("_greeting", "_at", "_generation", "_pending")
    #: what Served.warm asks of a watch: not None, asked once after the load
    marks = ()

    def __init__(self, greeting: Greeting) -> None:
        self._greeting = greeting
        self._at, self._generation = 0, 0
        self._pending = bytearray(4)

    def find(self, record: str, identity: tuple[int, int, int, int]) -> str:
        """Take the record's slot: "yes", "busy" (the keeper is reading events, or some wait
        for it: ask it to catch up, then look again) or "no" (it does not hold the record)."""
        state = self._greeting.state
        want, first = tag(record, identity), first_slot(record)
        start = SEQUENCE + SLOT * first
        if self._waiting() or os.pread(state, SEQUENCE, 0)[0] & 1:  # in this order: see unchanged
            return "busy"
        slots = os.pread(state, SLOT * min(PROBE, SLOTS - first), start)
        for at in range(0, len(slots), SLOT):
            if slots[at + 8:at + SLOT] == want:
                generation = int.from_bytes(slots[at:at + 8], "little")
                if generation:
                    self._at, self._generation = start + at, generation
                    return "yes"
        return "no"

    def unchanged(self) -> bool:
        """Whether nothing the keeper watches for the record changed since it vouched: one
        ioctl and two reads of its state, no round trip. The order is what makes it sound:
        nothing queued means the keeper has read every event made before this call, each in
        a pass that made the sequence odd before its read and even only after the slots it
        touched were cleared; so a sequence even after that shows every such clearing, and
        the slot read next is at least as new (module docstring)."""
        state = self._greeting.state
        try:
            if self._waiting() or os.pread(state, SEQUENCE, 0)[0] & 1:
                return False  # events wait for the keeper, or it is reading some
            return int.from_bytes(os.pread(state, 8, self._at), "little") == self._generation
        except OSError:
            return False

    def _waiting(self) -> bool:
        """Whether events wait in the keeper's queue (FIONREAD: bytes pending)."""
        global _ioctl
        if _ioctl is None:
            from fcntl import ioctl

            _ioctl = ioctl
        return bool(_ioctl(self._greeting.events, _FIONREAD, self._pending, True) or any(self._pending))


_ioctl: Any = None  # fcntl.ioctl, once asked (a call after the first: ~6 us in all)


#: real root -> the keeper's greeting this process holds (one a store)
_greeted: dict[str, Greeting] = {}
#: real root -> a connection made early (reach), not asked yet
_reached: dict[str, socket.socket] = {}


def reach(root: str) -> str:
    """Connect to the store's keeper now, where a call is likely to ask it (a torch
    extension's): it wakes and greets while this process names the call and reads its record
    (~0.3 ms of a ~1 ms floor). A connection no ask takes is closed by leave(). The store's
    real root, which serve() is then given."""
    real = os.path.realpath(root)
    if real not in _reached and wanted():
        conn = _connect(real)
        if conn is not None:
            _reached[real] = conn
    return real


def leave() -> None:
    """Close the connections reach() made that no ask took."""
    while _reached:
        _reached.popitem()[1].close()


def _connect(real_root: str) -> socket.socket | None:
    name = address(real_root)
    if name is None:
        return None
    import _socket

    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        conn.settimeout(ASK_SECONDS)
        conn.connect(name)
    except OSError:
        conn.close()
        return None
    return conn


def ask(real_root: str, record: str, identity: tuple[int, int, int, int]) -> Vouched | None:
    """The keeper's word for the record (its name under hits/, and the inode, size, mtime and
    ctime of the file this process read), or None: no keeper, not this user's, one that does
    not hold the record at that identity (it is told to learn it: the next process is
    answered), or a change it saw. A process that was greeted before reads its state alone."""
    known = _greeted.get(real_root)
    if known is not None:
        vouched = Vouched(known)
        if vouched.find(record, identity) == "yes":
            return vouched
    conn = _reached.pop(real_root, None) or _connect(real_root)
    if conn is None:
        return None
    try:
        if peer(conn) != os.geteuid():
            return None
        greeting = greeted(conn)
        if greeting is None:
            return None
        _greeted[real_root] = greeting
        vouched = Vouched(greeting)
        found = vouched.find(record, identity)
        if found == "busy":
            conn.sendall(b"sync\n")  # it reads what is queued, then answers
            if line(conn) == b"ok":
                found = vouched.find(record, identity)
        if found == "yes":
            return vouched
        if found == "no":
            conn.sendall(b"learn %s\n" % record.encode())
        return None
    except (OSError, ValueError):
        return None  # none listening, one too slow, or an answer of another version
    finally:
        conn.close()


def greeted(conn: socket.socket) -> Greeting | None:
    """The keeper's greeting: its format, its inotify instance and its state; None where it is
    not this version's."""
    import _socket

    data, ancillary, _, _ = conn.recvmsg(len(KEEPER_FORMAT) + 1, _socket.CMSG_SPACE(2 * 4))
    fds: list[int] = []
    for level, kind, blob in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(blob[i:i + 4], sys.byteorder) for i in range(0, len(blob) - len(blob) % 4, 4)]
    if data != KEEPER_FORMAT + b"\n" or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return None
    return Greeting(fds[0], fds[1])


def line(conn: socket.socket) -> bytes:
    """One line of the keeper's, without its newline."""
    data = b""
    while not data.endswith(b"\n") and len(data) < 4096:
        more = conn.recv(4096)
        if not more:
            break
        data += more
    return data.rstrip(b"\n")


def peer(conn: socket.socket) -> int | None:
    """The user of the process at the other end (SO_PEERCRED: pid, uid, gid)."""
    import _socket

    try:
        cred = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    except OSError:
        return None
    return int.from_bytes(cred[4:8], sys.byteorder)
