"""Builds several tests need as a starting point, not as what they test: made once per run and
copied into each test's own store (a test may change its copy). Under pytest-xdist the workers
share them: the first to ask builds under a file lock, the others wait and copy."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from filelock import FileLock

from abicache import Cache

#: the classic torch extension of the README and the torch guide
ADD = "int64_t add(int64_t a, int64_t b) { return a + b; }"
ADD_EXT = "add_ext"


def _run_folder(factory: pytest.TempPathFactory) -> Path:
    base = factory.getbasetemp()
    # each xdist worker has its own basetemp (popen-gw0, ...) inside the run's: share that one
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def torch_extension_store(factory: pytest.TempPathFactory, dest: Path) -> Path:
    """A copy at dest of a store holding one classic torch extension, ADD_EXT (pybind11, ADD bound as
    `add`), built once per run with the installed torch."""
    pytest.importorskip("torch")
    import abicache.torch as at

    made = _run_folder(factory) / "shared-torch-extension"
    with FileLock(f"{made}.lock"):
        if not (made / "done").exists():
            shutil.rmtree(made, ignore_errors=True)
            at.build_inline(ADD_EXT, [ADD], functions=["add"], cache=Cache(made / "store"))
            (made / "done").touch()
    shutil.copytree(made / "store", dest, symlinks=True)
    return dest
