"""The HIP runtime loader across ROCm majors, against stand-in libraries built
here with libamdhip64's sonames (no ROCm on this machine): search order, the
major read back from the library, one major per process, and an error that
lists every place tried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import SRC, need

LOAD = textwrap.dedent("""
    import json, sys
    from abicache import hip
    from abicache.env import Facts
    major = int(sys.argv[1]) if len(sys.argv) > 1 else None
    fact = Facts().get("hip.runtime")  # what the loader would load, before it loads
    try:
        lib = hip.load_library(major=major)
    except hip.HipLibraryNotFound as exc:
        print(json.dumps({"error": str(exc)}))
    else:
        print(json.dumps({"major": lib.major, "path": lib.path, "via": lib.found_via, "fact": fact,
                          "again": hip.load_library().path == lib.path}))
""")


def _stand_in(folder: Path, major: int, reports: int) -> Path:
    """libamdhip64.so.<major> whose hipRuntimeGetVersion reports `reports` (ROCm's encoding)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"libamdhip64.so.{major}"
    subprocess.run([need("cc"), "-shared", "-fPIC", "-x", "c", "-", "-o", str(path), f"-Wl,-soname,{path.name}"],
                   input=f"int hipRuntimeGetVersion(int* v) {{ *v = {reports}; return 0; }}\n", text=True, check=True)
    return path


def _run(tmp_path: Path, *argv: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("ROCM_PATH", "HIP_PATH", "ABICACHE_LIBAMDHIP64")}
    out = subprocess.run([sys.executable, "-c", LOAD, *argv], capture_output=True, text=True, timeout=120,
                         env={**clean, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(tmp_path / "store"), **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_newest_major_wins_and_its_version_is_read_back(tmp_path: Path) -> None:
    rocm = tmp_path / "rocm" / "lib"
    _stand_in(rocm, 6, 60241134)
    seven = _stand_in(rocm, 7, 70000000)
    got = _run(tmp_path, ROCM_PATH=str(rocm.parent))
    assert (got["major"], got["path"], got["via"], got["again"]) == (7, str(seven), "$ROCM_PATH", True)
    assert got["fact"] == "7"  # the fact names what the loader loads


def test_a_major_can_be_asked_for_and_the_override_comes_first(tmp_path: Path) -> None:
    rocm = tmp_path / "rocm" / "lib"
    _stand_in(rocm, 6, 60241134)
    override = _stand_in(tmp_path / "mine", 6, 60400000)
    got = _run(tmp_path, "6", ROCM_PATH=str(rocm.parent), ABICACHE_LIBAMDHIP64=str(override.parent))
    assert (got["major"], got["path"], got["via"]) == (6, str(override), "override ABICACHE_LIBAMDHIP64")


def test_the_major_the_library_reports_wins_over_its_file_name(tmp_path: Path) -> None:
    rocm = tmp_path / "rocm" / "lib"
    _stand_in(rocm, 6, 70100000)  # a runtime 7 behind a .so.6 name
    assert _run(tmp_path, ROCM_PATH=str(rocm.parent))["major"] == 7


def test_nothing_found_lists_every_place_tried(tmp_path: Path) -> None:
    got = _run(tmp_path, "5", ROCM_PATH=str(tmp_path / "empty"), ABICACHE_LIBAMDHIP64=str(tmp_path / "none"))
    error = got["error"]
    assert error.startswith("could not load libamdhip64.so.5; tried, in order:")
    for place in ("override ABICACHE_LIBAMDHIP64", "pip wheel", "$ROCM_PATH", "/opt/rocm", "system loader"):
        assert place in error, place
    assert "To fix: install ROCm" in error


def test_one_major_per_process(tmp_path: Path) -> None:
    rocm = tmp_path / "rocm" / "lib"
    _stand_in(rocm, 6, 60241134)
    code = ("from abicache import hip\nhip.load_library(major=6)\n"
            "try:\n    hip.load_library(major=7)\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(SRC), "ROCM_PATH": str(rocm.parent)})
    assert "AbicacheError the HIP runtime 6 is already loaded" in out.stdout, out.stderr


def test_an_unknown_major_is_refused() -> None:
    from abicache import hip
    from abicache.errors import AbicacheError

    with pytest.raises(AbicacheError, match="major 4 is not supported; use one of 5, 6, 7"):
        hip.load_library(major=4)
