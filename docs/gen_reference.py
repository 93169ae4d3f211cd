"""Writes docs/reference/cli.md and docs/reference/configuration.md from the
code (argparse and config.VARIABLES), so the reference cannot drift from it.
tests/test_docs.py fails when the committed files are stale."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: fix it for a stable file

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "src"))

from abicache.settings import config  # noqa: E402
from abicache.cli.program import build_parser  # noqa: E402


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public API for this
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_md() -> str:
    parser = build_parser()
    parts = ["# Command line reference\n",
             "Generated from the argument parser (`python docs/gen_reference.py`). Every command takes "
             "`--json` for scripts and `--root DIR` for another store. Exit codes: 0 success, 1 a problem "
             "was found, 2 usage or configuration error.\n"]
    for name, sub in _subcommands(parser).items():
        nested = _subcommands(sub)
        for full, p in ([(name, sub)] if not nested else [(f"{name} {n}", q) for n, q in nested.items()]):
            p.prog = f"abicache {full}"
            help_text = p.format_help().replace("usage: ", "")
            parts.append(f"## abicache {full}\n\n```text\n{help_text.rstrip()}\n```\n")
    return "\n".join(parts)


def configuration_md() -> str:
    rows = "\n".join(f"| `{name}` | `{default}` | {meaning} |" for name, (default, meaning) in config.VARIABLES.items())
    return ("# Configuration\n\nEvery setting is an environment variable (generated from "
            "`abicache.settings.config.VARIABLES`; `abicache env` shows the values in effect), and can also be kept "
            "in a TOML file under its name without `ABICACHE_`, in lower case (`max_size = \"10G\"`). "
            "The environment wins, then the user's `~/.config/abicache/config.toml` (`$XDG_CONFIG_HOME`), "
            "then the default. A store's `<root>/abicache.toml` sets what belongs to the store (its size cap, "
            "its timeouts: these come before the user's) and may only *tighten* the rest; it never sets "
            "`shared`, `dir`, `remote`, `read_stores`, `trusted_keys`, `signing_key` or `check` (and `dropin` and "
            "`warm` are read from the environment alone), "
            "and either file is read only if nobody else could have written it "
            "([Security model](../security.md#where-a-setting-may-come-from)). "
            "`abicache config list` shows where each value comes from and what was refused, "
            "`abicache config set max_size 10G` writes one. The first `Cache` of a process parses every "
            "setting: a bad value is one error naming each setting, its value, where it was set and what is "
            "accepted (a hit fails as a miss does); an `ABICACHE_` variable that is no setting is named in "
            "one warning with the closest setting.\n\n"
            "| variable | default | meaning |\n|---|---|---|\n" + rows + "\n")


def generated() -> dict[Path, str]:
    return {DOCS / "reference" / "cli.md": cli_md(), DOCS / "reference" / "configuration.md": configuration_md()}


if __name__ == "__main__":
    for path, text in generated().items():
        path.write_text(text)
        print(f"wrote {path}")
