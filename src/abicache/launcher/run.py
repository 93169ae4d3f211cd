"""`abicache COMPILER ARGS...`: one compile served from the store, or built and kept.

What it cannot cache (launcher/command.py) runs as written and is counted by reason;
what it can is keyed as the JIT path keys an object (the source's bytes, every word of
the command, the compiler's identity, the variables that steer it, the record scheme),
looked up and checked as any entry (the record of what the compile read, engine/record.py),
and on a hit its files are written where the compiler would have written them and its
output printed again. abicache's own failures never fail a build: the compiler runs as
written, and the reason is printed once.
"""

from __future__ import annotations

import os
import sys

from . import command, paths

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Sequence

    from ..core.artifact import Artifact
    from ..core.cache import Cache

#: the entries of compiles the launcher made
KIND = "cc.compile"
#: set by a warm launcher's fork (launcher/warm.py): HANDOFF() has the front run a command the
#: cache cannot serve, as written; EARLY() answers it once a miss's outputs are kept
HANDOFF: Callable[[], None] | None = None
EARLY: Callable[[], None] | None = None


def main(argv: Sequence[str]) -> int:
    """Run argv (the compiler and its words) through the cache; the compiler's exit status."""
    from ..settings import config

    cwd = logical_cwd()
    base = paths.base_folder(config.text("ABICACHE_BASE_DIR"))
    words = [argv[0], *paths.relative(argv[1:], cwd, base)]
    asked = command.classify(words, os.environ)
    if isinstance(asked, command.Uncacheable):
        return _as_written(argv, asked.reason)
    try:
        return _cached(words, asked, argv, cwd, base)
    except _Unusable as exc:
        return _as_written(argv, exc.reason, exc.say)
    except KeyboardInterrupt:  # make's Ctrl-C reached the compiler too: no traceback of ours
        return 130


class _Unusable(Exception):
    """The cache cannot serve this compile: it runs as written (say: a line for the user)."""

    def __init__(self, reason: str, say: str = "") -> None:
        super().__init__(reason)
        self.reason, self.say = reason, say


def _cached(words: list[str], asked: command.Compile, argv: Sequence[str], cwd: str, base: str | None) -> int:
    from ..errors import AbicacheError
    from . import entry

    cache = _cache()
    inputs = _inputs(cache, words, asked, cwd, base)
    seen = _looked_at(cache, words[0], asked)
    ran = entry.Ran(EARLY)
    name = os.path.basename(asked.source) or "source"
    try:
        found = cache.unaudited("object").get_or_build(KIND, name, inputs, _builder(cache, words, asked, ran),
                                                       bases={"cwd": os.getcwd()})
        if ran.stdout is None:  # a hit: its files where the compiler writes them
            _replay(found, asked)
    except entry.Failed as exc:
        entry.write_out(exc.stdout, exc.stderr)
        return exc.status
    except (AbicacheError, OSError) as exc:
        if ran.stdout is None:  # nothing ran yet: the compiler runs as written
            raise _Unusable("abicache error", f"abicache: {exc}; compiling without the cache") from None
        if not ran.answered:
            entry.write_out(ran.stdout, ran.stderr)  # compiled, not kept: the build goes on
        sys.stderr.write(f"abicache: the object was built but not cached: {exc}\n")
        return 0
    if ran.stdout is not None and not ran.answered:  # built here: the outputs are where the compiler wrote them
        entry.write_out(ran.stdout, ran.stderr)
    _note(cache, argv, asked, found, seen, built=ran.stdout is not None)
    return 0


def _looked_at(cache: Cache, compiler: str, asked: command.Compile) -> list | None:
    """The config files and the compiler before the lookup (a record is written only where
    they stand the same after it: launcher/records.py)."""
    from ..env.probes import IDENTITY_MEMO
    from . import records

    try:
        return records.before(cache, compiler, IDENTITY_MEMO[asked.family])
    except Exception:  # noqa: BLE001  a record only saves time
        return None


def _note(cache: Cache, argv: Sequence[str], asked: command.Compile, found: Artifact, seen: list | None,
          built: bool) -> None:
    """The hit record the native front serves the next run from (launcher/records.py)."""
    from ..env.probes import IDENTITY_MEMO
    from .. import hits
    from ..values.digest import sha256_hex
    from . import records

    root = hits.default_root()
    if root is None or seen is None:
        return
    witness = source_witness(asked)
    if witness is None:
        return
    try:
        sha = sha256_hex(_code(asked).encode("utf-8", "surrogateescape"))  # the bytes as read (tree.read_source)
        records.note(cache, root, argv, asked, found, IDENTITY_MEMO[asked.family], seen, built, witness, sha)
    except Exception:  # noqa: BLE001  a record only saves time
        pass


def _builder(cache: Cache, words: list[str], asked: command.Compile, ran: Any) -> Any:
    """The miss's builder, its modules (the engine, the observer) imported only when it runs."""
    def build(out: Any) -> Any:
        from . import compiling

        return compiling.build(cache, words, asked, _code(asked), ran, out)

    return build


def _cache() -> Cache:
    from ..core.cache import Cache
    from ..errors import AbicacheError

    try:
        cache = Cache()
        cache.store  # opened now: a store that cannot be used is said once, here
        return cache
    except (AbicacheError, OSError) as exc:
        raise _Unusable("store unusable", f"abicache: {exc}; compiling without the cache") from None


def _inputs(cache: Cache, words: list[str], asked: command.Compile, cwd: str, base: str | None):  # noqa: ANN202
    """The key's inputs: the source's bytes, every word after the compiler, the compiler's
    identity and the name it runs under, the steering variables, the working directory
    where the output embeds it."""
    from ..core.key import Inputs
    from ..engine import steer
    from ..env import probes, toolid

    found = toolid.which(words[0])
    if found is None:
        raise _Unusable("compiler not found")
    identity = probes.identity(found, asked.family, cache.store.layout.tools)
    if not identity:
        raise _Unusable("compiler identity unknown")
    extra = {**steer.key_extra(cuda=asked.family == "nvcc"), "compiler": identity,
             "driver": os.path.basename(os.path.realpath(found)),
             "words": "\0".join(paths.key_words(words[1:], cwd, base)), "folder": paths.key_folder(words[1:], cwd)}
    return Inputs.make({asked.source: _code(asked)}, extra=extra)


#: source -> (its bytes as text, its witness when they were read, or None where a write in the
#: same clock tick could hide: then no hit record binds the entry to the file's stat)
_codes: dict[str, tuple[str, tuple[int, int, int, int] | None]] = {}


def _code(asked: command.Compile) -> str:
    """The source's bytes as text (engine/tree.read_source), read once."""
    return _read(asked.source)[0]


def source_witness(asked: command.Compile) -> tuple[int, int, int, int] | None:
    """The source's stat as it was when the key read its bytes (launcher/records.py witnesses
    the file by it, never by a later stat, which may be of other bytes)."""
    return _read(asked.source)[1]


def _read(source: str) -> tuple[str, tuple[int, int, int, int] | None]:
    import time

    from ..engine.tree import read_source
    from ..errors import AbicacheError
    from ..store import stamps

    known = _codes.get(source)
    if known is None:
        try:
            now = time.time_ns()
            before = os.stat(source)
            code = read_source(source)
            after = os.stat(source)
        except (AbicacheError, OSError):
            raise _Unusable("source unreadable") from None  # the compiler says it in its own words
        witness = (before.st_ino, before.st_size, before.st_mtime_ns, before.st_ctime_ns)
        same = witness == (after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns)
        settled = stamps.settled(before.st_mtime_ns, now) and stamps.settled(before.st_ctime_ns, now)
        known = _codes[source] = (code, witness if same and settled else None)
    return known


def _replay(found: Artifact, asked: command.Compile) -> None:
    """Write the entry's files where the compiler writes them (each whole, by a rename),
    and print what it printed (an OSError: the entry went meanwhile, gc; the compiler runs)."""
    from .entry import STDERR, STDOUT, output_name, write_out

    if any(not os.path.isdir(os.path.dirname(path) or ".") for path in asked.outputs):
        raise _Unusable("output folder missing")  # the compiler's own error says which
    printed = [_printed(found, name) for name in (STDOUT, STDERR)]
    for index, path in enumerate(asked.outputs):
        _copy(str(found.file(output_name(index))), path)
    write_out(*printed)


def _printed(found: Artifact, name: str) -> bytes:
    """What the compile printed there (an entry keeps no file for nothing printed)."""
    return found.file(name).read_bytes() if any(f.path == name for f in found.manifest.files) else b""


def _copy(source: str, target: str) -> None:
    import shutil

    temporary = f"{target}.abicache-{os.getpid()}.tmp"
    try:
        shutil.copyfile(source, temporary)  # a new file, its mode by the umask, as the compiler's
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _as_written(argv: Sequence[str], reason: str, say: str = "") -> int:
    """Run the command unchanged (this process becomes the compiler), counted by reason."""
    if say:
        sys.stderr.write(say + "\n")
    _count_uncacheable(reason)
    if HANDOFF is not None:
        HANDOFF()  # a warm launcher's fork: the front runs it (never returns)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], list(argv))
    except OSError as exc:
        sys.stderr.write(f"abicache: cannot run {argv[0]!r}: {exc.strerror}\n")
        return 127
    return 127  # not reached: execvp returns only by raising


def _count_uncacheable(reason: str) -> None:
    """Counted as ccache counts them; never in the way of the command."""
    try:
        from ..core.cache import Cache
        from ..store import counters

        store = Cache().store
        counters.count(store, uncacheable=1, **{f"uncacheable:{reason}": 1, counters.by_kind(KIND, "uncacheable"): 1})
        counters.flush(store)  # written now: exec replaces this process, and its exit handlers with it
    except Exception:  # noqa: BLE001 — a store that cannot count does not stop the compile
        pass


def logical_cwd() -> str:
    """The working directory as the build system names it ($PWD where it is this folder:
    a link above it kept), which the paths it gives are made from."""
    here = os.getcwd()
    pwd = os.environ.get("PWD", "")
    if pwd.startswith("/") and pwd != here:
        try:
            if os.path.samestat(os.stat(pwd), os.stat(here)):
                return os.path.normpath(pwd)
        except OSError:
            pass
    return here
