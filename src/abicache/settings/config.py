"""Settings read from the environment, with their defaults.

Every variable abicache reads is named here, so the docs and `abicache env`
can list them from one place.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import settings_file
from ..errors import ConfigError

#: variable name -> (default, meaning); the docs are generated from this table.
VARIABLES: dict[str, tuple[str, str]] = {
    "ABICACHE_DIR": ("<user cache dir>/abicache", "root of the local store"),
    "ABICACHE_SHARED": ("", "a group name: the store is shared by that group's members "
                        "(setgid, group-writable); empty: private to you"),
    "ABICACHE_VERIFY_AGE": ("604800", "seconds after which a hit re-hashes the files in full"),
    "ABICACHE_TOUCH_INTERVAL": ("600", "seconds between two last-use updates of one entry"),
    "ABICACHE_LOCK_TIMEOUT": ("900", "seconds to wait for another process building the same key"),
    "ABICACHE_EXPLAIN": ("0", "1: log why every miss missed"),
    "ABICACHE_PROGRESS": ("auto", "1/0: force build progress lines on stderr on/off"),
    "ABICACHE_REMOTE": ("", "shared remote store: s3://BUCKET/PREFIX?endpoint=URL&region=R, "
                        "redis://HOST:PORT/DB, file:///FOLDER, or https://HOST/PATH (a folder served by a web "
                        "server: read-only) (empty: none)"),
    "ABICACHE_REMOTE_MODE": ("read-write", "read: fetch from the remote, never upload "
                             "(machines the fleet should not trust)"),
    "ABICACHE_REMOTE_TIMEOUT": ("2", "seconds a remote request may wait to connect or for an "
                                "answer; after a failure the remote is skipped for the process"),
    "ABICACHE_REMOTE_LEASE": ("30", "seconds a fleet build lease lives without renewal: one machine builds "
                              "a key while the others wait for its upload (0: every machine builds)"),
    "ABICACHE_LEASE_STUCK": ("60", "seconds a fleet build may go without progress (CPU time of its processes) "
                             "before the machines waiting for it build it themselves"),
    "ABICACHE_LEASE_WAIT": ("600", "the longest wait for another machine's build of a key whose build time is "
                            "unknown; a known one waits at most 3 x that time + 60 s"),
    "ABICACHE_RETRY_FAILED": ("0", "1: build a key here even when another machine of the fleet has just failed "
                              "to build it (its error is otherwise reported at once, for 10 minutes)"),
    "ABICACHE_REMOTE_MAX_VARIANTS": ("64", "variants of one key a remote lookup considers (oldest first)"),
    "ABICACHE_REMOTE_LOOKUP_BYTES": ("16777216", "manifest bytes one remote lookup may read before it gives up"),
    "ABICACHE_SIGNING_KEY": ("", "Ed25519 private key file (PEM) that signs uploaded manifests"),
    "ABICACHE_TRUSTED_KEYS": ("", "comma-separated public keys (ed25519:...) or files of them; "
                              "when set, remote manifests must carry a signature by one of them"),
    "ABICACHE_DROPIN": ("", "torch, tvm_ffi (comma-separated) or all: route those libraries' JIT "
                        "load/load_inline through abicache with no code change (needs the wheel's .pth)"),
    "ABICACHE_OBSERVE": ("1", "0: do not watch compilers (observe.c, preloaded) for the files they read and "
                         "looked for; only their dependency files are recorded, and a build without one "
                         "is not cached"),
    "ABICACHE_SLOPPINESS": ("", "system_headers: headers in the compiler's own search list are taken as part "
                            "of the compiler (not recorded), as ccache's sloppiness=system_headers"),
    "ABICACHE_BASE_DIR": ("", "the launcher (abicache g++ ...): paths under this folder are made relative to the "
                          "working directory before the compiler runs, so clones of a project at different "
                          "places share hits, as ccache's base_dir (empty: paths stay as written)"),
    "ABICACHE_WARM": ("1", "0: the launcher's native front never hands a miss to a warm launcher (a Python "
                      "process that has imported what a miss needs, forked per compile); every miss then starts "
                      "Python (read from the environment alone, as the front is)"),
    "ABICACHE_KEEPER": ("10800", "seconds the store's keeper (a process of yours that watches large hit records' "
                        "files, so that a fresh process's hit asks it once instead of checking them) waits for a "
                        "question before it exits; 0: none is started nor asked"),
    "ABICACHE_CHECK": ("0", "N: check one hit in N in the background (abicache check: build it again from "
                       "scratch and compare), verdicts appended to log/check.jsonl; 0: never"),
    "ABICACHE_MAX_SIZE": ("", "a size cap for the local store (e.g. 10G, 500M): a build that takes the store "
                          "over it evicts the least recently used entries down to it before it returns (never "
                          "the entry it built), as ccache's max_size; `abicache gc` applies it too, `stats` "
                          "shows it (empty: no cap)"),
    "ABICACHE_READ_STORES": ("", "read-only stores searched after the local one, never written (a package's "
                             "prebuilt entries, a read-only shared folder), separated by ':'; installed packages "
                             "add theirs through the abicache.stores entry point"),
    "ABICACHE_BUILD": ("auto", "never: a miss that no store, read-only store or remote serves is an error naming "
                       "the missing variant and this environment (production without a compiler, as "
                       "FLASHINFER_DISABLE_JIT); always: build here, taking nothing from read-only stores or the "
                       "remote; auto: both, in that order"),
    "MAX_JOBS": ("<cores>", "translation units compiled at once (torch's cpp_extension reads it too)"),
}


def default_root() -> Path:
    """ABICACHE_DIR (or `dir` in the user's config file), else the platform's user cache directory."""
    explicit, _ = lookup("ABICACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return user_root()


def user_root() -> Path:
    """The platform's user cache directory for abicache, whatever ABICACHE_DIR says."""
    common = _xdg_cache_root()
    if common is not None:
        return common
    # Imported here: platformdirs costs 2 to 4 ms, as much as a whole hit.
    import platformdirs

    return Path(platformdirs.user_cache_dir("abicache", appauthor=False))


def _xdg_cache_root() -> Path | None:
    """platformdirs' answer on Linux in the common case, without importing it:
    $XDG_CACHE_HOME/abicache where that is absolute, else ~/.cache/abicache
    with an absolute $HOME. None leaves the rest (Android, a relative HOME,
    other systems) to platformdirs; tests/test_env.py compares the two."""
    if sys.platform != "linux" or hasattr(sys, "getandroidapilevel") or os.environ.get("ANDROID_ROOT"):
        return None
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg, "abicache")
    home = os.environ.get("HOME", "")
    return Path(home, ".cache", "abicache") if os.path.isabs(home) else None


def lookup(name: str) -> tuple[str | None, str]:
    """(the value, where it comes from): the environment, the user's config file, the
    store's config file within what it may set (setting_sources.py), or (None, "default")."""
    if RAW_ENVIRON is not None:  # os.environ's own bytes: no encoding of each name, no decoding of each value
        raw = RAW_ENVIRON.get(_NAMES.get(name) or os.fsencode(name))
        if raw is not None:
            return os.fsdecode(raw), "environment"
    elif name in os.environ:
        return os.environ[name], "environment"
    if no_files():
        return None, "default"
    from . import setting_sources

    return setting_sources.lookup(name, VARIABLES, default_root)


def no_files() -> bool:
    """Neither config file exists (the common case): a setting not in the environment is its
    default. Memoized by the variables that say where the files are."""
    if RAW_ENVIRON is not None:
        steer: tuple[object, ...] = tuple(map(RAW_ENVIRON.get, _STEERING))
    else:
        steer = tuple(map(os.environ.get, settings_file.STEERING))
    bare = _bare.get(steer)
    if bare is None:
        bare = _bare[steer] = _no_files()
    return bare


#: os.environ's mapping of bytes on POSIX (os.environ encodes each name and decodes each value:
#: a setting read cost 4 us that way), and the names in it
RAW_ENVIRON = getattr(os.environ, "_data", None) if os.name == "posix" else None
RAW_ENVIRON = RAW_ENVIRON if isinstance(RAW_ENVIRON, dict) else None
_NAMES = {name: os.fsencode(name) for name in VARIABLES}
_STEERING = tuple(os.fsencode(name) for name in settings_file.STEERING)

#: per process, by settings_file.STEERING: True where neither config file exists (the common case:
#: then a setting not in the environment is its default, and the rule is not even imported)
_bare: dict[tuple[str | None, ...], bool] = {}
settings_file.forgetters.append(_bare.clear)


def _no_files() -> bool:
    if os.path.lexists(settings_file.user_file()):
        return False
    explicit = os.environ.get("ABICACHE_DIR")  # without a user file, the root is this or the default
    root = Path(explicit).expanduser() if explicit else user_root()
    return not os.path.lexists(settings_file.store_file(root))


def _raw(name: str, default: str | None = None) -> str:
    value, _ = lookup(name)
    return (VARIABLES[name][0] if default is None else default) if value is None else value


def text(name: str) -> str:
    """The variable's value, or its default; '' when unset and without default."""
    raw = _raw(name, "").strip()
    if raw:
        return raw
    default = VARIABLES[name][0]
    return "" if default.startswith("<") else default


#: ten years: the largest number of seconds any setting takes
MAX_SECONDS = 10 * 365 * 86400.0


def seconds(name: str) -> float:
    """A finite number of seconds from 0 to MAX_SECONDS, or the default."""
    raw = _raw(name)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= MAX_SECONDS:  # also refuses nan and inf
        raise ConfigError(
            f"{name}={raw!r} is not a number of seconds from 0 to {MAX_SECONDS:.0f}; "
            f"set it to a value like {VARIABLES[name][0]}"
        )
    return value


def flag(name: str) -> bool:
    raw = _raw(name).strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("", "0", "false", "no", "off", "auto"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; set it to 1 or 0")


def tristate(name: str) -> bool | None:
    """Like flag(), but 'auto' (the default) gives None."""
    if _raw(name, "auto").strip().lower() == "auto":
        return None
    return flag(name)


BUILD_MODES = ("auto", "never", "always")


def build_mode() -> str:
    """ABICACHE_BUILD: auto, never or always."""
    mode = text("ABICACHE_BUILD").lower()
    if mode not in BUILD_MODES:
        raise ConfigError(f"ABICACHE_BUILD={mode!r} is not a build mode; set it to one of {', '.join(BUILD_MODES)}")
    return mode


def count(name: str, *, least: int = 0) -> int:
    """A whole number, at least `least`, or the default."""
    raw = _raw(name).strip()
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        raise ConfigError(f"{name}={raw!r} is not a whole number of at least {least}; "
                          f"set it to a value like {VARIABLES[name][0]}")
    return value


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int | None:
    """Bytes from '500M', '10G', '1.5T', '0' or '4096' (binary units, an optional 'iB'/'B'); None if not a size."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text, re.I)
    return None if match is None else int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def human_size(n: float) -> str:
    """Bytes as people read them: 512 B, 14.7 KiB, 1.9 GiB (parse_size reads them back)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def size(name: str) -> int | None:
    """A size setting in bytes; None when it is empty (no cap)."""
    raw = _raw(name).strip()
    if not raw:
        return None
    value = parse_size(raw)
    if value is None:
        raise ConfigError(f"{name}={raw!r} is not a size; set it to a value like 10G or 500M (empty: none)")
    return value
