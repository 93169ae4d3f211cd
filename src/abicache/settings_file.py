"""Config files: every setting of config.VARIABLES can be kept in TOML, as ccache keeps
ccache.conf. Where a value comes from, the first that has it:

1. the environment variable (ABICACHE_MAX_SIZE=10G);
2. the store's file, `<store root>/abicache.toml` (the root from ABICACHE_DIR or
   the user's file: settings that belong to one store, a shared one included);
3. the user's file, `$XDG_CONFIG_HOME/abicache/config.toml` (~/.config/abicache/);
4. the default.

In a file a setting is its variable's name without ABICACHE_, in lower case:

    max_size = "10G"
    remote = "s3://ci-cache/abicache?endpoint=http://minio:9000"

A file is read once per process, and only if it exists (a stat: the hit path
pays nothing more). An unknown key is not an error that stops a build: it is
reported once, and by `abicache config list` and `abicache env`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterable

PREFIX = "ABICACHE_"
STORE_FILE = "abicache.toml"

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


def forget() -> None:
    """Read the files again on next use (tests, `abicache config set`)."""
    _read.clear()


def _load(path: Path, known: set[str]) -> dict[str, str]:
    from .errors import ConfigError

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
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
        doc: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
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
    os.replace(temp, path)
    forget()
