"""Where a setting may come from: the rule that keeps a neighbour from choosing whom
your store trusts.

A value is looked for, the first that has it:

1. the environment (ABICACHE_MAX_SIZE=10G): the process's own;
2. the user's file, `$XDG_CONFIG_HOME/abicache/config.toml`, read only if it is a
   regular file (not a symbolic link) owned by you or root and writable by nobody
   else (a group write bit is accepted only for your own private group);
3. the store's file, `<root>/abicache.toml`, read only once the root passed the
   store's owner check with the group named by 1 or 2, and only if the file
   itself passes the same check. It may set what belongs to the store (its size
   cap, touch interval, lock and remote timeouts) and may only *tighten* the rest:
   a lower `verify_age`, `observe = 1`, an empty `sloppiness`,
   `remote_mode = "read"`, `build = "always"`. It may never set `shared`, `dir`,
   `remote`, `read_stores`, `trusted_keys`, `signing_key` or `check`; such a key is
   ignored, reported once on stderr and by `abicache config list`;
4. the default.

`dropin` is read from the environment alone (the wheel's .pth reads it as every
interpreter starts, before a config file could be): in either file it is refused,
with that reason, rather than listed and silently without effect.

For the store's own settings (USER_ONLY and TIGHTEN_ONLY excluded) the store's file
comes before the user's, as ccache's store-wide settings do: a shared store's size
cap belongs to the store.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from . import settings_file
from .owners import Trust, group_setting, quoted

if TYPE_CHECKING:
    #: (the value or None, where it comes from: "environment", a file's path, or "default"): a
    #: plain tuple (a NamedTuple class costs a compile at import, on every fresh process's hit)
    Found = tuple[str | None, str]

#: settings that choose whom the store trusts or what is loaded: the environment and
#: the user's own file only
USER_ONLY = frozenset({
    "ABICACHE_DIR", "ABICACHE_SHARED", "ABICACHE_REMOTE", "ABICACHE_READ_STORES", "ABICACHE_TRUSTED_KEYS",
    "ABICACHE_SIGNING_KEY", "ABICACHE_CHECK",
})
#: settings read from the environment alone, and why a file's value could not take effect
ENV_ONLY = {
    "ABICACHE_DROPIN": "it is read from the environment alone, as every interpreter starts (the wheel's .pth), "
                       "before any config file could be: export ABICACHE_DROPIN instead",
    "ABICACHE_WARM": "it is read from the environment alone, by the launcher's native front, which reads no "
                     "config file: export ABICACHE_WARM instead",
}


def _fewer_seconds(store: str, current: str) -> bool:
    try:
        return 0 <= float(store) < float(current)
    except ValueError:
        return False


#: settings a store's file may set only to a tighter value than the user's (or the default):
#: name -> (is `store` tighter than `current`?, what a tighter value is)
TIGHTEN_ONLY: dict[str, tuple[Callable[[str, str], bool], str]] = {
    "ABICACHE_VERIFY_AGE": (_fewer_seconds, "a lower number of seconds"),
    "ABICACHE_OBSERVE": (lambda s, c: s.strip().lower() in ("1", "true", "yes", "on"), "1"),
    "ABICACHE_SLOPPINESS": (lambda s, c: not s.strip(), "empty (no sloppiness)"),
    "ABICACHE_REMOTE_MODE": (lambda s, c: s.strip().lower() == "read", '"read"'),
    "ABICACHE_BUILD": (lambda s, c: s.strip().lower() == "always", '"always"'),
}




_refused: dict[str, str] = {}  # "<file>:<key>" -> why (each said once per process)
_file_problems: dict[str, str] = {}  # a file that was not read -> why
#: per process, as the files' values are: (path, group) -> file_problem's answer (a hit asks several settings)
_verdicts: dict[tuple[str, str | None, bool], str | None] = {}
#: per process, by the variables that choose the files and the group (forget() clears them): each
#: setting's answer, and each file's path and settings (a fresh process's hit asks half a dozen)
_found: dict[tuple[str | None, ...], Found] = {}
_users: dict[tuple[str | None, ...], tuple[str, dict[str, str]]] = {}
_stores: dict[tuple[str | None, ...], tuple[str, dict[str, str]]] = {}


def lookup(name: str, variables: Mapping[str, tuple[str, str]], root: Callable[[], Path]) -> Found:
    """The value of one setting and where it comes from (see the module's text). variables:
    config.VARIABLES (each one's default first); root: the store's root (config.default_root)."""
    if name in os.environ:
        return os.environ[name], "environment"
    environ = os.environ
    steer = tuple(map(environ.get, settings_file.STEERING))
    found = _found.get((name, *steer))
    if found is None:
        found = _found[(name, *steer)] = _lookup(name, variables, root, steer)
    return found


def _lookup(name: str, variables: Mapping[str, tuple[str, str]], root: Callable[[], Path],
            steer: tuple[str | None, ...]) -> Found:
    default = variables[name][0]
    key = settings_file.key_of(name)
    if steer not in _users:
        path = settings_file.user_file()
        _users[steer] = (str(path), user_values(path, variables))
    user_path, users = _users[steer]
    user = users.get(key)
    if name in ENV_ONLY:
        if user is not None:
            _refuse(Path(user_path), key, ENV_ONLY[name])
        return None, "default"
    if name in USER_ONLY:
        return (user, user_path) if user is not None else (None, "default")
    if steer not in _stores:
        path, kept = _store_values(variables, root())
        _stores[steer] = (str(path), kept)
    store_path, store = _stores[steer]
    value = store.get(key)
    if value is not None and name in TIGHTEN_ONLY:
        tighter, what = TIGHTEN_ONLY[name]
        current = user if user is not None else default
        if tighter(value, current):
            return value, store_path
        if value.strip().lower() != current.strip().lower():
            _refuse(Path(store_path), key, f"a store's file may only tighten {key} (to {what}), not loosen it")
        value = None
    if value is not None:
        return value, store_path
    return (user, user_path) if user is not None else (None, "default")


def store_refusal(name: str, value: str, variables: Mapping[str, tuple[str, str]]) -> str | None:
    """Why a store's file may not hold this value of this setting (`config set --store`), or None."""
    key = settings_file.key_of(name)
    if name in ENV_ONLY:
        return f"{key}: {ENV_ONLY[name]}"
    if name in USER_ONLY:
        return (f"{key} may only be set in the environment or your own config file ({settings_file.user_file()}): "
                "a store's file may not widen whom it trusts")
    if name in TIGHTEN_ONLY:
        tighter, what = TIGHTEN_ONLY[name]
        current = user_values(settings_file.user_file(), variables).get(key, variables[name][0])
        if not tighter(value, current) and value.strip().lower() != current.strip().lower():
            return f"a store's file may only tighten {key} (to {what}), not loosen it"
    return None


def user_refusal(name: str) -> str | None:
    """Why the user's file may not hold this setting (`config set`), or None."""
    return f"{settings_file.key_of(name)}: {ENV_ONLY[name]}" if name in ENV_ONLY else None


def user_values(path: Path, variables: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """The user's file's settings; ConfigError if it exists but others could have written it
    (its settings, trusted keys included, are the user's: ignoring them would loosen them)."""
    from ..errors import ConfigError

    problem = _verdict(path, None)
    if problem is not None and problem != "absent":
        raise ConfigError(f"config file {path}: {problem}; others could choose your settings. "
                          f"Fix: chmod go-w -- {quoted(path)} (a regular file of yours), or remove it")
    return settings_file.values(path, variables) if problem is None else {}


def _store_values(variables: Mapping[str, tuple[str, str]], root: Path) -> tuple[Path, dict[str, str]]:
    """The store's file and its settings, {} where the root or the file fails the owner check,
    less the keys it may never set."""
    path = settings_file.store_file(root)
    group = group_setting(lookup("ABICACHE_SHARED", variables, lambda: root)[0])
    problem = _verdict(path, group)  # most stores have none: then the root is not looked at here
    if problem != "absent":
        problem = _verdict(root, group, folder=True) or problem
    if problem is not None:
        if problem != "absent" and str(path) not in _file_problems:
            _file_problems[str(path)] = problem
            print(f"abicache: {path}: not read: {problem}", file=sys.stderr)
        return path, {}
    found = settings_file.values(path, variables)
    kept = {}
    for key, value in found.items():
        name = f"ABICACHE_{key.upper()}" if key != "max_jobs" else "MAX_JOBS"
        if name in USER_ONLY or name in ENV_ONLY:
            _refuse(path, key, str(store_refusal(name, value, variables)))
        else:
            kept[key] = value
    return path, kept


def refused() -> dict[str, str]:
    """What was refused so far, for `abicache config list`: "<file>: <key>" -> why; and the files not read."""
    return {**_refused, **{f"{p}": why for p, why in _file_problems.items()}}


def forget() -> None:
    _refused.clear()
    _file_problems.clear()
    _verdicts.clear()
    _found.clear()
    _users.clear()
    _stores.clear()


settings_file.forgetters.append(forget)


def _verdict(path: Path, group: str | None, *, folder: bool = False) -> str | None:
    memo = (os.fspath(path), group, folder)
    if memo not in _verdicts:
        _verdicts[memo] = file_problem(path, group, folder=folder)
    return _verdicts[memo]


def _refuse(path: Path, key: str, why: str) -> None:
    label = f"{path}: {key}"
    if label not in _refused:
        _refused[label] = why
        print(f"abicache: {label}: ignored: {why}", file=sys.stderr)


def file_problem(path: Path, group: str | None, *, folder: bool = False) -> str | None:
    """Why a config file (or, with folder, a store root) may not be trusted: "absent",
    another reason, or None. The user's file: group None. A group write bit is accepted
    for the owner's own private group (what umask 002 leaves)."""
    try:
        st = os.lstat(os.path.realpath(path) if folder else path)  # a link to the root is followed, as ensure_root does
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if folder != stat.S_ISDIR(st.st_mode) or not (folder or stat.S_ISREG(st.st_mode)):
        return "is not a regular file" if not folder else "is not a folder"
    if not hasattr(os, "geteuid"):
        return None
    problem = Trust(group, private_groups=True).problem(st, "it")
    return None if problem is None else problem.removeprefix("it ")
