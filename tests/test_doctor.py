from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import SRC
from corpus import CXX_STRING, STALE_TORCH, gxx, nvcc, torch_root


def abicache(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abicache", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC), **env}, timeout=300)


def test_doctor_finds_a_stale_torch_extension_and_a_cubin_for_a_missing_arch(tmp_path: Path) -> None:
    root = torch_root()
    torch_ext = tmp_path / "torch_extensions" / "py311_cpu" / "stale_ext"
    triton = tmp_path / "triton" / "cache" / "KEY123"
    fine = tmp_path / "torch_extensions" / "py311_cpu" / "fine_ext"
    for folder in (torch_ext, triton, fine):
        folder.mkdir(parents=True)
    gxx(STALE_TORCH, torch_ext / "stale_ext.so", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=0",
        "-isystem", str(root / "include"))
    gxx(CXX_STRING, fine / "fine_ext.so")
    nvcc(triton / "scale.cubin", "-cubin", "-arch=sm_90")
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"),
           "TRITON_CACHE_DIR": str(tmp_path / "triton" / "cache"),
           "TVM_FFI_CACHE_DIR": str(tmp_path / "none"), "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "none"),
           "HOME": str(tmp_path)}
    out = abicache("doctor", "--json", "--assume", "gpu.arch=sm_80", env=env)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    unsafe = {Path(u["path"]).name: u for u in report["unsafe"]}
    assert set(unsafe) == {"stale_ext.so", "scale.cubin"}
    assert "does not export" in " ".join(unsafe["stale_ext.so"]["reasons"])
    assert unsafe["stale_ext.so"]["delete"] == str(torch_ext)
    assert "gpu.arch ~= sm_90" in " ".join(unsafe["scale.cubin"]["reasons"])
    # On an sm_90 machine the cubin is fine; the stale extension is not.
    again = json.loads(abicache("doctor", "--json", "--assume", "gpu.arch=sm_90", env=env).stdout)
    assert [Path(u["path"]).name for u in again["unsafe"]] == ["stale_ext.so"]
    text = abicache("doctor", "--assume", "gpu.arch=sm_80", env=env).stdout
    assert "cannot be safely loaded here" in text and str(torch_ext) in text


def test_audit_command(tmp_path: Path) -> None:
    lib = gxx(CXX_STRING, tmp_path / "libgreet.so")
    out = abicache("audit", str(lib), env={})
    assert out.returncode == 0, out.stderr
    assert "platform.glibcxx >= 3.4" in out.stdout and "because" in out.stdout
    doc = json.loads(abicache("audit", "--json", str(lib), env={}).stdout)
    assert doc[0]["kind"] == "shared library" and all(r["holds_here"] for r in doc[0]["requirements"])
    (tmp_path / "junk.so").write_bytes(b"\x7fELF\x02\x01\x01garbage")
    out = abicache("audit", str(tmp_path / "junk.so"), env={})
    assert out.returncode == 2 and "truncated or malformed" in out.stdout and "Traceback" not in out.stderr
    out = abicache("audit", str(tmp_path / "nope.so"), env={})
    assert out.returncode == 2 and "No such file" in out.stdout
    out = abicache("audit", "--assume", "oops", str(lib), env={})
    assert out.returncode == 2 and "FACT=VALUE" in out.stderr


def test_doctor_never_suggests_deleting_what_is_not_a_cache_entry(tmp_path: Path) -> None:
    """An unpacked package (here a folder with a cubin abicache judges unloadable) is reported,
    but no `rm -rf` is suggested for it: it is nobody's cache entry."""
    package = tmp_path / "np" / "numpy" / "_core"
    package.mkdir(parents=True)
    nvcc(package / "kernels.cubin", "-cubin", "-arch=sm_90")
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "none"), "TRITON_CACHE_DIR": str(tmp_path / "none"),
           "TVM_FFI_CACHE_DIR": str(tmp_path / "none"), "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "none"),
           "HOME": str(tmp_path)}
    out = abicache("doctor", "--assume", "gpu.arch=sm_80", str(tmp_path / "np"), env=env)
    assert out.returncode == 1, out.stderr
    assert "kernels.cubin" in out.stdout and "rm -rf" not in out.stdout
    assert "not inside a cache abicache recognises" in out.stdout
    report = json.loads(abicache("doctor", "--json", "--assume", "gpu.arch=sm_80", str(tmp_path / "np"),
                                 env=env).stdout)
    assert [u["delete"] for u in report["unsafe"]] == [None]


def test_doctor_quotes_the_folders_it_suggests_deleting(tmp_path: Path) -> None:
    """A cache folder's name can hold a space, ';', '$' or '~': the suggested command
    deletes exactly that folder when pasted into a shell."""
    import shlex

    root = torch_root()
    odd = tmp_path / "torch_extensions" / "py311_cpu" / "~stale ext;$HOME"
    odd.mkdir(parents=True)
    gxx(STALE_TORCH, odd / "stale_ext.so", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=0",
        "-isystem", str(root / "include"))
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"), "TRITON_CACHE_DIR": str(tmp_path / "none"),
           "TVM_FFI_CACHE_DIR": str(tmp_path / "none"), "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "none"),
           "HOME": str(tmp_path)}
    text = abicache("doctor", env=env).stdout
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("rm -rf")]
    assert [shlex.split(line) for line in lines] == [["rm", "-rf", "--", str(odd)]], text


def test_doctor_of_a_path_that_does_not_exist_is_an_error_not_a_clean_bill(tmp_path: Path) -> None:
    out = abicache("doctor", str(tmp_path / "nonexistent"), env={})
    assert out.returncode == 2 and "no such file or folder" in out.stderr and "nonexistent" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
