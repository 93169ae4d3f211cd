"""The `abicache` command: its commands (main.py), or the compiler launcher
(`abicache g++ -c x.cpp -o x.o`, launcher/run.py), told apart here so that a compile
imports nothing of the commands' modules."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence

__all__ = ["main"]

#: every command, as main.build_parser adds them (tests/test_cli.py compares): main() makes the
#: parser of the one it runs
COMMANDS = ("env", "ls", "show", "explain", "gc", "check", "verify", "stats", "audit", "doctor", "demo",
            "launcher", "keeper", "bundle", "stub", "push", "pull", "remote", "config", "keys")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and launched(argv[0]):
        from ..launcher.run import main as launch

        return launch(argv)
    from .program import main as commands

    return commands(argv)


def launched(word: str) -> bool:
    """A compiler (or any program) rather than a command: a path, a compiler's name, or a
    program PATH finds that is no command of abicache's (a typo of one stays argparse's error)."""
    if word in COMMANDS or word.startswith("-") or not word:
        return False
    from ..launcher.command import family

    if os.sep in word or family(word) is not None:
        return True
    import shutil

    return shutil.which(word) is not None
