"""Virtual environments the tests make: a venv of an interpreter (optionally seeing its
packages), a reused Python 3.12 venv with abicache and its remote extra, and a reused venv
with the newest torch (a CUDA build, which imports without a GPU)."""

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


def make_venv(path: Path, python: str, *, system: bool = False, install: list[str] = (),
              env: dict[str, str] | None = None) -> str:
    made = subprocess.run([python, "-m", "venv", *(["--system-site-packages"] if system else []), str(path)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    if install:
        done = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", *install],
                              capture_output=True, text=True, timeout=1800, env={**os.environ, **(env or {})})
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
        if not (python.exists() and _holds(python, [*_dependencies(), *_dependencies("remote")])):
            shutil.rmtree(venv, ignore_errors=True)  # half made, or made before a dependency was added
            make_venv(venv, str(found[-1]), install=["-e", f"{ROOT}[remote]"])
    return str(python)


#: run in a reused venv: whether each requirement (sys.argv[1:]) is installed at a version it accepts
_HOLDS = """
import sys
from importlib import metadata
from packaging.requirements import Requirement
for line in sys.argv[1:]:
    req = Requirement(line)
    if req.marker is None or req.marker.evaluate():
        assert req.specifier.contains(metadata.version(req.name), prereleases=True), line
"""


def _holds(python: Path, requirements: list[str]) -> bool:
    """Whether a reused venv still has what pyproject.toml asks for (a venv made before a
    dependency was added is made again, not reused without it)."""
    return subprocess.run([str(python), "-c", _HOLDS, *requirements], capture_output=True).returncode == 0


def _topped_up(python: Path, requirements: list[str]) -> bool:
    """What a reused venv lacks installed into it (a dependency added since it was made: a
    package, not the 6 GB of torch again); whether it then holds."""
    subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], capture_output=True, timeout=1800)
    return _holds(python, requirements)


#: the newest torch release, as users install it from the package index: a CUDA build (cu13x)
NEWEST_TORCH = "torch==2.15.*"
#: what the tests that run in the newest torch's venv import besides abicache's own dependencies
NEWEST_TEST_TOOLS = ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "filelock>=3.16", "pyelftools>=0.31",
                     "numpy>=1.24"]


def newest_torch() -> str:
    """The python of a venv of this interpreter with NEWEST_TORCH, abicache's dependencies and
    the test tools (made once, about 6 GB from the package index, about a minute from a near
    mirror; reused by later runs). abicache itself is not installed there: run it with
    PYTHONPATH=src (conftest.run_py), so a venv made from another checkout serves this one.

    pip's constraint file may cap torch below the newest (this machine's
    /etc/xdg/pip/constraints.txt says torch<=2.14.1): this one pip run gets an empty one
    (PIP_CONSTRAINT), which lifts the cap for this venv only."""
    import sys
    import tempfile

    with reused(f"py{sys.version_info[0]}{sys.version_info[1]}-torch-newest") as venv:
        python = venv / "bin" / "python"
        probe = [str(python), "-c", "import torch, pytest, xdist, hypothesis, filelock, elftools, platformdirs, "
                 "packaging, rich, abi3info; assert torch.__version__.startswith('2.15'), torch.__version__"]
        wanted = [*_dependencies(), *NEWEST_TEST_TOOLS]
        if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0 \
                and (_holds(python, wanted) or _topped_up(python, wanted)):
            return str(python)
        shutil.rmtree(venv, ignore_errors=True)  # half made, or another torch: made again
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as empty:
            return make_venv(venv, sys.executable, install=[NEWEST_TORCH, *_dependencies(), *NEWEST_TEST_TOOLS],
                             env={"PIP_CONSTRAINT": empty.name})


def _dependencies(extra: str | None = None) -> list[str]:
    """abicache's own dependencies (or an extra's), as pyproject.toml lists them."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"][extra] if extra else project["dependencies"]
