"""Every setting checked at first use, one way.

A bad value used to surface where its one reader ran: a size cap only on a miss (and
only as a warning), a build mode only on a miss, a verify age on every hit. Now the
first use of a Cache in a process parses every plain setting (and again when an ABICACHE_*
variable changed): each bad one is named in one ConfigError, with its value, where it
was set and what is accepted, whether the call would hit or miss. (A hit its record
serves (hits/) parses nothing: no record is written under settings that fail here, and
a record stands only while its environment and config files do.) An ABICACHE_*
variable that is no setting (`ABICACHE_ROOT`, a natural guess) gets one warning
naming the closest setting. Settings of upper layers (the remote's URL and keys) are
checked where they are parsed, when the Cache makes its remote tier.
"""

from __future__ import annotations

import os

from . import config, settings_file
from ..errors import ConfigError, warn_once

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Callable, Iterable

#: setting -> its parse (a ConfigError names what is accepted)
PARSERS: dict[str, Callable[[], object]] = {
    "ABICACHE_VERIFY_AGE": lambda: config.seconds("ABICACHE_VERIFY_AGE"),
    "ABICACHE_TOUCH_INTERVAL": lambda: config.seconds("ABICACHE_TOUCH_INTERVAL"),
    "ABICACHE_LOCK_TIMEOUT": lambda: config.seconds("ABICACHE_LOCK_TIMEOUT"),
    "ABICACHE_REMOTE_TIMEOUT": lambda: config.seconds("ABICACHE_REMOTE_TIMEOUT"),
    "ABICACHE_REMOTE_LEASE": lambda: config.seconds("ABICACHE_REMOTE_LEASE"),
    "ABICACHE_LEASE_STUCK": lambda: config.seconds("ABICACHE_LEASE_STUCK"),
    "ABICACHE_LEASE_WAIT": lambda: config.seconds("ABICACHE_LEASE_WAIT"),
    "ABICACHE_RETRY_FAILED": lambda: config.flag("ABICACHE_RETRY_FAILED"),
    "ABICACHE_REMOTE_MAX_VARIANTS": lambda: config.count("ABICACHE_REMOTE_MAX_VARIANTS", least=1),
    "ABICACHE_MAX_SIZE": lambda: config.size("ABICACHE_MAX_SIZE"),
    "ABICACHE_REMOTE_LOOKUP_BYTES": lambda: config.count("ABICACHE_REMOTE_LOOKUP_BYTES", least=1 << 16),
    "ABICACHE_EXPLAIN": lambda: config.flag("ABICACHE_EXPLAIN"),
    "ABICACHE_PROGRESS": lambda: config.tristate("ABICACHE_PROGRESS"),
    "ABICACHE_OBSERVE": lambda: config.flag("ABICACHE_OBSERVE"),
    "ABICACHE_CHECK": lambda: every(),
    "ABICACHE_BUILD": config.build_mode,
}

#: ABICACHE_* names that are no setting a user sets: the observer's and the CUDA stub's
#: own channels to their children, and the variables of abicache's tests and benchmarks
_CHANNELS = frozenset({"ABICACHE_TRACE_FD", "ABICACHE_TRACE_PARENT", "ABICACHE_LOADER_AUDIT",
                       "ABICACHE_CUDA_HEADERS", "ABICACHE_NVRTC", "ABICACHE_LIBCUDA", "ABICACHE_LIBAMDHIP64",
                       "ABICACHE_KFD_TOPOLOGY", "ABICACHE_CUDART"})
_CHANNEL_PREFIXES = ("ABICACHE_STUB_", "ABICACHE_TEST_", "ABICACHE_BENCH_", "ABICACHE_GPU_", "ABICACHE_FAULT_")

#: the states (_state) under which every setting parsed
_passed: set[tuple[object, ...]] = set()
settings_file.forgetters.append(_passed.clear)


def every() -> int:
    """ABICACHE_CHECK: check one hit in N (0: never)."""
    text = config.text("ABICACHE_CHECK")
    if text and not text.isdigit():
        raise ConfigError(f"ABICACHE_CHECK={text!r} is not a whole number; set N to check one hit in N (0: never)")
    return int(text or 0)


def check_once() -> None:
    """Raise one ConfigError naming every bad setting; warn once of each ABICACHE_* variable
    that is no setting. Once per process for each state of the settings (_state)."""
    state = _state()
    if state in _passed:
        return
    _warn_unknown(unknown_variables())
    # none set and no config file: every setting is its default, and each default parses
    # (tests/test_settings_checked.py): a fresh process's first Cache skips sixteen parses
    bad = {} if state.count(None) == len(PARSERS) and config.no_files() else problems()
    if bad:
        lines = [f"{message} (from {_where(name)})" for name, message in bad.items()]
        raise ConfigError(lines[0] if len(lines) == 1 else "settings that cannot be used:\n  " + "\n  ".join(lines))
    _passed.add(state)


def accept_current() -> None:
    """Take the settings as they are (`abicache env` lists what is wrong instead of failing)."""
    _passed.add(_state())


def problems() -> dict[str, str]:
    """setting -> why its value is refused, for every plain setting."""
    found = {}
    for name, parse in PARSERS.items():
        try:
            parse()
        except ConfigError as exc:
            found[name] = str(exc)
    return found


def _state() -> tuple[object, ...]:
    """What the settings were parsed under: the values of the variables parsed, and the
    environment's size (a variable added, an unknown one among them, makes it another
    state). Cheap: a new Cache in a process pays this, not a walk of the environment."""
    raw = config.RAW_ENVIRON  # os.environ's own bytes (config.py): 16 lookups, 1 us
    if raw is not None:
        return (len(raw), *map(raw.get, _RAW_NAMES))
    return (len(os.environ), *map(os.environ.get, PARSERS))


_RAW_NAMES = [os.fsencode(name) for name in PARSERS]


def _where(name: str) -> str:
    source = config.lookup(name)[1]
    return "the environment" if source == "environment" else source


def unknown_variables() -> list[str]:
    """The ABICACHE_* variables of the environment that are no setting (each warned of once)."""
    return [name for name in os.environ if name.startswith("ABICACHE_") and not (
        name in config.VARIABLES or name in _CHANNELS or name.startswith(_CHANNEL_PREFIXES))]


def _warn_unknown(names: Iterable[str]) -> None:
    for name in names:
        import difflib

        close = difflib.get_close_matches(name, config.VARIABLES, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]}?" if close else ""
        if name == "ABICACHE_ROOT":
            hint = "; the store is ABICACHE_DIR (or --dir, or the config file's dir)"
        warn_once(f"abicache: {name} is not an abicache setting and is ignored{hint} "
                  "(abicache config list shows them)")
