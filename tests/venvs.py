"""Virtual environments the tests make: a venv of an interpreter (optionally seeing its
packages), and a reused Python 3.12 venv with abicache and its remote extra."""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from filelock import FileLock

from conftest import ROOT

VENVS = Path(os.environ.get("ABICACHE_TEST_VENVS", Path.home() / ".cache" / "abicache-test-venvs"))


@contextmanager
def reused(name: str) -> Iterator[Path]:
    """The reused venv VENVS/name, checked and made by one process at a time: pytest-xdist's
    workers share it (one would delete the folder another is installing into)."""
    VENVS.mkdir(parents=True, exist_ok=True)
    with FileLock(str(VENVS / f"{name}.lock")):
        yield VENVS / name


def make_venv(path: Path, python: str, *, system: bool = False, install: list[str] = ()) -> str:
    made = subprocess.run([python, "-m", "venv", *(["--system-site-packages"] if system else []), str(path)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    if install:
        done = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", *install],
                              capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            pytest.skip(f"cannot install {install} into a venv: {done.stderr[-300:]}")
    return str(path / "bin" / "python")


def py312_with_abicache() -> str:
    """A venv of pyenv's 3.12 with abicache and its remote extra (made once, reused)."""
    found = sorted((Path.home() / ".pyenv" / "versions").glob("3.12.*/bin/python3"))
    if not found:
        pytest.skip("no Python 3.12 under pyenv")
    with reused("py312-ship") as venv:
        python = venv / "bin" / "python"
        probe = [str(python), "-c", "import obstore, platformdirs, abi3info, rich"]
        if not (python.exists() and subprocess.run(probe, capture_output=True).returncode == 0):
            shutil.rmtree(venv, ignore_errors=True)
            make_venv(venv, str(found[-1]), install=["-e", f"{ROOT}[remote]"])
    return str(python)
