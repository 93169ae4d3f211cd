"""ABICACHE_CHECK=N: `abicache check` one hit in N in a process of its own.

That process is a child of the library, not of the caller's folder: an isolated
interpreter (`-I`: no working folder, PYTHON* variable or user site on sys.path; the
folder this abicache was imported from is put there by hand), started in a private
folder of the store, so a module planted where the caller happens to run is never
imported. At most SLOTS checks run per store at once, and never two of one entry: the
parent takes a slot's lock and the entry's without waiting, hands both to the child
(the kernel keeps an flock while any process holds the file open) and skips the check
when either is taken. A check finished in a slot frees it when its process exits,
however it exits.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..store import lock

if TYPE_CHECKING:
    from ..core.cache import Artifact, Cache

#: checks of one store that may run at once
SLOTS = 1


def every() -> int:
    """ABICACHE_CHECK as a number (0: never; a bad value: `abicache env` lists it)."""
    from ..settings import config

    text = config.text("ABICACHE_CHECK")
    return int(text) if text.isdigit() else 0


def maybe_check(cache: Cache, art: Artifact) -> bool:
    """Start a background check of this hit with probability 1/N; True if one was started."""
    import random

    n = every()
    if n < 1 or random.random() >= 1 / n or "recipe" not in art.manifest.builder:
        return False
    return start(cache, art.key)


def start(cache: Cache, key: str) -> bool:
    """Start `abicache check KEY --log` in the background if a slot is free and no check of
    this key runs; False (and nothing started) otherwise."""
    folder = cache.store.layout.locks / "checks"  # gc removes its files while no check holds them
    cache.store.make_dir(folder)
    mode = cache.store.trust.file_mode
    held = [fd for fd in (lock.hold(folder / f"check-{key[:32]}.lock", mode), _free_slot(folder, mode))
            if fd is not None]
    try:
        if len(held) < 2:
            return False
        _spawn(cache, key, held)
        return True
    finally:
        for fd in held:
            os.close(fd)  # the child's copies keep the locks until it exits


def _free_slot(folder: Path, mode: int) -> int | None:
    for slot in range(SLOTS):
        fd = lock.hold(folder / f"check-slot-{slot}.lock", mode)
        if fd is not None:
            return fd
    return None


def import_root() -> Path:
    """The folder this abicache is imported from: the one that holds the package (never the
    package's own folder, whose modules torch.py and triton.py would stand for torch and triton)."""
    return Path(__file__).resolve().parent.parent.parent  # frontends/ -> abicache/ -> the folder


def _spawn(cache: Cache, key: str, fds: list[int]) -> None:
    import subprocess

    code = f"import sys; sys.path.insert(0, {str(import_root())!r}); from abicache.cli.program import main; " \
           "sys.exit(main())"
    private = cache.store.layout.tmp
    cache.store.make_dir(private)
    subprocess.Popen(
        [sys.executable, "-I", "-c", code, "check", key, "--root", os.fspath(cache.root), "--log"],
        cwd=private, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, pass_fds=fds, env={**os.environ, "ABICACHE_CHECK": "0"},
    )
