"""Config files: every setting of config.VARIABLES can be kept in TOML, as ccache keeps
ccache.conf: the user's file, `$XDG_CONFIG_HOME/abicache/config.toml`
(~/.config/abicache/), and a store's, `<store root>/abicache.toml`. Which file may set
what, and which comes first, is setting_sources.py's rule: a store's file may not widen
whom the store trusts.

In a file a setting is its variable's name without ABICACHE_, in lower case:

    max_size = "10G"
    remote = "s3://ci-cache/abicache?endpoint=http://minio:9000"

A file is read once per process, and only if it exists (a stat: the hit path
pays nothing more). An unknown key is not an error that stops a build: it is
reported once, and by `abicache config list` and `abicache env`.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable

PREFIX = "ABICACHE_"
STORE_FILE = "abicache.toml"
#: the variables that choose which config files are read and whose group a store trusts
STEERING = ("XDG_CONFIG_HOME", "HOME", "ABICACHE_DIR", "XDG_CACHE_HOME", "ABICACHE_SHARED")

_read: dict[str, dict[str, str]] = {}
_warned: set[str] = set()


def user_file() -> Path:
    """$XDG_CONFIG_HOME/abicache/config.toml, else ~/.config/abicache/config.toml."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path(os.path.expanduser("~"), ".config")
    return base / "abicache" / "config.toml"


def store_file(root: Path) -> Path:
    return root / STORE_FILE


def key_of(variable: str) -> str:
    """ABICACHE_MAX_SIZE -> max_size (MAX_JOBS, not abicache's own, keeps its name: max_jobs)."""
    return variable.removeprefix(PREFIX).lower()


def values(path: Path, variables: Iterable[str]) -> dict[str, str]:
    """The file's settings as text (read once per process); {} if there is none.
    A file that is not TOML raises ConfigError naming it. variables: the settings
    (config.VARIABLES), whose keys the file may hold."""
    key = str(path)
    if key not in _read:
        _read[key] = _load(path, {key_of(v) for v in variables}) if path.is_file() else {}
    return _read[key]


#: what else remembers a file's verdict (setting_sources registers itself): cleared by forget()
forgetters: list[Callable[[], None]] = []


def forget() -> None:
    """Read the files again on next use (tests, `abicache config set`)."""
    _read.clear()
    for clear in forgetters:
        clear()


def read_text(path: Path) -> str:
    """The file's text, opened without following a symbolic link and only if it is a
    regular file (a FIFO planted in its place would hang the reader)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return handle.read(1 << 20).decode("utf-8")


def _load(path: Path, known: set[str]) -> dict[str, str]:
    from ..errors import ConfigError

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        doc = tomllib.loads(read_text(path))
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}; fix it, or remove it") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}; fix it, or remove it") from None
    out = {}
    for name, value in doc.items():
        if name not in known:
            _warn_unknown(path, name)
        elif isinstance(value, (str, int, float, bool)) and not isinstance(value, dict):
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)
        else:
            raise ConfigError(f"config file {path}: {name} must be a string or a number, not {type(value).__name__}")
    return out


def unknown_keys(path: Path, variables: Iterable[str]) -> list[str]:
    """The keys of a file that are no setting (for `abicache config list` and `abicache env`)."""
    if not path.is_file():
        return []
    try:
        import tomllib
    except ImportError:
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        doc: dict[str, Any] = tomllib.loads(read_text(path))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []
    known = {key_of(v) for v in variables}
    return sorted(k for k in doc if k not in known)


def _warn_unknown(path: Path, name: str) -> None:
    if f"{path}:{name}" not in _warned:
        _warned.add(f"{path}:{name}")
        print(f"abicache: {path}: {name!r} is not a setting (see `abicache config list`); ignored",
              file=sys.stderr)


def write(path: Path, name: str, value: str | None) -> None:
    """Set (or, with None, remove) one key, keeping the file's other lines as they are."""
    import json

    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    kept = [line for line in lines if line.split("=", 1)[0].strip() != name]
    if value is not None:
        kept.append(f"{name} = {json.dumps(value)}")  # a JSON string is a TOML basic string
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    temp.write_text("\n".join(kept) + "\n", encoding="utf-8")
    os.chmod(temp, 0o644)  # writable by its owner alone, whatever the umask: others' settings are refused
    os.replace(temp, path)
    forget()
