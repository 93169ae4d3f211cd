"""ABICACHE_DROPIN: existing torch code, unchanged, builds through abicache
when the variable is set, from the wheel a user installs (its .pth runs the
hook at start-up)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from abicache import dropin
from conftest import ROOT, SRC

# A user's code, untouched: torch's own import, torch's own call.
USER_CODE = textwrap.dedent("""
    import json, os, sys
    from torch.utils.cpp_extension import load_inline
    path = load_inline("dropin_probe", "extern \\"C\\" int probe() { return 7; }", is_python_module=False,
                       no_implicit_headers=True)
    import ctypes
    print(json.dumps({"value": ctypes.CDLL(path).probe(), "path": path,
                      "abicache": "abicache" in sys.modules}))
""")


@pytest.mark.parametrize("value, frontends, unknown", [
    ("torch", ["torch"], []), ("torch, TVM-FFI", ["torch", "tvm_ffi"], []), ("all", ["torch", "tvm_ffi"], []),
    ("1", ["torch", "tvm_ffi"], []), ("", [], []), ("0", [], []), ("torch,numba", ["torch"], ["numba"]),
])
def test_the_variable_names_frontends(value: str, frontends: list[str], unknown: list[str]) -> None:
    assert dropin.chosen(value) == (frontends, unknown)


def _torch() -> None:
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0:
        pytest.skip("torch is not installed (bash scripts/bootstrap.sh installs the CPU wheel)")


def test_the_start_up_hook_imports_nothing_but_itself() -> None:
    """Every Python process of a user who set ABICACHE_DROPIN runs the hook, torch user or
    not: it may add abicache's package (its version only) and the hook, nothing else (it
    added about 70 ms: the cache, typing, pathlib... when they are not already loaded)."""
    code = ("import os, sys; before = set(sys.modules); "
            "os.environ.get('ABICACHE_DROPIN') and __import__('abicache.dropin').dropin.arm(); "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DROPIN": "torch,tvm_ffi"})
    assert done.returncode == 0, done.stderr
    added = set(done.stdout.split())
    assert added <= {"abicache", "abicache.dropin", "__future__"}, added


def test_arm_patches_the_module_when_it_is_imported(tmp_path: Path) -> None:
    """Nothing is imported up front; the name imported afterwards is abicache's."""
    _torch()
    code = textwrap.dedent("""
        import sys
        from abicache import dropin
        dropin.arm("torch")
        assert "torch" not in sys.modules and "abicache.torch" not in sys.modules
        from torch.utils.cpp_extension import load_inline
        import abicache.torch
        print(load_inline is abicache.torch.load_inline)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(tmp_path / "s")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv (seeing this interpreter's packages, torch among them) with abicache
    installed from the wheel built from this tree, as a user installs it."""
    _torch()
    work = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(work / "dist"), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    wheels = list((work / "dist").glob("abicache-*.whl"))
    assert len(wheels) == 1
    venv = work / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    _see_this_venv(venv)
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                                str(wheels[0])], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return venv


def _see_this_venv(venv: Path) -> None:
    """--system-site-packages shows the base interpreter's packages: where the suite runs
    in a venv of its own (the README's PEP 668 advice), torch is in that venv, so its
    folders are named to the new one too (a .pth of plain folders: their own .pth files,
    this tree's editable abicache among them, are not read)."""
    import site

    if sys.prefix == sys.base_prefix:
        return
    query = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", query],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    Path(purelib, "outer-venv.pth").write_text("".join(f"{folder}\n" for folder in site.getsitepackages()))


def _run(venv: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ABICACHE_DROPIN")}
    return subprocess.run([str(venv / "bin" / "python"), "-c", USER_CODE], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path,
                          env={**clean, "ABICACHE_DIR": str(tmp_path / "store"),
                               "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch-ext"), **env})


def test_the_wheel_routes_unchanged_torch_code(wheel_venv: Path, tmp_path: Path) -> None:
    import json

    site = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", "import abicache, sys; print(abicache.__file__)"],
                          capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                               if k != "PYTHONPATH"})
    assert str(wheel_venv) in site.stdout, site.stdout + site.stderr  # the wheel's abicache, not this tree's
    assert list(wheel_venv.glob("lib/python*/site-packages/abicache-dropin.pth"))

    routed = _run(wheel_venv, tmp_path, ABICACHE_DROPIN="torch")
    assert routed.returncode == 0, routed.stderr[-3000:]
    got = json.loads(routed.stdout.strip().splitlines()[-1])
    assert got["value"] == 7 and got["abicache"]
    assert Path(got["path"]).resolve().is_relative_to((tmp_path / "store").resolve())
    assert not (tmp_path / "torch-ext").exists()

    (tmp_path / "plain").mkdir()
    plain = _run(wheel_venv, tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr[-3000:]
    got = json.loads(plain.stdout.strip().splitlines()[-1])
    assert got["value"] == 7 and not got["abicache"]  # unset: the .pth imports nothing
    assert Path(got["path"]).resolve().is_relative_to((tmp_path / "plain" / "torch-ext").resolve())


def test_an_unknown_name_is_reported_and_python_runs_on(wheel_venv: Path, tmp_path: Path) -> None:
    out = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", "print('ran')"], capture_output=True,
                         text=True, timeout=120,
                         env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                              "ABICACHE_DROPIN": "torch,numba"})
    assert out.returncode == 0 and out.stdout.strip() == "ran"
    assert "ABICACHE_DROPIN names numba" in out.stderr and "torch, tvm_ffi" in out.stderr


def test_the_readmes_editable_install_routes_unchanged_torch_code(tmp_path: Path) -> None:
    """`pip install -e .`, as the README installs it: its editable wheel held only a path to
    src/, no abicache-dropin.pth, and ABICACHE_DROPIN=torch did nothing, without a word."""
    import json

    _torch()
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    _see_this_venv(venv)
    # this interpreter's pip and setuptools build it (a venv's bundled setuptools may be older)
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                                "-q", "--no-deps", "--no-build-isolation", "-e", str(ROOT)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert list(venv.glob("lib/python*/site-packages/abicache-dropin.pth"))
    routed = _run(venv, tmp_path, ABICACHE_DROPIN="torch")
    assert routed.returncode == 0, routed.stderr[-3000:]
    got = json.loads(routed.stdout.strip().splitlines()[-1])
    assert got["value"] == 7 and got["abicache"]
    assert not (tmp_path / "torch-ext").exists()
