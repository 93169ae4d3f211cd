"""abicache config: list, get, set and unset settings in the config files, showing where
each value comes from (settings_file.py has the order)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..settings import config, setting_sources, settings_file
from ..errors import ConfigError
from . import render


def cmd_config(args: argparse.Namespace) -> int:
    if args.action == "list":
        return _list(args)
    name = _variable(args.name)
    if args.action == "get":
        value, where = config.lookup(name)
        shown = config.VARIABLES[name][0] if value is None else value
        if args.json:
            render.emit_json({"name": name, "value": shown, "from": where})
        else:
            print(shown)
        return 0
    path = settings_file.store_file(config.default_root()) if args.store else settings_file.user_file()
    if args.action == "set":
        if args.value is None:
            raise ConfigError(f"abicache config set {name}: give the value too, e.g. abicache config set max_size 10G")
        refusal = (setting_sources.store_refusal(name, args.value, config.VARIABLES) if args.store
                   else setting_sources.user_refusal(name))
        if refusal is not None:
            raise ConfigError(f"{refusal} (not written to {path})")
        before = settings_file.values(path, config.VARIABLES).get(settings_file.key_of(name))
        settings_file.write(path, settings_file.key_of(name), args.value)
        _check(name, path, before)
    else:  # unset
        settings_file.write(path, settings_file.key_of(name), None)
    value, where = config.lookup(name)
    doc = {"name": name, "file": str(path), "value": value, "from": where}
    if args.json:
        render.emit_json(doc)
    else:
        render.say(f"{name} = {value!r} (from {where})" if value is not None else f"{name}: the default")
    return 0


def _list(args: argparse.Namespace) -> int:
    rows = []
    for name, (default, meaning) in config.VARIABLES.items():
        value, where = config.lookup(name)
        rows.append({"name": name, "key": settings_file.key_of(name), "value": default if value is None else value,
                     "from": where, "meaning": meaning})
    files = [settings_file.store_file(config.default_root()), settings_file.user_file()]
    unknown = {str(f): keys for f in files if (keys := settings_file.unknown_keys(f, config.VARIABLES))}
    refused = setting_sources.refused()  # what the lookups above ignored, and why
    if args.json:
        render.emit_json({"settings": rows, "files": [str(f) for f in files], "unknown_keys": unknown,
                          "refused": refused})
        return 1 if unknown or refused else 0
    render.table("settings (the environment, then your file, then the store's within what it may set; "
                 "see docs/security.md)", ["setting", "file key", "value", "from"],
                 [(r["name"], r["key"], r["value"], r["from"]) for r in rows])
    for path, keys in unknown.items():
        render.say(f"[yellow]{path}: not settings, ignored: {', '.join(keys)}[/]")
    for what, why in refused.items():
        render.say(f"[yellow]{what}: ignored: {why}[/]")
    return 1 if unknown or refused else 0


def _variable(text: str | None) -> str:
    """ABICACHE_MAX_SIZE, max_size or max-size -> ABICACHE_MAX_SIZE; ConfigError listing them if none."""
    if not text:
        raise ConfigError("name a setting, e.g. abicache config get max_size (abicache config list shows them)")
    wanted = text.strip().replace("-", "_")
    for name in config.VARIABLES:
        if wanted.upper() == name or wanted.lower() == settings_file.key_of(name):
            return name
    raise ConfigError(f"{text!r} is not a setting; one of: "
                      + ", ".join(settings_file.key_of(n) for n in config.VARIABLES))


def _check(name: str, path: Path, before: str | None) -> None:
    """The value just written must parse as its setting does, or the file gets `before` back."""
    from .settings_check import problems

    found = problems().get(name)
    if found is not None:
        settings_file.write(path, settings_file.key_of(name), before)
        raise ConfigError(f"{found} (not written to {path})")
