"""Writing a hit record after a full lookup found or made what a call asked for.

The record witnesses what that lookup consulted, step by step (ARCHITECTURE.md, the hit
path); hits.name holds the rest. What a record cannot witness is never written:
a Cache given settings or changed since (its verify age, its pins, its facts), an entry
of another origin or kind, a requirement on a fact the name does not hold, several
variants of the key (their ranking asks the devices), a tool other than the C and C++
compilers, ABICACHE_CHECK sampling hits, an ABICACHE_* variable that is no setting (each
process warns of it), a config file behind a link. A witness younger than a clock tick
can tell apart (store/stamps.py) is not trusted: the record is written when the process
exits, once every witness has settled, or by the next full lookup.
"""

from __future__ import annotations

import os
import stat
import time

from .. import hits
from . import cuda_witness, record
from ..env import probes, toolid
from ..settings import checked, config, settings_file
from ..store import deps as depcheck, stamps
from ..store.manifest import LISTING

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

    from ..core.artifact import Artifact
    from ..core.cache import Cache

    #: files a lookup read beyond its facts and compilers, each with the name of its memo under
    #: the store's tools/ (env/toolid.py), or None: a torch's cpp_extension.py (frontends/torch_lines.py files)
    Files = Sequence[tuple[str, str | None]]

#: facts hits.name holds: a requirement on any other is judged by a full lookup
COVERED_FACTS = frozenset({"python.implementation", "python.version", "python.abi", "python.abi3",
                           "platform.system", "platform.machine", "platform.libc", "platform.glibc"})
#: facts a witness covers: read from the C++ runtime the process loads (a "c" witness)
CXX_FACTS = frozenset({"platform.glibcxx", "platform.cxxabi"})
#: the tools a record can witness (their command from PATH, their identity's memo)
TOOLS = {"compiler.cxx": ("CXX", "c++"), "compiler.cc": ("CC", "cc")}
#: the word _words gives cuda.nvcc: nvcc as env/probes.py nvcc_path finds it (PATH's, else
#: the first CUDA home's), never a command a launcher was given
NVCC = "cuda.nvcc"
KINDS = frozenset({"cc.library", "cc.module", "torch.pybind", "torch.classic", "torch.stable"})

Witness = tuple[str, str, tuple[int, int, int, int]]
Witnesses = list[Witness]
_later: dict[str, tuple[Any, ...]] = {}
#: record name -> the entry this process recorded under it: once a process, not every call
_noted: dict[str, str] = {}


def before(cache: Cache, call: bytes, root: str, tools: Sequence[str], named: Mapping[str, str | None] = {},
           files: Files = ()) -> Witnesses | str:
    """What the lookup about to run reads of the config files, the compilers (PATH, their
    identities' memos) and files: note() takes them again after it, and records only where
    both agree (nothing changed while it looked). Or why no record will be written.
    named: facts the call names (a tool that is one is named, not witnessed)."""
    name = hits.name(call, root)
    if name is None or name in _noted or set(tools) - set(TOOLS) - cuda_witness.TOOLS - set(named):
        return "the call has no name here" if name is None else "recorded" if name in _noted else \
            f"tools {sorted(set(tools) - set(TOOLS) - cuda_witness.TOOLS - set(named))}"
    out: Witnesses = []
    try:
        return _looked_at(cache, _words(tools), files, out) or out
    except FileNotFoundError:
        return "a first lookup (the store's tools folder not made yet)"
    except OSError as exc:
        return f"unreadable before the lookup: {exc}"


def looked_at(cache: Cache, compilers: Sequence[tuple[str, str]], files: Files = ()) -> Witnesses | None:
    """The config files, the compilers (each a word PATH finds, and the name of its
    identity's memo: env/toolid.py) and files as a lookup is about to read them; None where
    they cannot be witnessed."""
    out: Witnesses = []
    try:
        why = _looked_at(cache, compilers, files, out)
    except OSError:
        return None
    return None if why is not None else out


def _looked_at(cache: Cache, compilers: Sequence[tuple[str, str]], files: Files, out: Witnesses) -> str | None:
    return _settings(cache.store, out) or _compilers(cache, compilers, out) or _files(cache, files, out)


def _words(tools: Sequence[str]) -> list[tuple[str, str]]:
    """The compilers among tools, each as PATH finds it (a named fact is no command), and
    nvcc as env/probes.py nvcc_path finds it (PATH, then the CUDA homes)."""
    out = []
    for tool in tools:
        if tool in TOOLS:
            words = toolid.command(*TOOLS[tool])
            out.append((words[toolid.compiler_at(words)], "compiler -v"))
        elif tool == NVCC:
            out.append((NVCC, probes.IDENTITY_MEMO["nvcc"]))
    return out


def note(cache: Cache, call: bytes, root: str, art: Artifact, tools: Sequence[str],
         bases: dict[str, str], checking: bool, seen: Witnesses | str, named: Mapping[str, str | None] = {},
         files: Files = ()) -> str | None:
    """Write the record of this call after its lookup (None), or say why not; where only a
    witness too young to trust stands in the way (a build's), try again when the process
    exits. seen: before()'s witnesses, or why it took none; named and files: as before()
    was given them."""
    if art.origin == "built":  # the native check, built beside the build, whichever process records it
        _helper(cache, art, _recorded(art))
    name = hits.name(call, root)  # the environment, the working directory: as the next process names it
    if name is not None and _noted.get(name) == os.fspath(art.path):
        return "recorded"
    why = refusal(cache, art, tools, checking, named) or (seen if isinstance(seen, str) else None)
    if why is None and name is None:
        why = "the call has no name here"
    if why == "recorded":
        return why
    if why is None:
        why = _write(cache, name, call, root, art, tools, bases, seen, files)  # type: ignore[arg-type]
    if why is None:
        _noted[name] = os.fspath(art.path)
    elif why == "unsettled":
        if not _later:
            import atexit

            atexit.register(_at_exit)
        _later[name] = (cache, name, call, root, art, tools, bases, seen, files)
    else:
        _counted(cache, why)
    return why


def _counted(cache: Cache, why: str) -> None:
    """A full lookup that wrote no record, counted by its reason (`abicache stats`): a call
    never served by a record says why. Paths are left out of the reason: one count each."""
    from ..store import counters

    stem = " ".join("<path>" if word.startswith("/") else word for word in why.split(": ", 1)[0].split())
    try:
        counters.count(cache.store, **{f"unrecorded:{stem}": 1})
    except Exception:  # noqa: BLE001  statistics only inform
        pass


def _at_exit() -> None:
    """The records whose witnesses were too young when their lookup ended (a build's): wait
    out what is left of a clock tick, check the entry as the next lookup would (which
    stamps it: store/stamps.py), and record it, once."""
    pending = list(_later.values())
    _later.clear()
    if pending:
        time.sleep(stamps.FINE_SECONDS * 2)
    for cache, name, call, root, art, tools, bases, seen, files in pending:
        try:
            store = cache.store
            if store.check(art.path, art.manifest, max_age=cache.verify_age) is not None or (
                    art.manifest.recorded and store.deps_changed(art.path, art.manifest, bases) is not None):
                continue
            _write(cache, name, call, root, art, tools, bases, seen, files)
        except Exception:  # noqa: BLE001  a record only saves time: never a reason for an exit to fail
            pass


def refusal(cache: Cache, art: Artifact, tools: Sequence[str], checking: bool,
            named: Mapping[str, str | None] = {}) -> str | None:
    """Why no record may stand for this lookup (module docstring), or None. named: facts the
    call names, each as the lookup must have found it."""
    if not cache.as_opened():  # given settings, set by hand, or a view (pins, other facts, a fallback store)
        return "a Cache with settings of its own"
    if checking:
        return "ABICACHE_CHECK samples hits"
    if art.origin not in ("local", "built") or art.kind not in KINDS:
        return f"an entry of origin {art.origin}, kind {art.kind}"
    if not set(tools) <= set(TOOLS) | cuda_witness.TOOLS | set(named):
        return f"tools {sorted(set(tools) - set(TOOLS) - cuda_witness.TOOLS - set(named))}"
    facts = {r.name for r in art.requirements}
    if not facts <= COVERED_FACTS | CXX_FACTS | cuda_witness.FACTS | set(named):
        return f"requirements on {sorted(facts - COVERED_FACTS - CXX_FACTS - cuda_witness.FACTS - set(named))}"
    differing = sorted(fact for fact, value in named.items() if cache.facts.get(fact) != value)
    if differing:
        return f"facts the lookup found otherwise than the call names: {differing}"
    if cache.verify_age != config.seconds("ABICACHE_VERIFY_AGE") or \
            cache.touch_interval != config.seconds("ABICACHE_TOUCH_INTERVAL"):
        return "a Cache whose ages were changed"
    if checked.unknown_variables():
        return "an ABICACHE_* variable that is no setting"
    return None


def _write(cache: Cache, name: str, call: bytes, root: str, art: Artifact, tools: Sequence[str],
           bases: dict[str, str], seen: Witnesses, files: Files = ()) -> str | None:
    """Every witness is taken now and each must stand where the lookup's verdict stood
    (witnessed()); the record is written where all have settled and the entry is not due."""
    real = os.path.realpath(root)
    if hits.name(call, root) != name or real != os.fspath(cache.store.root):
        return "another environment or store"
    now = time.time_ns()
    taken = witnessed(cache, art, _words(tools), bases, seen, files=files)
    if isinstance(taken, str):
        return taken
    names, deadline, witnesses, build = taken
    gpu = ""
    if cuda_witness.needed(art, tools):  # the GPU facts' premise: among the store's witnesses
        more: Witnesses = []
        gpu = cuda_witness.taken(cache, art, more)
        if gpu.startswith("no: "):
            return gpu[4:]
        if not all(stamps.settled(w[2], now) and stamps.settled(w[3], now) for k, _, w in more if k == "l"):
            return "unsettled"
        witnesses[build:build] = more
        build += len(more)
    try:
        links, hops = _hops([p for k, p, _ in witnesses[build:] if k == "k"])
    except OSError as exc:
        return f"changed while recorded: {exc}"
    if any(not stamps.settled(w[2], now) or not stamps.settled(w[3], now) for _, _, w in hops):
        return "unsettled"
    witnesses += hops
    helper = _helper(cache, art, len(witnesses) - build)
    data = record.encode(deadline, real, os.fspath(art.file()), os.fspath(art.path), names, cache.touch_interval,
                         art.manifest.build_seconds or 0.0, build, witnesses, helper, _plan(witnesses[build:], links), gpu)
    put(cache.store, hits.folder(real), name, data)
    if helper:
        _keep(real, name)
    return None


def _keep(real: str, name: str) -> None:
    """The store's keeper learns a record large enough to be worth it (keeper.py), started
    where none answers: this process ran a full lookup (a hit starts none)."""
    from . import keeper

    try:
        keeper.keep(real, name)
    except Exception:  # noqa: BLE001  a keeper only saves time
        pass


def _hops(links: Sequence[str]) -> tuple[set[str], Witnesses]:
    """(the folder each of these symbolic links leads through, an l witness of each link
    met on the way): the watch the record plans watches those folders, and a link replaced
    or retargeted since (a new inode) makes the record hold nothing. OSError: a link
    changed while it was recorded."""
    from ..store import watch

    met: dict[str, Witness] = {}
    folders: set[str] = set()
    for path in links:
        for link, folder in watch.link_hops(path):
            st = os.lstat(link)
            if not stat.S_ISLNK(st.st_mode):
                raise OSError(f"{link}: no longer a symbolic link")
            met.setdefault(link, ("l", link, _stat(st)))
            folders.add(folder)
    return folders, list(met.values())


def _plan(built: Witnesses, links: set[str]) -> list[tuple[str, int]]:
    """The in-process watch of what the build read, planned (store/watch.py plan): what the
    served call arms before it checks a witness of the build."""
    from ..store import watch

    files = [p for k, p, _ in built if k in "fnks"]
    folders = {*(p for k, p, _ in built if k == "d"), *(os.path.dirname(p) for k, p, _ in built if k == "m")}
    reached_otherwise = {p for k, p, _ in built if k in "kn"}
    return watch.plan(files, sorted(folders), (links, reached_otherwise))


def _recorded(art: Artifact) -> int:
    """How many witnesses of its build a record of this entry holds, about (one a file read, a
    system file, a folder whose missing names were looked for)."""
    manifest = art.manifest
    return len(manifest.deps) + len(manifest.absent) + sum(len(group.paths()) for group in manifest.system)


def _helper(cache: Cache, art: Artifact, count: int) -> str:
    """native.py's check, where a record has enough witnesses of its build for it to save
    time: built beside a build (this process compiled anyway; a hit spawns nothing), found
    where it was built before; "" where there is none."""
    from . import native

    if count < native.WORTH:
        return ""
    tools = os.fspath(cache.store.layout.tools)
    if art.origin != "built":
        found = native.existing(tools)
        return found or ""
    try:
        words = toolid.command(*TOOLS["compiler.cc"])
        return native.build(tools, words[toolid.compiler_at(words)]) or ""
    except (OSError, ValueError, IndexError):  # no C compiler to name: checked in Python
        return ""


def witnessed(cache: Cache, art: Artifact, compilers: Sequence[tuple[str, str]], bases: dict[str, str],
              seen: Witnesses, more: Witnesses = (), unlisted: Callable[[str], bool] = lambda name: False,
              files: Files = ()) -> tuple[list[str], float, Witnesses, int] | str:
    """(the entry's names, the record's deadline, every witness, where the build's start),
    or why no record may be written. Each witness must stand where the lookup's verdict
    stood: the store's folders pass the trust check, the entry's files are those its stamp
    vouches for, the build's witnesses those its stamp found current (deps_changed), the
    config files, compilers and files as looked_at() saw them (seen), and `more` (the caller's:
    a source file) as it gave them. So no change between the lookup and now is recorded
    as what the lookup found. unlisted: names of the entry's folder neither listed nor
    witnessed (the launcher's records leave out its stamps: launcher/records.py)."""
    store = cache.store
    now = time.time_ns()  # before any stat: every witness must be older than a tick before it
    witnesses: Witnesses = []
    vdir = os.fspath(art.path)
    try:
        every = os.listdir(vdir)
        names = [n for n in every if not unlisted(n)]  # the entry's names, each file among them witnessed
        stamp = stamps.read(art.path, store.trust.ok, sorted(f.path for f in art.manifest.files), every)
        why = _store(store, art, names, stamp, witnesses)
        if why is None:
            looked: Witnesses = []
            why = _settings(store, looked) or _compilers(cache, compilers, looked) or _files(cache, files, looked)
            if why is None and looked != seen:
                why = "a config file, a compiler or a file changed while it was looked up"
            witnesses += looked
        why = why or _code(witnesses) or _runtime(art, witnesses)
        witnesses += more
        build = len(witnesses)
        why = why or _build(art, bases, stamps.read_deps(art.path, store.trust.ok), witnesses)
    except OSError as exc:  # something moved while it was recorded: the next lookup records it
        return f"changed while recorded: {exc}"
    if why is not None:
        return why
    if not all(kind in "tam" or (stamps.settled(w[2], now) and stamps.settled(w[3], now))
               for kind, _, w in witnesses):
        return "unsettled"
    deadline = stamp.verified + cache.verify_age
    if deadline <= time.time() + 1:
        return "due"
    return names, deadline, witnesses, build


def _store(store: Any, art: Artifact, names: Sequence[str], stamp: Any, out: Witnesses) -> str | None:
    """The root, the folders above it, the layout's folders down to the entry (each passing
    the trust check now: store/trust.py), the key's variants (its link, else its prefix
    folder's listing), the entry's folder and files (each one its stamp vouches for)."""
    real = os.fspath(store.root)
    above, folder = [], os.path.dirname(real)
    while True:
        above.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for path in reversed(above):
        st = os.lstat(path)
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            return f"{path} may be written by anyone"
        out.append(("t", path, _trust(st)))
    vdir = os.fspath(art.path)
    prefix = os.path.dirname(vdir)
    for path in (real, os.path.join(real, hits.LAYOUT), os.fspath(store.layout.entries), os.path.dirname(prefix),
                 prefix, vdir):
        st = os.lstat(path)
        if not (store.trust.ok(st) and stat.S_ISDIR(st.st_mode)):
            return f"{path} is not a folder the store trusts"
        out.append(("t", path, _trust(st)))  # the entry's own: its names are the record's, its mtime the last use
    hinted = store.hinted_variant_dirs(art.kind, art.key)
    link = os.fspath(store.layout.variants_link(art.kind, art.key))
    if hinted is not None and [os.fspath(v) for v in hinted] == [vdir]:
        out.append(("l", link, _stat(os.lstat(link))))
    elif hinted is None and [os.fspath(v) for v in store.variant_dirs(art.kind, art.key)] == [vdir]:
        out += [("l", prefix, _stat(os.lstat(prefix))), ("a", link, (0, 0, 0, 0))]
    else:
        return "several variants of the key"
    files = {f.path for f in art.manifest.files}
    for entry in sorted(names):
        if entry.startswith((".abicache-m.", stamps.NAME_PREFIX)):
            continue  # names that are their content: the listing's
        path = os.path.join(vdir, entry)
        st = os.lstat(path)
        if entry in files and not (stat.S_ISREG(st.st_mode) and not st.st_mode & 0o222 and store.trust.ok(st)
                                   and stamp.vouches_for(entry, st)):
            return "unsettled"  # a file its stamp does not vouch for (yet): the next lookup hashes it
        out.append(("l", path, _stat(st)))
    return None


def _settings(store: Any, out: Witnesses) -> str | None:
    """The config files (settings/settings_file.py), there or not."""
    for path in (os.fspath(settings_file.user_file()), os.fspath(settings_file.store_file(store.root))):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            out.append(("a", path, (0, 0, 0, 0)))
            continue
        if not stat.S_ISREG(st.st_mode):
            return f"config file {path} is not a regular file"
        out.append(("l", path, _stat(st)))
    return None


def _compilers(cache: Cache, compilers: Sequence[tuple[str, str]], out: Witnesses) -> str | None:
    """Each compiler of the key as PATH finds it (every place looked at before it too), and
    the memo of its identity (env/toolid.py)."""
    memo_dir = store_tools = cache.facts.memo_dir
    if store_tools is not None:
        out.append(("t", os.fspath(store_tools), _trust(os.lstat(store_tools))))
    for word, what in compilers:
        probed, word = (True, "nvcc") if word == NVCC else (False, word)
        found = toolid.which(word)
        if found is None and not probed:
            return f"no {word} on PATH"
        if os.sep not in word:
            for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
                candidate = os.path.join(folder or ".", word)
                if found is not None and candidate == os.fspath(found):
                    break
                why = _there_or_not(candidate, out)
                if why is not None:
                    return why
        if found is None:  # nvcc under a CUDA home: each place before it is witnessed too
            found = _cuda_home_nvcc(out)
            if found is None:
                return "no nvcc on PATH nor under a CUDA home"
        out.append(("s", os.fspath(found), _stat(os.stat(found))))
        if not _memo(toolid.memo_file(found, what, memo_dir), out):
            return f"no memo of {found}'s identity"
    return None


def _cuda_home_nvcc(out: Witnesses) -> Any:
    """nvcc as env/probes.py finds it where PATH has none: the first CUDA home's that is a
    file, each place before it witnessed (there or not); None where none is."""
    for path in probes.cuda_home_tools("nvcc"):
        if path.is_file():
            return path
        if _there_or_not(os.fspath(path), out) is not None:
            return None
    return None


def _there_or_not(path: str, out: Witnesses) -> str | None:
    """The file at path (through links), or its absence; a link to nothing is neither (why)."""
    try:
        out.append(("s", path, _stat(os.stat(path))))
    except FileNotFoundError:
        try:
            os.lstat(path)
            return f"{path} is a link to nothing"
        except FileNotFoundError:
            out.append(("a", path, (0, 0, 0, 0)))
    return None


def _memo(memo: Any, out: Witnesses) -> bool:
    """A memo under tools/ (env/toolid.py), where there is one to witness; False where it is missing."""
    if memo is not None:
        try:
            out.append(("l", os.fspath(memo), _stat(os.lstat(memo))))
        except FileNotFoundError:
            return False
    return True


def _files(cache: Cache, files: Files, out: Witnesses) -> str | None:
    """Each file as the lookup read it (through links), or its absence, and its memo."""
    from pathlib import Path

    for path, memo_name in files:
        why = _there_or_not(path, out)
        if why is not None:
            return why
        if out[-1][0] == "a":
            continue
        if memo_name and not _memo(toolid.memo_file(Path(path), memo_name, cache.facts.memo_dir), out):
            return f"no memo of {path}"
    return None


def _code(out: Witnesses) -> str | None:
    """abicache's own modules, which made the lookup: a checkout edited, or a release installed
    over another of the same version, is the full lookup again."""
    import sys

    for name, module in sorted(sys.modules.items()):
        if name == "abicache" or name.startswith("abicache."):
            path = getattr(module, "__file__", None)
            if path is None:
                return f"module {name} has no file"
            out.append(("s", path, _stat(os.stat(path))))
    return None


def _runtime(art: Artifact, out: Witnesses) -> str | None:
    """The C++ runtime this process loads, where a requirement reads its versions."""
    if not {r.name for r in art.requirements} & CXX_FACTS:
        return None
    from ..native.loaded import libstdcxx_path

    path = libstdcxx_path()
    if path is None:
        return "no C++ runtime to witness"
    out.append(("c", path, _stat(os.stat(path))))
    return None


def _build(art: Artifact, bases: dict[str, str], remembered: dict[str, list[int]], out: Witnesses) -> str | None:
    """What the build recorded: the files it read, the folders it listed, the folders of the
    paths it looked for and did not find, the system files (store/deps.py); each at the
    witness the entry's stamp remembers it found current at (remembered)."""
    manifest = art.manifest
    found: Witnesses = []
    for dep in manifest.deps:
        path = depcheck.resolve(dep, bases)
        if path is None:
            return f"no base {dep.base!r}"
        found.append(("d", path, _stat(os.stat(path))) if dep.sha256.startswith(LISTING) else _file(path))
    for group in manifest.absent:
        path = depcheck.resolve(depcheck.Dependency(group.base, group.folder, ""), bases)
        if path is None:
            return f"no base {group.base!r}"
        held = _stat(os.stat(path))
        if remembered.get(path) != [*held]:
            return "unsettled"  # its names were not found missing at this witness (yet)
        if group.base == "abs":  # a system or PATH folder: its names change rarely, one stat for all
            found.append(("d", path, held))
            continue
        # a project's folder (the working directory): each name, as store/deps.py _appeared looks
        found += [("m", os.path.join(path, head), (0, 0, 0, 0))
                  for head in sorted({name.partition("/")[0] for name in group.paths()})]
    for group in manifest.system:
        found.append(("d", group.folder, _stat(os.stat(group.folder))))
        found += [_file(path) for path in group.paths()]
    if not all(kind == "m" or remembered.get(path) == [*w] for kind, path, w in found):
        return "unsettled"  # a witness the stamp does not hold as current: the next lookup checks it
    out += found
    return None


def _file(path: str) -> Witness:
    """A file the build read, as a hit record names it (record.py): f (no symbolic link leads
    to it), n (a file with other hard links), k (a symbolic link): what the in-process watch
    must know of each, so that the hit arms it before it checks a witness. One lstat, and a
    stat through a link: what os.stat alone cost. A file that is no longer so at the hit does
    not hold (a link made or replaced is a new inode or a new ctime)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "k", path, _stat(os.stat(path))
    return ("n" if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode) else "f"), path, _stat(st)


def _stat(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _trust(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_mode, st.st_uid, st.st_gid)


def put(store: Any, folder: str, name: str, data: bytes) -> None:
    """One rename: a reader sees the old record or the new one. A record that is already
    there as it would be written is left as it is (a hit writes nothing it need not)."""
    from pathlib import Path

    target = os.path.join(folder, name)
    if record.read(target) == data:
        return
    try:
        if not os.path.isdir(folder):
            store.make_dir(Path(folder))
        temp = os.path.join(folder, f".{name}.{os.getpid()}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except OSError:
        pass  # a record only saves time: a store we cannot write serves hits the full way
