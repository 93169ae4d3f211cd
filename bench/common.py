"""What every benchmark script shares: running a snippet in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any


def base_env() -> dict[str, str]:
    """The environment users have: bytecode caching on (some shells turn it off)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_last_line(code: str, env: dict[str, str], timeout: float = 1800) -> str:
    """Run code in a fresh interpreter; its last line of output."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env={**base_env(), **env}, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return out.stdout.strip().splitlines()[-1]


def run_json(code: str, env: dict[str, str], timeout: float = 1800) -> Any:
    """Run code in a fresh interpreter; the JSON it printed last."""
    return json.loads(run_last_line(code, env, timeout))
