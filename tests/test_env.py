from __future__ import annotations

import os
import shutil
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from abicache.env import FACT_NAMES, Facts, toolid
from conftest import run_py


def test_python_facts_describe_this_interpreter() -> None:
    facts = Facts()
    major, minor = sys.version_info[:2]
    assert facts.get("python.version").startswith(f"{major}.{minor}.")
    assert facts.get("python.abi") == f"cp{major}{minor}{sys.abiflags}"
    assert facts.get("python.abi3") == (None if "t" in sys.abiflags else f"{major}.{minor}")


def test_facts_from_dict_never_probe() -> None:
    facts = Facts.from_dict({"python.abi": "cp313t"})
    assert facts.get("python.abi") == "cp313t"
    assert facts.get("python.version") is None
    assert facts.snapshot() == {"python.abi": "cp313t"}


def test_overrides_win_and_the_rest_is_probed() -> None:
    facts = Facts().with_overrides({"torch.version": "2.13.1+cpu"})
    assert facts.get("torch.version") == "2.13.1+cpu"
    assert facts.get("python.implementation") == "cpython"


def test_every_fact_name_has_a_probe_that_runs() -> None:
    snapshot = Facts().probe_all()
    assert set(FACT_NAMES) <= set(snapshot)
    assert snapshot["platform.system"] == os.uname().sysname.lower()


def test_torch_identity_without_importing_torch(tmp_path: Path) -> None:
    """A fake torch package whose version.py carries a local tag; no import happens."""
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('torch must not be imported')\n")
    (pkg / "version.py").write_text(textwrap.dedent("""
        __version__ = '2.13.1+cu130'
        git_version = 'abc123'
        cuda = '13.0'
        hip = None
        debug = False
    """))
    code = textwrap.dedent("""
        import sys
        from abicache.env import Facts
        f = Facts()
        print(f.get('torch.build'))
        print('torch' in sys.modules)
    """)
    out = run_py(code, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{Path(__file__).parents[1] / 'src'}"})
    assert out.returncode == 0, out.stderr
    build, imported = out.stdout.split()
    assert build == "2.13.1+cu130/git=abc123/cuda=13.0/hip=none/cxx11abi=none"
    assert imported == "False"


def test_a_rocm_torch_build_is_known_by_its_hip_version(tmp_path: Path) -> None:
    """torch +rocm: torch.version.hip is part of the build identity, and the flavor is rocm."""
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('torch must not be imported')\n")
    (pkg / "version.py").write_text("__version__ = '2.9.1+rocm6.4'\ngit_version = 'def456'\ncuda = None\n"
                                    "hip = '6.4.43482-0f2d60242'\n")
    code = "from abicache.env import Facts\nf = Facts()\nprint(f.get('torch.build'), f.get('torch.flavor'))"
    out = run_py(code, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{Path(__file__).parents[1] / 'src'}"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2.9.1+rocm6.4/git=def456/cuda=none/hip=6.4.43482-0f2d60242/cxx11abi=none", "rocm"]


def _fake_compiler(folder: Path, version: str) -> Path:
    """A stand-in compiler that logs each call, so we can count subprocesses."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "fakecc"
    exe.write_text(f"#!/bin/sh\necho call >> {folder}/calls\n"
                   f"echo 'Target: x86_64-test-linux' >&2\necho 'fakecc version {version}' >&2\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_compiler_identity_is_memoized_on_disk_by_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _fake_compiler(tmp_path / "bin", "1.0")
    monkeypatch.setenv("CXX", str(exe))
    memo = tmp_path / "memo"
    calls = tmp_path / "bin" / "calls"
    for _ in range(3):
        toolid._memo.clear()  # as a new process: only the disk memo remains
        assert Facts(memo_dir=memo).get("compiler.cxx") == "fakecc version 1.0 target=x86_64-test-linux"
    assert calls.read_text().count("call") == 1
    # Upgrading the compiler changes its stat: it is asked once more.
    exe.write_text(exe.read_text().replace("1.0", "2.0") + "\n")
    toolid._memo.clear()
    assert Facts(memo_dir=memo).get("compiler.cxx") == "fakecc version 2.0 target=x86_64-test-linux"
    assert calls.read_text().count("call") == 2


@pytest.mark.parametrize("planted", ["writable by others", "another user's"])
def test_a_memo_another_user_could_have_written_is_not_believed(planted: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler identity memo steers every key: one planted in tools/ (a store an
    older version left open) must not name the compiler, even after the store is repaired."""
    exe = _fake_compiler(tmp_path / "bin", "1.0")
    monkeypatch.setenv("CXX", str(exe))
    memo = tmp_path / "memo"
    toolid._memo.clear()
    assert Facts(memo_dir=memo).get("compiler.cxx") == "fakecc version 1.0 target=x86_64-test-linux"
    [record] = memo.glob("*.json")
    record.write_text(record.read_text().replace("fakecc version 1.0", "planted version 9"))
    if planted == "writable by others":
        record.chmod(0o666)
    else:
        if os.getuid() != 0:
            pytest.skip("giving the memo to another user needs root")
        os.chown(record, 65534, 65534)  # nobody
    toolid._memo.clear()
    assert Facts(memo_dir=memo).get("compiler.cxx") == "fakecc version 1.0 target=x86_64-test-linux"


def test_compiler_identity_has_no_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _fake_compiler(tmp_path / "a", "1.0")
    b = tmp_path / "elsewhere" / "fakecc"
    b.parent.mkdir()
    shutil.copy2(a, b)
    monkeypatch.setenv("CXX", str(a))
    first = Facts().get("compiler.cxx")
    monkeypatch.setenv("CXX", str(b))
    assert Facts().get("compiler.cxx") == first
    assert str(tmp_path) not in first


def test_missing_compiler_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert Facts().get("compiler.cxx") is None


def test_libstdcxx_floors_are_read_from_the_library() -> None:
    facts = Facts()
    glibcxx = facts.get("platform.glibcxx")
    if glibcxx is None:
        pytest.skip("no libstdc++ in this process")
    assert glibcxx.startswith("3.4.") and int(glibcxx.split(".")[2]) >= 20
    assert facts.get("platform.cxxabi").startswith("1.3.")


def test_the_loaded_libstdcxx_is_found_without_reading_the_process_maps() -> None:
    """dlinfo's link map names the file /proc/self/maps shows (maybe through a link)."""
    from abicache.env import probes

    path = probes._libstdcxx_path()
    if path is None:
        pytest.skip("no libstdc++ here")
    with open("/proc/self/maps") as maps:
        mapped = {line.split(None, 5)[-1].strip() for line in maps if "/libstdc++.so" in line}
    assert os.path.realpath(path) in {os.path.realpath(m) for m in mapped}


@pytest.mark.parametrize("xdg, home", [
    (None, "/home/someone"), ("/var/xdg-cache", "/home/someone"), ("relative/cache", "/home/someone"),
    ("", "/home/someone"), ("/trailing/slash/", "/home/someone"), (None, "relative-home"), (None, None),
])
def test_the_default_root_is_platformdirs_answer(monkeypatch: pytest.MonkeyPatch, xdg: str | None,
                                                 home: str | None) -> None:
    """The fast path on Linux (no platformdirs import on a hit) agrees with platformdirs."""
    import platformdirs

    from abicache.settings import config

    for name, value in (("XDG_CACHE_HOME", xdg), ("HOME", home)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("ABICACHE_DIR", raising=False)
    assert config.default_root() == Path(platformdirs.user_cache_dir("abicache", appauthor=False))


FAKE_DRIVER = r"""
int cuDriverGetVersion(int* v) { *v = 13000; return 0; }
int cuInit(unsigned flags) { return 0; }
int cuDeviceGetCount(int* n) { *n = 2; return 0; }
int cuDeviceGetAttribute(int* value, int attribute, int device) {
    if (attribute == 75) { *value = device == 0 ? 9 : 8; return 0; }
    if (attribute == 76) { *value = 0; return 0; }
    return 1;
}
"""


def test_cuda_facts_from_a_stand_in_driver(tmp_path: Path) -> None:
    """A real shared library with the driver's soname and entry points (no GPU here)."""
    import subprocess as sp

    src = tmp_path / "cuda.c"
    src.write_text(FAKE_DRIVER)
    lib = tmp_path / "libcuda.so.1"
    sp.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(src), "-o", str(lib)], check=True)
    code = "from abicache.env import Facts; f = Facts(); print(f.get('cuda.driver'), f.get('gpu.arch'))"
    out = run_py(code, env={"LD_LIBRARY_PATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["13.0", "sm_80,sm_90"]


COUNTING_INIT = r"""
#include <stdio.h>
#include <stdlib.h>
int cuInit(unsigned flags) {
    FILE* log = fopen(getenv("CUINIT_LOG"), "a");
    fputs("cuInit\n", log);
    fclose(log);
    return 0;
}
"""

REMEMBERED = """
import os
from pathlib import Path
from abicache.env import Facts, cuda_premise
proc = Path(os.environ["FAKE_PROC"])
cuda_premise.BOOT_ID, cuda_premise.MODULE = str(proc / "boot_id"), str(proc / "version")
cuda_premise.GPUS, cuda_premise.DEV, cuda_premise.LD_CACHE = str(proc / "gpus"), str(proc / "dev"), str(proc / "ld.so.cache")
f = Facts(memo_dir=Path(os.environ["FAKE_TOOLS"]))
print(f.get("cuda.driver"), f.get("gpu.arch"))
"""


def fake_proc(proc: Path) -> None:
    """What env/cuda_premise.py reads of a machine with one NVIDIA GPU, as files in proc (the
    child process points the module's paths there: REMEMBERED)."""
    (proc / "gpus" / "0000:18:00.0").mkdir(parents=True)
    (proc / "dev").mkdir()
    (proc / "dev" / "nvidia0").write_text("")
    (proc / "boot_id").write_text("a-boot\n")
    (proc / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04\n")
    (proc / "ld.so.cache").write_text("")


def test_the_driver_is_asked_once_while_nothing_that_decides_its_answer_moves(tmp_path: Path) -> None:
    """cuInit costs 10 to 180 ms a process: the GPUs it finds are remembered under the store's
    tools/ by the boot, the kernel module, the GPUs' PCI addresses, the device nodes and the
    variables that choose devices; any of them changed asks the driver again."""
    import subprocess as sp

    src = tmp_path / "cuda.c"
    src.write_text(FAKE_DRIVER.replace("int cuInit(unsigned flags) { return 0; }", COUNTING_INIT))
    lib = tmp_path / "libcuda.so.1"
    sp.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(src), "-o", str(lib)], check=True)
    proc, tools, log = tmp_path / "proc", tmp_path / "tools", tmp_path / "cuinit.log"
    fake_proc(proc)
    env = {"LD_LIBRARY_PATH": str(tmp_path), "CUINIT_LOG": str(log)}

    def facts(**more: str) -> tuple[list[str], int]:
        out = run_py(REMEMBERED, env={**env, "FAKE_PROC": str(proc), "FAKE_TOOLS": str(tools), **more})
        assert out.returncode == 0, out.stderr
        return out.stdout.split(), log.read_text().count("cuInit") if log.exists() else 0

    assert facts() == (["13.0", "sm_80,sm_90"], 1)
    assert facts() == (["13.0", "sm_80,sm_90"], 1)  # a new process: remembered
    assert facts(CUDA_VISIBLE_DEVICES="1") == (["13.0", "sm_80,sm_90"], 2)
    (proc / "gpus" / "0000:3b:00.0").mkdir()  # a GPU more (hot-plugged)
    assert facts() == (["13.0", "sm_80,sm_90"], 3)
    (proc / "boot_id").write_text("another-boot\n")
    assert facts() == (["13.0", "sm_80,sm_90"], 4)
    assert facts() == (["13.0", "sm_80,sm_90"], 4)
    (proc / "version").unlink()  # no kernel module to read: the driver is asked each time
    assert facts() == (["13.0", "sm_80,sm_90"], 5)
    assert facts() == (["13.0", "sm_80,sm_90"], 6)


def test_a_driver_that_finds_no_gpu_is_asked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a GPU found is remembered: a passing failure must not hide the GPU from later processes."""
    from abicache.env import cuda_probe, toolid

    answers = iter([("13.0", "none"), ("13.0", "sm_90"), ("12.0", None)])
    asked = []
    monkeypatch.setattr(cuda_probe, "_seen", lambda: ("boot", "module", ("gpu",), (), (1, 2), ()))
    monkeypatch.setattr(cuda_probe, "_driver", lambda: asked.append(1) or next(answers))
    for expected in [("13.0", "none"), ("13.0", "sm_90"), ("13.0", "sm_90")]:
        toolid._memo.clear()  # each call as a new process would make it
        assert cuda_probe._driver_remembered(tmp_path) == expected
    assert len(asked) == 2


def test_no_driver_means_no_gpu() -> None:
    """No driver library: no CUDA process here can reach a GPU, so the machine has none."""
    code = "from abicache.env import Facts; f = Facts(); print(f.get('cuda.driver'), f.get('gpu.arch'))"
    out = run_py(code, env={"LD_LIBRARY_PATH": ""})
    import ctypes.util

    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has a CUDA driver")
    assert out.stdout.split() == ["None", "none"]


@pytest.mark.parametrize(("init", "count", "expected"), [
    (100, 1, ["13.0", "none"]),  # CUDA_ERROR_NO_DEVICE (also CUDA_VISIBLE_DEVICES=""): surely none
    (0, 0, ["13.0", "none"]),
    (999, 1, ["13.0", "None"]),  # CUDA_ERROR_UNKNOWN: the GPUs are not known, never "none"
    (3, 1, ["13.0", "None"]),
])
def test_a_driver_that_sees_no_device_means_no_gpu_and_one_that_fails_means_unknown(
        tmp_path: Path, init: int, count: int, expected: list[str]) -> None:
    import subprocess as sp

    src = tmp_path / "cuda.c"
    src.write_text(FAKE_DRIVER.replace("int cuInit(unsigned flags) { return 0; }",
                                       f"int cuInit(unsigned flags) {{ return {init}; }}")
                   .replace("*n = 2;", f"*n = {count};"))
    lib = tmp_path / "libcuda.so.1"
    sp.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(src), "-o", str(lib)], check=True)
    code = "from abicache.env import Facts; f = Facts(); print(f.get('cuda.driver'), f.get('gpu.arch'))"
    out = run_py(code, env={"LD_LIBRARY_PATH": str(tmp_path), "ABICACHE_KFD_TOPOLOGY": str(tmp_path / "no-kfd")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == expected


def test_cuda_runtime_major_from_the_libraries_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from abicache.env import cuda_premise, cuda_probe

    for name in ("libcudart.so.12", "libcudart.so.11.0", "libcudart.so.13"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setattr(cuda_probe, "runtime_dirs", lambda: [tmp_path])
    monkeypatch.setattr(cuda_premise, "loaded_cudart", lambda: None)
    assert cuda_probe.runtime_major() == "13"
    (tmp_path / "libcudart.so.13").unlink()
    assert cuda_probe.runtime_major() == "12"


LOADED = r"""
import ctypes, os, re
from abicache.env import cuda_premise
before = cuda_premise.loaded_cudart()
for path in os.environ["LOAD"].split(os.pathsep):
    ctypes.CDLL(path)
text = open("/proc/self/maps", encoding="utf-8", errors="replace").read()
regex = next((m.group(1) for m in map(re.compile(r"libcudart\.so\.(\d+)").search, text.splitlines()) if m), None)
print(before, cuda_premise.loaded_cudart(), regex)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps is Linux's")
def test_the_loaded_cuda_runtime_is_the_first_mapped_as_the_maps_say(tmp_path: Path) -> None:
    """cuda.runtime's first source, which a hit record of GPU code compares in the served call
    (env/cuda_premise.py): the major of the first libcudart.so.N this process maps. Real
    libraries of those names, built here, loaded in a fresh process: a name with no digits
    after it is no runtime; the answer is the one a regex over the maps gives."""
    import subprocess as sp

    made = []
    for name in ("libcudart.so.x", "libcudart.so.12", "libcudart.so.13"):
        (tmp_path / "c.c").write_text("int cudart_stand_in(void) { return 1; }\n")
        sp.run(["cc", "-shared", "-fPIC", str(tmp_path / "c.c"), "-o", str(tmp_path / name)], check=True)
        made.append(str(tmp_path / name))
    out = run_py(LOADED, env={"LOAD": made[0]})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None", "None"]
    out = run_py(LOADED, env={"LOAD": os.pathsep.join(made)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "None" and out.stdout.split()[1] in ("12", "13")
    assert out.stdout.split()[1] == out.stdout.split()[2]
