"""The documentation site builds without a warning, and its generated
reference pages match the code."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "docs"))


def test_the_reference_pages_match_the_code() -> None:
    import gen_reference

    for path, text in gen_reference.generated().items():
        assert path.read_text() == text, f"{path} is stale: run python docs/gen_reference.py"


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install mkdocs)")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    why = (tmp_path / "site" / "why" / "index.html").read_text()
    assert "img/matrix.png" in why and "unsafe reuses" in why
    assert (tmp_path / "site" / "img" / "matrix.png").stat().st_size > 10_000
