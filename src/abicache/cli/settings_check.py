"""Every abicache setting in the environment that would be refused, with the
reason: `abicache env` shows them all instead of failing on the first. It
lives with the command because it asks every layer that parses a setting
(config's plain values, the store's group, the remote's URL and keys)."""

from __future__ import annotations

from typing import Callable

from ..settings import config
from ..errors import ConfigError


def problems() -> dict[str, str]:
    from ..settings.owners import group_setting

    checks: dict[str, Callable[[], object]] = {
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
        "ABICACHE_CHECK": _every,
        "ABICACHE_BUILD": config.build_mode,
        "ABICACHE_SHARED": lambda: group_setting(config.text("ABICACHE_SHARED")),
        "ABICACHE_REMOTE": _remote,
    }
    found = {}
    for name, check in checks.items():
        try:
            check()
        except ConfigError as exc:
            found[name] = str(exc)
    found.update(_files())
    from ..settings import setting_sources

    found.update(setting_sources.refused())  # keys of a store's file the lookups above ignored
    return found


def _files() -> dict[str, str]:
    """Config files that do not parse, and keys in them that are no setting."""
    from ..settings import settings_file

    found = {}
    for path in (settings_file.store_file(config.default_root()), settings_file.user_file()):
        try:
            settings_file.values(path, config.VARIABLES)
        except ConfigError as exc:
            found[str(path)] = str(exc)
            continue
        unknown = settings_file.unknown_keys(path, config.VARIABLES)
        if unknown:
            found[str(path)] = f"not settings, ignored: {', '.join(unknown)} (abicache config list shows them)"
    return found


def _every() -> None:
    text = config.text("ABICACHE_CHECK")
    if text and not text.isdigit():
        raise ConfigError(f"ABICACHE_CHECK={text!r} is not a whole number; set N to check one hit in N (0: never)")


def _remote() -> None:
    if config.text("ABICACHE_REMOTE"):
        from ..remote import RemoteSettings

        RemoteSettings.from_env()
