"""The manifest: one JSON document per variant, schema-versioned.

A manifest read from disk (or from a remote) is untrusted input: `parse`
rejects unknown schema versions, wrong types, oversize fields and file names
that could escape the entry directory.
"""

from __future__ import annotations

import functools
import itertools
import json
import operator
import re

from ..errors import ManifestError, RequirementSyntaxError
from ..values.digest import sha256_hex
from ..values.records import named_tuple
from ..values.requirements import Requirements
from .layout import is_hex

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

SCHEMA = 1
FILENAME = "manifest.json"
MAX_BYTES = 4 << 20
MAX_FILES = 100_000
MAX_TEXT = 65_536


class _Hex:
    """Lower-case hex of a length in [shortest, longest]: match() as a pattern's, without
    compiling one at import (a hit imports this module; most patterns serve rarer paths)."""

    def __init__(self, shortest: int, longest: int) -> None:
        self.shortest, self.longest = shortest, longest

    def match(self, value: str) -> bool:
        return is_hex(value, self.shortest, self.longest)

    fullmatch = match


_SHA = _Hex(64, 64)
_HEX = _Hex(16, 64)


@functools.cache
def _pattern(text: str) -> re.Pattern[str]:
    """A pattern compiled at its first use (those for manifests from elsewhere, and errors)."""
    return re.compile(text)

RESERVED = frozenset({FILENAME})
#: names abicache writes beside an entry's files (stamps, temporary links)
RESERVED_PREFIX = ".abicache-"
_CONTROL = r"[\x00-\x1f\x7f-\x9f]"


def has_control(text: str) -> bool:
    """Whether text has a C0 or C1 control character or DEL. These are never printable,
    so printable text (nearly all) has none, and only the rest needs the pattern."""
    return not text.isprintable() and _pattern(_CONTROL).search(text) is not None


@named_tuple
class FileRecord:
    path: str  # relative, '/'-separated
    sha256: str
    size: int
    mode: int  # 0o444 or 0o555

    @property
    def executable(self) -> bool:
        return bool(self.mode & 0o111)


@named_tuple
class Dependency:
    """A file the compiler read that the key does not cover (a project header):
    its path relative to a named base (the sources' folder, an include root)
    and its sha256 when the entry was built. Lookups resolve the base anew, so
    the entry does not depend on where the project is checked out."""

    base: str  # "src", "inc0", ...; "abs" for a file outside every base (path is then absolute)
    path: str
    sha256: str


#: the base of a dependency that holds nowhere: the build could not be cached (engine/record.py);
#: its path is "[reason] why [unique id]"
UNCACHED = "uncached"


def uncached_reason(deps: Sequence[Dependency]) -> tuple[str, str] | None:
    """(the reason's short name, why) for an entry that is not cached, else None."""
    for dep in deps:
        if dep.base == UNCACHED:
            text = dep.path.rsplit(" [", 1)[0]
            reason, bracket, why = text[1:].partition("] ") if text.startswith("[") else ("", "", text)
            return (reason, why) if bracket else ("other", text)
    return None


@named_tuple
class Absent:
    """Paths the tools looked for and did not find (a header that would have
    shadowed the one used, a __has_include probe, a library tried): each must
    still be missing for the entry to hold. They are grouped under the nearest
    folder that existed, whose change time any creation, removal or rename in
    it moves, so a lookup stats one folder for all of them."""

    base: str  # as Dependency.base
    folder: str  # the folder that existed, as Dependency.path
    names: str  # the missing paths below it, '\n'-separated (one string: cheap to parse)

    def paths(self) -> list[str]:
        return self.names.split("\n")


@named_tuple
class System:
    """Files the build read in one system folder (deps.SYSTEM: where package managers
    write), recorded as one: the folder, the files' names, one sha256 over their
    names and contents. A lookup stats the folder and each file (a rewrite in place
    moves only the file's change time), and hashes them only where one moved; the
    manifest stays small for hundreds of system headers."""

    folder: str  # absolute
    names: str  # '\n'-separated, sorted
    sha256: str  # system_digest() of the files

    def paths(self) -> list[str]:
        return [f"{self.folder}/{name}" for name in self.names.split("\n")]


def system_digest(names: list[str], shas: list[str]) -> str:
    return sha256_hex("".join(f"{n}\0{sha}\n" for n, sha in zip(names, shas)).encode("utf-8", "surrogateescape"))


#: an environment variable that was not set
UNSET = "unset"


@named_tuple
class Manifest:
    key: str
    variant: str
    kind: str
    name: str
    files: tuple[FileRecord, ...]
    requirements: Requirements
    declared: Requirements = Requirements()
    detected: Requirements = Requirements()
    inputs: Mapping[str, Any] = {}  # never mutated: manifests are values
    facts: Mapping[str, Any] = {}
    audit: Mapping[str, Any] = {}
    builder: Mapping[str, Any] = {}
    abicache_version: str = ""
    created: float = 0.0
    build_seconds: float = 0.0
    signature: str | None = None
    deps: tuple[Dependency, ...] = ()
    absent: tuple[Absent, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # (variable the tools read, sha256 of its value or UNSET)
    system: tuple[System, ...] = ()  # files read in system folders, a group a folder

    @property
    def recorded(self) -> bool:
        """Whether the entry holds only while what its build read is unchanged."""
        return bool(self.deps or self.absent or self.env or self.system)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "key": self.key,
            "variant": self.variant,
            "kind": self.kind,
            "name": self.name,
            "files": {
                f.path: {"sha256": f.sha256, "size": f.size, "mode": f.mode} for f in self.files
            },
            "requirements": self.requirements.to_list(),
            "declared": self.declared.to_list(),
            "detected": self.detected.to_list(),
            "inputs": dict(self.inputs),
            "facts": dict(self.facts),
            "audit": dict(self.audit),
            "builder": dict(self.builder),
            "abicache_version": self.abicache_version,
            "created": self.created,
            "build_seconds": self.build_seconds,
            "signature": self.signature,
            **({"deps": [list(d) for d in self.deps]} if self.deps else {}),
            **({"absent": [list(a) for a in self.absent]} if self.absent else {}),
            **({"env": dict(self.env)} if self.env else {}),
            **({"system": [list(g) for g in self.system]} if self.system else {}),
        }

    def dumps(self, compact: bool = False) -> bytes:
        """The manifest as JSON: indented (what signatures cover, and what goes to a
        remote), or compact (the local store's file, parsed on every lookup)."""
        if compact:
            return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True).encode("utf-8")
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode("utf-8")

    def file(self, path: str) -> FileRecord:
        for record in self.files:
            if record.path == path:
                return record
        raise KeyError(path)


def preference(manifest: Manifest) -> tuple[int, float]:
    """Sort key among usable variants (reverse=True): the most specific first,
    like packaging.tags, then the newest."""
    return len(manifest.requirements), manifest.created


def variant_id(requirements: Requirements, deps: tuple[Dependency, ...] = (), absent: tuple[Absent, ...] = (),
               env: tuple[tuple[str, str], ...] = (), system: tuple[System, ...] = ()) -> str:
    """One variant per distinct requirement set and, where the compiler read
    files the key does not cover, per distinct set of their contents (and of
    the paths it found missing, and the variables it read)."""
    if not deps and not absent and not env and not system:
        return sha256_hex(f"variant-v1\0{requirements}".encode())[:16]
    listed = "\n".join(map("\0".join, sorted(deps)))  # base, path, sha256: joined in C
    if absent or env or system:
        listed += "\0absent\0" + "\n".join("\0".join(a) for a in sorted(absent))
        listed += "\0env\0" + "\n".join(f"{n}\0{v}" for n, v in sorted(env))
    if system:
        listed += "\0system\0" + "\n".join("\0".join(g) for g in sorted(system))
    text = f"variant-v2\0{requirements}\0{listed}"  # a name of bytes that are not UTF-8 counts by its bytes
    return sha256_hex(text.encode("utf-8", "surrogateescape"))[:16]


def variant_of(manifest: Manifest) -> str:
    return variant_id(manifest.requirements, manifest.deps, manifest.absent, manifest.env, manifest.system)


#: the characters of the names almost every entry has ("add.cubin", "lib/x.so")
_PLAIN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-./")


def _plain(path: str) -> bool:
    """Plain characters, not starting with '.' or '/', no empty, '.' or '..' part: checked without a
    pattern (compiling one cost every fresh process 0.5 ms); anything else goes the long way."""
    return (0 < len(path) <= 4096 and path[0] not in "./" and _PLAIN_CHARS.issuperset(path)
            and "//" not in path and not path.endswith("/") and "/./" not in path and "/../" not in path
            and not path.endswith(("/.", "/..")))


def safe_relpath(path: Any) -> str:
    """A relative '/' path that stays inside its directory, or ManifestError."""
    if type(path) is str and _plain(path) \
            and not path.startswith(RESERVED_PREFIX) and "/" + RESERVED_PREFIX not in path and path not in RESERVED:
        return path  # no empty, '.' or '..' part, no control character, no reserved name
    if not isinstance(path, str) or not path or len(path) > 4096 or "\0" in path:
        raise ManifestError(f"file name {path!r} is not a usable relative path")
    if path.startswith("/") or "\\" in path or (path[1:2] == ":" and path[:1].isascii() and path[:1].isalpha()):
        raise ManifestError(f"file name {path!r} is absolute; only relative paths are allowed")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise ManifestError(f"file name {path!r} has an empty, '.' or '..' part")
    if path in RESERVED or any(part.startswith(RESERVED_PREFIX) for part in path.split("/")):
        raise ManifestError(f"file name {path!r} is reserved for abicache")
    return check_text(path, "file name")


def check_text(text: str, what: str) -> str:
    """No control characters (they spoof terminal output: a newline makes a
    second row in `abicache show`) and valid UTF-8 (no lone surrogates)."""
    if has_control(text):
        raise ManifestError(f"{what} {text!r} contains a control character; use printable characters only")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ManifestError(f"{what} {text!r} is not valid UTF-8 (a lone surrogate, or undecodable "
                            "bytes in a file name)") from None
    return text


def _text(doc: Mapping[str, Any], name: str, pattern: _Hex | None = None) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ManifestError(f"field {name!r} must be a string, got {type(value).__name__}")
    if pattern is not None and not pattern.match(value):
        raise ManifestError(f"field {name!r} = {value[:80]!r} has the wrong form")
    return value


def _name(doc: Mapping[str, Any]) -> str:
    name = _text(doc, "name")
    try:
        return check_text(name, "name")
    except ManifestError as exc:
        raise ManifestError(f"field 'name': {exc}") from None


def _mapping(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise ManifestError(f"field {name!r} must be an object")
    return value


def _number(doc: Mapping[str, Any], name: str) -> float:
    value = doc.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ManifestError(f"field {name!r} must be a number")
    return float(value)


def _requirements(doc: Mapping[str, Any], name: str) -> Requirements:
    value = doc.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ManifestError(f"field {name!r} must be a list of requirement strings")
    try:
        return Requirements.of(value)
    except RequirementSyntaxError as exc:
        raise ManifestError(f"field {name!r}: {exc}") from None


def _files(doc: Mapping[str, Any]) -> tuple[FileRecord, ...]:
    files = doc.get("files")
    if not isinstance(files, dict) or not files or len(files) > MAX_FILES:
        raise ManifestError(f"field 'files' must be an object of 1 to {MAX_FILES} files")
    records = []
    nested = False
    safe = _SAFE_PATHS
    for path, meta in sorted(files.items()):
        if path not in safe:
            _remember_safe(safe_relpath(path))
        if type(meta) is not dict:
            raise ManifestError(f"file {path!r}: record must be an object")
        sha, size, mode = meta.get("sha256"), meta.get("size"), meta.get("mode")
        if type(sha) is not str or len(sha) != 64 or sha.strip("0123456789abcdef"):
            raise ManifestError(f"file {path!r}: sha256 must be 64 lower-case hex digits")
        if type(size) is not int or size < 0:  # a bool is not a size
            raise ManifestError(f"file {path!r}: size must be a non-negative integer")
        if mode != 0o444 and mode != 0o555:
            raise ManifestError(f"file {path!r}: mode must be 0o444 or 0o555, got {mode!r}")
        records.append(_new_record((path, sha, size, mode)))
        nested = nested or "/" in path
    if nested:  # only a path with a folder can lie below another file
        _no_file_below_file(records)
    return tuple(records)


#: file names safe_relpath passed in this process: most entries of a project repeat them
#: ("kernel.cubin", "lib/x.so"), and a lookup checks every one (bounded: a set, cleared when full)
_SAFE_PATHS: set[str] = set()


def _remember_safe(path: str) -> None:
    if len(_SAFE_PATHS) >= 65536:
        _SAFE_PATHS.clear()
    _SAFE_PATHS.add(path)


_new_record = functools.partial(tuple.__new__, FileRecord)


_DEP_BASE = r"[a-z][a-z0-9_]{0,31}"
_DEP_SHA = _SHA
#: a dependency whose sha256 starts so (then 64 hex digits) is a folder a tool listed, by its names (deps.listing_digest)
LISTING = "listing:"
#: a path's characters: printable (a backslash is a file name's character on POSIX: the
#: compiler reads `a\b.h` as that name, and a dependency is only stat'ed and hashed), and
#: bytes that are not UTF-8 as Python names them (surrogateescape: U+DC80 to U+DCFF)
_DEP_CHARS = r"[^\x00-\x1f\x7f-\x9f\ud800-\udc7f\udd00-\udfff]{1,4096}"


def _deps(doc: Mapping[str, Any], local: bool) -> tuple[Dependency, ...]:
    """[[base, path, sha256], ...]: a relative path inside a named base, or an
    absolute one under base "abs"; printable, no empty or '.'
    parts ('..' stays as the compiler spelled it). A manifest from the local
    store (owner-checked, and validated in full when it came from a remote)
    gets the structural check only: a
    dependency is only ever stat'ed and hashed, never written or loaded, and
    real projects list hundreds on every lookup."""
    value = doc.get("deps", [])
    if not isinstance(value, list) or len(value) > MAX_FILES:
        raise ManifestError(f"field 'deps' must be a list of at most {MAX_FILES} dependencies")
    if local:  # structure only, in loops that run in C: hundreds a lookup
        shaped = {type(i) for i in value} <= {list} and {len(i) for i in value} <= {3} and _all_text(value)
    else:
        shaped = all(map(_good_dep, value))
    if not shaped:
        item = next(i for i in value if not (_shaped_dep if local else _good_dep)(i))
        raise ManifestError(f"dependency {item!r} is not [base, relative path, sha256] (or [\"abs\", "
                            "absolute path, sha256]) of printable characters without empty or '.' parts")
    made = tuple(map(_new_dep, value))  # tuple.__new__: a third of Dependency._make's time
    if all(map(operator.lt, value, value[1:])):  # as written: sorted, no repeats
        return made
    return tuple(sorted(set(made)))


def _all_text(rows: list[list[Any]]) -> bool:
    try:
        "".join(itertools.chain.from_iterable(rows))
    except TypeError:
        return False
    return True


_new_dep = functools.partial(tuple.__new__, Dependency)


def _absent(doc: Mapping[str, Any], local: bool) -> tuple[Absent, ...]:
    """[[base, folder, "name\\nname..."], ...], checked as dependencies are
    (each missing path is only ever stat'ed)."""
    value = doc.get("absent", [])
    if not isinstance(value, list) or len(value) > MAX_FILES:
        raise ManifestError(f"field 'absent' must be a list of at most {MAX_FILES} folders")
    for item in value:
        shaped = _shaped_dep(item) and item[2] and "\0" not in item[2]
        if not shaped or not (local or _good_folder(item[0], item[1])):
            raise ManifestError(f"absent {item!r} is not [base, folder, missing names separated by newlines]")
    return tuple(sorted(map(Absent._make, value)))


def _system(doc: Mapping[str, Any], local: bool) -> tuple[System, ...]:
    """[[absolute folder, "name\\nname...", sha256], ...]"""
    value = doc.get("system", [])
    if not isinstance(value, list) or len(value) > MAX_FILES:
        raise ManifestError(f"field 'system' must be a list of at most {MAX_FILES} folders")
    for item in value:
        shaped = _shaped_dep(item) and item[1] and "\0" not in item[1] and item[0].startswith("/")
        if not shaped or not (local or (_good_folder("abs", item[0]) and _DEP_SHA.fullmatch(item[2]))):
            raise ManifestError(f"system {item!r} is not [absolute folder, file names separated by newlines, "
                                "sha256]")
    return tuple(map(System._make, value))


def _good_folder(base: str, folder: str) -> bool:
    """A folder as a dependency names a file, or a base's own root ('.'), or '/'."""
    if folder in (".", "/"):
        return bool(_pattern(_DEP_BASE).fullmatch(base)) and (folder == "/") == (base == "abs")
    return _good_dep([base, folder, "0" * 64])


def _env_name(name: str) -> bool:
    return 0 < len(name) <= 256 and "=" not in name and "\x00" not in name  # as the environment's names


def _env(doc: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """{variable: sha256 of its value, or "unset"} of the variables the tools read."""
    value = doc.get("env", {})
    if not isinstance(value, dict) or len(value) > 4096:
        raise ManifestError("field 'env' must be an object of at most 4096 variables")
    for name, digest in value.items():
        if not _env_name(name) or not (digest == UNSET or (isinstance(digest, str) and _SHA.match(digest))):
            raise ManifestError(f"env {name!r}: {digest!r} is not a sha256 or {UNSET!r}")
    return tuple(sorted(value.items()))


def _shaped_dep(item: Any) -> bool:
    return type(item) is list and len(item) == 3 and type(item[0]) is type(item[1]) is type(item[2]) is str


def _good_dep(item: Any) -> bool:
    if type(item) is not list or len(item) != 3 or not all(type(x) is str for x in item):
        return False
    base, path, sha = item
    listing = sha.startswith(LISTING) and bool(_SHA.fullmatch(sha[len(LISTING):]))
    if not ((listing or _DEP_SHA.fullmatch(sha)) and _pattern(_DEP_BASE).fullmatch(base)
            and _pattern(_DEP_CHARS).fullmatch(path)):
        return False
    if listing and path == "." and base != "abs":
        return True  # a base's own folder listed
    if path.startswith("/") != (base == "abs") or path == "/":
        return False
    # '..' may stand: the compiler's path, resolved by the kernel through the links it meets
    wrapped = f"/{path.strip('/')}/"
    return not (path.endswith("/") or "//" in path or "/./" in wrapped)


def _no_file_below_file(records: list[FileRecord]) -> None:
    paths = {r.path for r in records}
    for record in records:
        parts = record.path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in paths:
                raise ManifestError(f"file {record.path!r} lies below file {'/'.join(parts[:i])!r}")


def parse(data: bytes, *, local: bool = False) -> Manifest:
    """Validate raw manifest bytes; every problem is a ManifestError naming the
    field. local: read from this machine's store (see _deps)."""
    if len(data) > MAX_BYTES:
        raise ManifestError(f"manifest is {len(data)} bytes; the limit is {MAX_BYTES}")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"manifest is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ManifestError("manifest must be a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ManifestError(
            f"manifest schema {doc.get('schema')!r} is not supported (this abicache reads {SCHEMA}); "
            "it was written by a different abicache version"
        )
    signature = doc.get("signature")
    if signature is not None and not isinstance(signature, str):
        raise ManifestError("field 'signature' must be a string or null")
    return Manifest(
        key=_text(doc, "key", _SHA),
        variant=_text(doc, "variant", _HEX),
        kind=_text(doc, "kind"),
        name=_name(doc),
        files=_files(doc),
        requirements=_requirements(doc, "requirements"),
        declared=_requirements(doc, "declared"),
        detected=_requirements(doc, "detected"),
        inputs=_mapping(doc, "inputs"),
        facts=_mapping(doc, "facts"),
        audit=_mapping(doc, "audit"),
        builder=_mapping(doc, "builder"),
        abicache_version=_text(doc, "abicache_version"),
        created=_number(doc, "created"),
        build_seconds=_number(doc, "build_seconds"),
        signature=signature,
        deps=_deps(doc, local),
        absent=_absent(doc, local),
        env=_env(doc),
        system=_system(doc, local),
    )
