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


def test_every_ci_workflow_in_the_docs_parses_and_its_jobs_connect() -> None:
    """A GitHub Actions workflow a page shows (the shipping guide's CI matrix) is valid YAML
    with jobs that run somewhere, have steps, and need only jobs that exist."""
    import re

    yaml = pytest.importorskip("yaml")
    workflows = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for block in re.findall(r"^```yaml\n(.*?)^```", page.read_text(), re.M | re.S):
            doc = yaml.safe_load(block)
            assert isinstance(doc, dict), page
            if "jobs" in doc:
                workflows.append((page, doc))
    assert workflows, "the shipping guide shows a workflow"
    for page, doc in workflows:
        jobs = doc["jobs"]
        for name, job in jobs.items():
            assert job.get("runs-on") and isinstance(job.get("steps"), list) and job["steps"], (page, name)
            assert all("run" in step or "uses" in step for step in job["steps"]), (page, name)
            needs = job.get("needs", [])
            assert set([needs] if isinstance(needs, str) else needs) <= set(jobs), (page, name)
        assert any("abicache bundle --wheel" in step.get("run", "") for job in jobs.values() for step in job["steps"])
