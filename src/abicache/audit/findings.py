"""What an audit concludes: requirements with their evidence, and contradictions."""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from ..values.requirements import Requirement, Requirements


class Finding(NamedTuple):
    requirement: Requirement
    evidence: str

    def __str__(self) -> str:
        return f"{self.requirement}  because: {self.evidence}"


class FileAudit(NamedTuple):
    path: str
    kind: str  # "shared library", "python extension", "torch extension", "cubin", "fatbin", "ptx", "data"
    findings: tuple[Finding, ...] = ()
    problems: tuple[str, ...] = ()  # contradictions between what was claimed and the binary
    summary: dict[str, Any] = {}

    def requirements(self) -> Requirements:
        return Requirements.of(f.requirement for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "requirements": [{"requirement": str(f.requirement), "evidence": f.evidence} for f in self.findings],
            "problems": list(self.problems),
            "summary": self.summary,
        }


def finding(text: str, evidence: str) -> Finding:
    return Finding(Requirement.parse(text), evidence)


def sample(names: Iterable[str], limit: int = 3) -> str:
    """'a, b, c (+12 more)' for evidence lines."""
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def demangle(names: Iterable[str]) -> list[str]:
    """Readable C++ names via c++filt when it is installed (audit output only)."""
    import shutil
    import subprocess

    names = list(names)
    tool = shutil.which("c++filt")
    if not names or tool is None:
        return names
    done = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=False)
    out = done.stdout.splitlines()
    return out if len(out) == len(names) else names
