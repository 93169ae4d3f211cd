"""Audit: what a built artifact depends on, read from its files.

`detect(stage, paths)` returns the *detected* requirements and an audit
summary for the manifest. The cache unions them with the builder's declared
requirements. ELF/CUDA/torch classification lands here (issue: Audit); until
then nothing is detected and only declared requirements apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..requirements import Requirements


def detect(stage: Path, paths: Sequence[str]) -> tuple[Requirements, dict[str, Any]]:
    return Requirements(), {}
