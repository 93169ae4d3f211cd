"""What every benchmark script shares: running a snippet in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any


def base_env() -> dict[str, str]:
    """The environment users have: bytecode caching on (some shells turn it off)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def clean_python(folder: Path) -> str:
    """The interpreter of a venv made in folder, without pip: no .pth file of this machine's
    site-packages runs at its start-up (one here imports certifi: ~70 ms a process), as none
    of a user's does. abicache's commands need nothing from site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return str(folder / "bin" / "python")


def run_last_line(code: str, env: dict[str, str], timeout: float = 1800, python: str = sys.executable,
                  cwd: str | None = None) -> str:
    """Run code in a fresh interpreter (in cwd: its sys.path[0]); its last line of output."""
    out = subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env={**base_env(), **env}, timeout=timeout, cwd=cwd)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return out.stdout.strip().splitlines()[-1]


def run_json(code: str, env: dict[str, str], timeout: float = 1800, python: str = sys.executable,
             cwd: str | None = None) -> Any:
    """Run code in a fresh interpreter; the JSON it printed last."""
    return json.loads(run_last_line(code, env, timeout, python, cwd))
