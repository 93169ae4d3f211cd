"""Every python and bash block of README.md and docs/ runs, as written.

The python blocks of one page run in order in one fresh interpreter (a page
builds on its earlier blocks); each bash block runs on its own with `bash -e`.
They run in a scratch folder holding a copy of examples/, with their own
abicache store, from the page's first block to its last.

A block can say, in HTML comments on the lines just above it (invisible on the
rendered page):
    <!-- docs-test: skip REASON -->    not run; REASON is shown as the skip reason
    <!-- docs-test: needs TOOL -->     skipped, with the reason, where TOOL is absent
                                       (torch, triton, tvm_ffi, cuda_core, nvcc, nvrtc, cudart, cuda12, gpu,
                                       make, cmake, ninja, g++)
    <!-- docs-test: cwd PATH -->       run in PATH (inside the scratch folder)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import ROOT, SRC, gpu_present

PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts)]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_DIRECTIVE = re.compile(r"^<!-- docs-test: (skip|needs|cwd) ?(.*?) -->$")


class Block(NamedTuple):
    page: Path
    line: int
    lang: str
    code: str
    skip: str | None
    needs: tuple[str, ...]
    cwd: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        lang = match.group(1)
        if lang not in ("python", "bash"):
            continue
        line = text[:match.start()].count("\n") + 1
        skip, needs, cwd = None, [], "."
        for above in reversed(text[:match.start()].splitlines()):
            directive = _DIRECTIVE.match(above.strip())
            if directive is None:
                break
            word, value = directive.groups()
            if word == "skip":
                skip = value or "marked skip"
            elif word == "needs":
                needs += value.split()
            else:
                cwd = value
        found.append(Block(page, line, lang, match.group(2), skip, tuple(needs), cwd))
    return found


def missing(tool: str) -> str | None:
    """Why a tool a block needs is absent here (None: it is present)."""
    import importlib.util

    if tool in ("torch", "triton", "tvm_ffi"):
        return None if importlib.util.find_spec(tool) else f"{tool} is not installed"
    if tool == "cuda_core":
        try:
            found = importlib.util.find_spec("cuda.core.utils")
        except ImportError:
            found = None
        return None if found else "cuda-core is not installed (pip install 'abicache[cuda-core]')"
    if tool == "cuda12":  # CUDA 12's runtime headers, from PyPI's nvidia-cuda-runtime-cu12
        found = importlib.util.find_spec("nvidia.cuda_runtime")
        return None if found else "CUDA 12's headers are not installed (pip install nvidia-cuda-runtime-cu12)"
    if tool == "gpu":
        return gpu_present()
    if tool == "nvcc":
        from abicache.env import probes

        return None if probes.nvcc_path() else "nvcc is not installed"
    if tool in ("nvrtc", "cudart"):
        from abicache.cuda import loader

        try:
            loader.load_library(tool)
        except Exception as exc:  # noqa: BLE001 - any reason it cannot load is the reason to skip
            return f"{tool} cannot be loaded: {str(exc).splitlines()[0]}"
        return None
    if tool in ("make", "cmake", "ninja", "g++"):  # programs a block runs
        return None if shutil.which(tool) else f"{tool} is not installed"
    raise AssertionError(f"unknown docs-test need {tool!r}")


ALL = [b for page in PAGES for b in blocks(page)]

# Runs the python blocks of one page in order; a failure names the block.
RUNNER = textwrap.dedent("""
    import json, os, sys, traceback
    base = os.getcwd()
    namespace = {"__name__": "__main__"}
    for where, cwd, code in json.load(open(sys.argv[1])):
        os.chdir(os.path.join(base, cwd))
        try:
            exec(compile(code, where, "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            sys.exit(f"the block at {where} failed")
""")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("docs")
    shutil.copytree(ROOT / "examples", work / "examples")
    return work


def _env(scratch: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(scratch / "store"), "ABICACHE_PROGRESS": "0",
            "TORCH_EXTENSIONS_DIR": str(scratch / "torch-extensions"), "TRITON_CACHE_DIR": str(scratch / "triton"),
            "XDG_CONFIG_HOME": str(scratch / "config")}  # `abicache config set` writes there, not in the user's home


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.lang == "python" for b in blocks(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(page: Path, scratch: Path) -> None:
    import json

    runnable, skipped = [], []
    for block in (b for b in blocks(page) if b.lang == "python"):
        reason = block.skip or next((m for m in map(missing, block.needs) if m), None)
        (skipped if reason else runnable).append((block, reason))
    if not runnable:
        pytest.skip("; ".join(f"{b.where}: {r}" for b, r in skipped))
    plan = scratch / f"{page.stem}-blocks.json"
    plan.write_text(json.dumps([[b.where, b.cwd, b.code] for b, _ in runnable]))
    done = subprocess.run([sys.executable, "-c", RUNNER, str(plan)], cwd=scratch, capture_output=True, text=True,
                          env=_env(scratch), timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    if skipped:
        pytest.skip("ran the others; " + "; ".join(f"{b.where}: {r}" for b, r in skipped))


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "bash"], ids=lambda b: b.where)
def test_bash_blocks_run(block: Block, scratch: Path) -> None:
    reason = block.skip or next((m for m in map(missing, block.needs) if m), None)
    if reason:
        pytest.skip(reason)
    bindir = str(Path(sys.executable).parent)
    done = subprocess.run(["bash", "-e", "-c", block.code], cwd=scratch / block.cwd, capture_output=True, text=True,
                          env={**_env(scratch), "PATH": f"{bindir}:{os.environ['PATH']}"}, timeout=1200)
    assert done.returncode == 0, f"{block.where}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def test_every_block_is_python_bash_or_labelled_text() -> None:
    """An unlabelled fence would never run: say what it is."""
    for page in PAGES:
        for match in _FENCE.finditer(page.read_text()):
            assert match.group(1), f"{page.relative_to(ROOT)}: a code block without a language"
