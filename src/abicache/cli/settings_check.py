"""Every abicache setting in the environment that would be refused, with the
reason: `abicache env` shows them all instead of failing on the first. It
lives with the command because it asks every layer that parses a setting
(config's plain values, the store's group, the remote's URL and keys)."""

from __future__ import annotations

from ..settings import config
from ..errors import ConfigError


def problems() -> dict[str, str]:
    from ..settings import checked
    from ..settings.owners import group_setting

    found = checked.problems()
    for name, check in (("ABICACHE_SHARED", lambda: group_setting(config.text("ABICACHE_SHARED"))),
                        ("ABICACHE_REMOTE", _remote)):
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


def _remote() -> None:
    if config.text("ABICACHE_REMOTE"):
        from ..remote import RemoteSettings

        RemoteSettings.from_env()
