"""abicache.triton with real Triton compiles for an sm_90 target (no GPU needed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import hostile
from abicache import Cache
from conftest import ROOT, SRC
from remote_fixtures import redis_srv  # noqa: F401  (a fixture)
from venvs import reused

KERNEL = Path(__file__).with_name("triton_kernel.py")


def has_triton(python: str) -> bool:
    return subprocess.run([python, "-c", "import triton.compiler"], capture_output=True).returncode == 0


def triton_version(python: str) -> str:
    return subprocess.run([python, "-c", "from importlib.metadata import version; print(version('triton'))"],
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def py311() -> str:
    if not has_triton(sys.executable):
        pytest.skip("triton is not installed for this interpreter (pip install triton)")
    return sys.executable


@pytest.fixture(scope="module")
def py312() -> str:
    """A venv of pyenv's 3.12 with Triton and abicache, made once and reused."""
    base = Path.home() / ".pyenv" / "versions"
    found = sorted(base.glob("3.12.*/bin/python3")) if base.is_dir() else []
    if not found:
        pytest.skip("no Python 3.12 under pyenv")
    version = triton_version(sys.executable) or "3.9.0"  # the same Triton as this interpreter's, or no comparison
    with reused("py312-triton") as venv:
        python = venv / "bin" / "python"
        if not (python.exists() and has_triton(str(python)) and triton_version(str(python)) == version):
            shutil.rmtree(venv, ignore_errors=True)
            made = subprocess.run([str(found[-1]), "-m", "venv", str(venv)], capture_output=True, text=True)
            installed = subprocess.run([str(python), "-m", "pip", "install", "-q", f"triton=={version}", "-e",
                                        str(ROOT)], capture_output=True, text=True) if made.returncode == 0 else made
            if installed.returncode != 0:
                pytest.skip(f"cannot make a 3.12 venv with triton: {installed.stderr[-400:]}")
    return str(python)


def compile_with(python: str, root: Path, **env: str) -> dict:
    full = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(root),
            "TRITON_CACHE_DIR": str(root.parent / "triton-default"), **env}
    out = subprocess.run([python, str(KERNEL)], capture_output=True, text=True, env=full, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def entries(root: Path, kind: str | None = "triton") -> list:
    """The kernels in the store (kind "triton"); "triton.file" holds each put() alone."""
    return [v for v in Cache(root).store.iter_variant_dirs() if kind in (None, v.parent.parent.name)]


def test_one_compile_serves_python_311_and_312(py311: str, py312: str, tmp_path: Path) -> None:
    root = tmp_path / "store"
    first = compile_with(py311, root)
    second = compile_with(py312, root)
    assert (first["py"], second["py"]) == ("3.11", "3.12")
    assert first["cubin_sha"] == second["cubin_sha"]
    assert len(entries(root)) == 1  # the second interpreter hit
    cubins = [p for p in (root / "v3" / "blobs").rglob("*") if p.is_file() and
              __import__("hashlib").sha256(p.read_bytes()).hexdigest() == first["cubin_sha"]]
    assert len(cubins) == 1
    assert first["libtriton_opened"] == [] and second["libtriton_opened"] == []


def test_the_requirements_come_from_the_audit_and_none_is_on_python(py311: str, tmp_path: Path) -> None:
    root = tmp_path / "store"
    compile_with(py311, root)
    manifest = Cache(root).store.read_manifest(entries(root)[0])
    reqs = manifest.requirements.to_list()
    assert any(r.startswith("gpu.arch ~= ") and "sm_90" in r for r in reqs)
    assert not any(r.startswith("python.") for r in reqs)


def test_a_moved_cache_keeps_hitting(py311: str, tmp_path: Path) -> None:
    root = tmp_path / "store"
    compile_with(py311, root)
    moved = tmp_path / "elsewhere" / "store"
    moved.parent.mkdir()
    root.rename(moved)
    again = compile_with(py311, moved)
    assert again["compile_s"] < 5 and len(entries(moved)) == 1


@pytest.mark.parametrize("change", [{"BLOCK": "256"}, {"BODY": "alt"}, {"WARPS": "8"}, {"ARCH": "80"},
                                    {"TRITON_DEFAULT_FP_FUSION": "0"}],
                         ids=["constexpr", "source", "num_warps", "arch", "env-var"])
def test_what_changes_the_output_is_a_miss(py311: str, tmp_path: Path, change: dict) -> None:
    root = tmp_path / "store"
    compile_with(py311, root)
    compile_with(py311, root, **change)
    assert len(entries(root)) == 2


def test_sigkill_during_compile_and_put(py311: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    killed = 0
    for i, delay in enumerate((0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.45, 0.6)):  # import, compile, publish
        root = tmp_path / f"store{i}"
        proc = subprocess.Popen([py311, str(KERNEL)], env={**env, "ABICACHE_DIR": str(root)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        killed += proc.wait() == -signal.SIGKILL
        cache = Cache(root)
        for vdir in entries(root, None):  # whatever is visible is whole
            assert cache.store.full_problem(vdir, cache.store.read_manifest(vdir)) is None
        result = compile_with(py311, root)
        assert result["cubin_sha"] and len(entries(root)) == 1
    assert killed >= 4


def test_unknown_cache_interface_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, py311: str) -> None:
    import triton.runtime.cache as cache_mod

    import abicache.triton as at
    from abicache.errors import AbicacheError

    class Old:  # a Triton without get_group/put_group
        def get_file(self): ...
        def put(self): ...

    monkeypatch.setattr(cache_mod, "CacheManager", Old)
    with pytest.raises(AbicacheError, match="lacks get_file/put/get_group/put_group"):
        at.install()


def test_codegen_key_is_memoized_and_leaves_out_libtriton(py311: str, tmp_path: Path) -> None:
    import abicache.triton as at
    from abicache.env import toolid

    toolid._memo.clear()
    start = time.perf_counter()
    key = at.codegen_key(tmp_path)
    first = time.perf_counter() - start
    toolid._memo.clear()  # as a new process: only the disk memo remains
    start = time.perf_counter()
    assert at.codegen_key(tmp_path) == key
    assert time.perf_counter() - start < max(first, 0.05)
    import triton

    assert key.startswith(triton.__version__)


LONE_PUT = """
import sys
import abicache.triton
abicache.triton.install()
from triton.runtime.cache import get_cache_manager
manager = get_cache_manager("ab12" * 16)
if sys.argv[1] == "put":
    print(manager.put(b"\\x00launcher bytes", "cuda_utils.bin", binary=True))
else:
    print(manager.get_file("cuda_utils.bin"))
"""


def test_a_hit_runs_no_program_and_tritons_probes_keep_their_answers(py311: str, tmp_path: Path) -> None:
    """Triton describes its tools anew in every process (`ptxas --version` twice, `file` on the
    Python executable for its launcher's key): install() remembers Triton's own answers."""
    root = tmp_path / "store"
    first = compile_with(py311, root, PLATFORM_KEY="1")
    assert any(p.startswith("ptxas") for p in first["spawned"]), first["spawned"]
    second = compile_with(py311, root, PLATFORM_KEY="1")
    assert second["spawned"] == [], second["spawned"]
    assert second["cubin_sha"] == first["cubin_sha"]
    own = subprocess.run([py311, "-c", "import triton.runtime.build as b, triton.backends.nvidia.compiler as c; "
                          "print(b.platform_key()); print(repr(c.get_ptxas_version(90)))"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    ours = subprocess.run([py311, "-c", "import abicache.triton; abicache.triton.install(); "
                           "import triton.runtime.build as b, triton.backends.nvidia.compiler as c; "
                           "print(b.platform_key()); print(repr(c.get_ptxas_version(90)))"],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(root)}).stdout.splitlines()
    assert ours == own and second["platform_key"] == own[0]


def test_another_ptxas_is_asked_for_its_version(py311: str, tmp_path: Path) -> None:
    """The remembered version belongs to the binary Triton would run: naming another ptxas
    (TRITON_PTXAS_PATH, which Triton's knobs also set when set in code), or changing it, asks again."""
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.1'\n")
    fake.chmod(0o755)
    code = ("import abicache.triton; abicache.triton.install(); import triton.backends.nvidia.compiler as c; "
            "print(c.get_ptxas_version(80).strip())")
    env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(tmp_path / "store"),
           "TRITON_PTXAS_PATH": str(fake)}

    def version() -> str:
        return subprocess.run([py311, "-c", code], capture_output=True, text=True, check=True, env=env).stdout.strip()

    assert version().endswith("V12.8.1")
    assert version().endswith("V12.8.1")
    time.sleep(0.01)
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.9, V12.9.2'\n")
    assert version().endswith("V12.9.2")
    env.pop("TRITON_PTXAS_PATH")
    assert "V12.9.2" not in version()


def test_a_repeated_get_file_is_answered_from_memory_until_the_file_changes(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton asks for its launcher once per kernel: a repeat is one stat, and the file gone
    (gc, quarantine) or changed (a chmod, a write: the ctime moves) sends it to the store again."""
    import abicache.triton as at

    monkeypatch.setenv("ABICACHE_DIR", str(tmp_path / "store"))
    monkeypatch.setattr(at, "_cache", None)
    path = at.CacheManager("launcher-key").put(b"launcher", "__launcher.so")
    lookups: list[str] = []
    from abicache.core.getting import Getting  # where an opened Cache's lookup is

    lookup = Getting.lookup
    monkeypatch.setattr(Getting, "lookup", lambda self, *a, **k: lookups.append(a[0]) or lookup(self, *a, **k))
    assert at.CacheManager("launcher-key").get_file("__launcher.so") == path and len(lookups) == 1
    assert at.CacheManager("launcher-key").get_file("__launcher.so") == path and len(lookups) == 1
    os.chmod(path, 0o400)  # changed: the store is asked, and refuses nothing it should keep
    os.chmod(path, 0o444)
    assert at.CacheManager("launcher-key").get_file("__launcher.so") == path and len(lookups) == 2
    Cache(tmp_path / "store").store.quarantine(Path(path).parent, "moved aside by the test")
    assert at.CacheManager("launcher-key").get_file("__launcher.so") is None and len(lookups) >= 3


def test_a_lone_put_is_found_by_the_next_process(py311: str, tmp_path: Path) -> None:
    """Triton caches its launcher and driver modules with put() and no put_group()."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(tmp_path / "store")}
    put = subprocess.run([py311, "-c", LONE_PUT, "put"], capture_output=True, text=True, env=env)
    assert put.returncode == 0, put.stderr[-2000:]
    got = subprocess.run([py311, "-c", LONE_PUT, "get"], capture_output=True, text=True, env=env)
    assert got.returncode == 0, got.stderr[-2000:]
    path = got.stdout.strip()
    assert path == put.stdout.strip() and Path(path).read_bytes() == b"\x00launcher bytes"
    assert len(entries(tmp_path / "store", "triton.file")) == 1


@pytest.mark.parametrize("knob", ["TRITON_KERNEL_DUMP", "TRITON_KERNEL_OVERRIDE"])
def test_dump_and_override_modes_compile(py311: str, tmp_path: Path, knob: str) -> None:
    dump = tmp_path / "dump"
    result = compile_with(py311, tmp_path / "store", **{knob: "1", "TRITON_DUMP_DIR": str(dump),
                                                         "TRITON_OVERRIDE_DIR": str(tmp_path / "override")})
    assert result["cubin_sha"] and len(entries(tmp_path / "store")) == 1
    if knob == "TRITON_KERNEL_DUMP":  # Triton's own manager wrote the dump, where the user asked
        assert list(dump.rglob("*.ptx"))


def test_triton_cache_dir_holds_the_store_when_abicache_dir_is_unset(py311: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ABICACHE_DIR"}
    env.update({"PYTHONPATH": str(SRC), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
                "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    out = subprocess.run([py311, str(KERNEL)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(entries(tmp_path / "triton" / "abicache")) == 1
    assert not (tmp_path / "xdg").exists() or not list((tmp_path / "xdg").glob("abicache/v3/entries/*/*/*.*"))


PUT_KINDS = """
import sys
import abicache.triton
abicache.triton.install()
from triton.runtime.cache import get_cache_manager
m = get_cache_manager("cd" * 32)
for i, data in enumerate([b"raw", bytearray(b"ba"), "text", 7]):
    print(open(m.put(data, f"f{i}.txt"), "rb").read())
"""


def test_put_writes_what_tritons_manager_writes(py311: str, tmp_path: Path) -> None:
    """bytes as they are; anything else, a bytearray too, as its str()."""
    out = subprocess.run([py311, "-c", PUT_KINDS], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(tmp_path / "s")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:4] == [repr(b"raw"), repr(b"bytearray(b'ba')"), repr(b"text"), repr(b"7")]


GROUP_RECORD = """
import json, os, sys
from pathlib import Path
from triton.runtime.cache import FileCacheManager
import abicache.triton
key = "ef" * 32
if sys.argv[1] == "put":
    for manager in (abicache.triton.CacheManager(key), FileCacheManager(key)):
        paths = {name: manager.put(name.encode(), name) for name in ("k.cubin", "k.json")}
        print(json.dumps(Path(manager.put_group("k.json", paths)).name))
else:
    for manager in (abicache.triton.CacheManager(key), FileCacheManager(key)):
        record = json.loads(open(manager.get_file("__grp__k.json")).read())
        group = manager.get_group("k.json")
        print(json.dumps([sorted(record), sorted(record["child_paths"]), record["child_paths"] == group,
                          [open(p).read() for _, p in sorted(group.items())]]))
"""


def test_the_group_record_reads_as_tritons(py311: str, tmp_path: Path) -> None:
    """put_group returns, and get_file("__grp__…") finds in a new process, a record
    in Triton's own shape ({"child_paths": {...}}) naming the group's files."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(tmp_path / "s"),
           "TRITON_CACHE_DIR": str(tmp_path / "t")}
    put = subprocess.run([py311, "-c", GROUP_RECORD, "put"], capture_output=True, text=True, timeout=120, env=env)
    assert put.returncode == 0, put.stderr[-2000:]
    ours, tritons = put.stdout.split()
    assert ours == tritons == json.dumps("__grp__k.json")
    got = subprocess.run([py311, "-c", GROUP_RECORD, "get"], capture_output=True, text=True, timeout=120, env=env)
    assert got.returncode == 0, got.stderr[-2000:]
    ours, tritons = got.stdout.strip().splitlines()
    assert json.loads(ours) == json.loads(tritons) == [["child_paths"], ["k.cubin", "k.json"], True,
                                                       ["k.cubin", "k.json"]]



KERNEL_GROUPS = """
import os, sys
import abicache.triton
for i in range(5):  # kernels of one name: their files differ, their names do not
    manager = abicache.triton.CacheManager(f"{i:02d}" * 32)
    paths = {name: manager.put(os.urandom(256), name) for name in ("k.cubin", "k.json", "k.ptx")}
    manager.put_group("k.json", paths)
"""


def test_kernels_compiled_in_one_process_are_hit_in_the_next_without_a_write(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The first lookups after a compiling process hash nothing and write nothing: its entries
    were stamped before it exited, and no file of a kernel is a blob every kernel shares (a
    list of the group's names was one, and each new kernel's link moved its ctime)."""
    import abicache.triton as at
    from abicache.store import blobs

    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", KERNEL_GROUPS], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(store)})
    assert done.returncode == 0, done.stderr[-2000:]
    monkeypatch.setenv("ABICACHE_DIR", str(store))
    monkeypatch.setattr(at, "_cache", None)
    hashed: list[Path] = []
    real = blobs.hash_file
    monkeypatch.setattr(blobs, "hash_file", lambda p: hashed.append(p) or real(p))
    before = {p: p.lstat().st_mtime_ns for p in store.rglob("*")}
    for i in range(5):
        group = at.CacheManager(f"{i:02d}" * 32).get_group("k.json")
        assert group is not None and sorted(group) == ["k.cubin", "k.json", "k.ptx"]
    assert hashed == []
    assert {p: p.lstat().st_mtime_ns for p in store.rglob("*")} == before


@pytest.fixture(scope="module", params=["3.2.0", "3.6.0"])
def older_triton(request: pytest.FixtureRequest) -> str:
    """A venv of this interpreter with another Triton (torch 2.6 pins 3.2; the GPU image has 3.6)."""
    version = request.param
    with reused(f"py{sys.version_info[0]}{sys.version_info[1]}-triton{version.replace('.', '')[:2]}") as venv:
        python = venv / "bin" / "python"
        # importing triton.compiler loads every backend: 3.2's AMD one imports setuptools, which
        # Python 3.12's venvs no longer carry, so the probe imports that far and setuptools comes along
        probe = [str(python), "-c", "import triton.compiler, sys; sys.exit(triton.__version__ != sys.argv[1])", version]
        if not (python.exists() and subprocess.run(probe, capture_output=True).returncode == 0):
            shutil.rmtree(venv, ignore_errors=True)
            made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
            installed = subprocess.run([str(python), "-m", "pip", "install", "-q", f"triton=={version}", "setuptools",
                                        "-e", str(ROOT)],
                                       capture_output=True, text=True, timeout=1200) if made.returncode == 0 else made
            if installed.returncode != 0:
                pytest.skip(f"cannot make a venv with triton {version}: {installed.stderr[-400:]}")
    return str(python)


def test_each_triton_version_hits_misses_and_dumps(older_triton: str, tmp_path: Path) -> None:
    root = tmp_path / "store"
    first = compile_with(older_triton, root)
    again = compile_with(older_triton, root)
    assert first["triton"] != "3.9.0" and first["cubin_sha"] == again["cubin_sha"]
    assert len(entries(root)) == 1 and not list((tmp_path / "triton-default").rglob("*.cubin"))  # a hit, ours
    other = compile_with(older_triton, root, BLOCK="64")
    assert other["cubin_sha"] != first["cubin_sha"] and len(entries(root)) == 2
    dumped = compile_with(older_triton, tmp_path / "dump-store", TRITON_KERNEL_DUMP="1",
                          TRITON_DUMP_DIR=str(tmp_path / "dump"))
    assert dumped["cubin_sha"] == first["cubin_sha"] and list((tmp_path / "dump").rglob("*.ptx"))


def test_remote_cache_backend_serves_another_machine(py311: str, tmp_path: Path, redis_srv: object) -> None:
    """Triton's own RemoteCacheManager over abicache's remote tier: a second machine
    (another local store, another TRITON_CACHE_DIR) gets the kernel without compiling."""
    remote = redis_srv.url(uuid.uuid4().hex[:12])  # type: ignore[attr-defined]
    kernel_env = {"TRITON_CACHE_MANAGER": "triton.runtime.cache:RemoteCacheManager",
                  "TRITON_REMOTE_CACHE_BACKEND": "abicache.triton:RemoteCacheBackend",
                  "ABICACHE_REMOTE": remote, "DEFAULT_CACHE": "1"}  # Triton's own manager and key
    results = []
    for machine in ("one", "two"):
        env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_DIR": str(tmp_path / machine / "store"),
               "TRITON_CACHE_DIR": str(tmp_path / machine / "triton"), **kernel_env}
        out = subprocess.run([py311, str(KERNEL)], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert results[0]["cubin_sha"] == results[1]["cubin_sha"]
    assert (results[0]["assembled"], results[1]["assembled"]) == (1, 0)  # compiled once, on machine one
    fetched = Cache(tmp_path / "two" / "store").store.iter_variant_dirs()
    origins = {hostile.manifest_doc(v).get("kind") for v in fetched}
    assert origins == {"triton.file"}  # machine two's files came through abicache


# ---- the native libraries that compile: in the key where the version does not vouch for them ----

KEY_OF_STANDIN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import abicache.triton as at
print(at.codegen_key(None))
"""


def _standin_triton(site: Path, native: bytes, *, direct_url: bool = False) -> Path:
    """A Triton distribution as pip leaves it: the package (sources, _C/libtriton.so: a real
    library compiled here), its dist-info with METADATA and RECORD written last."""
    pkg = site / "triton"
    for sub in ("compiler", "backends", "language", "runtime", "_C"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("__version__ = '9.9.0'\n")
    (pkg / "compiler" / "compiler.py").write_text("X = 1\n")
    (pkg / "runtime" / "cache.py").write_text("Y = 1\n")
    src = site / "lib.c"
    src.write_bytes(b"int triton_codegen(void) { return %d; }\n" % len(native))
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(pkg / "_C" / "libtriton.so"), str(src)], check=True)
    with open(pkg / "_C" / "libtriton.so", "ab") as f:
        f.write(native)  # another build of it: other bytes
    info = site / "triton-9.9.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: triton\nVersion: 9.9.0\n")
    if direct_url:
        (info / "direct_url.json").write_text('{"url": "file:///src/triton", "dir_info": {"editable": true}}')
    rows = [f"{p.relative_to(site).as_posix()},sha256=x,{p.stat().st_size}" for p in sorted(pkg.rglob("*"))
            if p.is_file()]
    time.sleep(0.02)
    (info / "RECORD").write_text("\n".join([*rows, "triton-9.9.0.dist-info/RECORD,,"]) + "\n")
    return site


def _key_of(site: Path) -> str:
    return subprocess.run([sys.executable, "-c", KEY_OF_STANDIN, str(site)], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(SRC)}).stdout.strip()


def test_an_index_wheels_libtriton_is_named_by_the_version(tmp_path: Path) -> None:
    """Two wheels of one version (one per Python version) differ in libtriton.so's bytes
    and make the same code: one key, as before."""
    a = _key_of(_standin_triton(tmp_path / "a", b"\0py311"))
    b = _key_of(_standin_triton(tmp_path / "b", b"\0py312"))
    assert a == b and a.startswith("9.9.0-")


def test_a_libtriton_rebuilt_in_place_after_the_install_is_in_the_key(tmp_path: Path) -> None:
    """A libtriton.so rebuilt over the installed one compiles other code under the same
    version: the key left it out, and served the old build's kernels."""
    site = _standin_triton(tmp_path / "a", b"\0one")
    before = _key_of(site)
    time.sleep(0.02)
    with open(site / "triton" / "_C" / "libtriton.so", "ab") as f:
        f.write(b"\0rebuilt")
    assert _key_of(site) != before


def test_a_source_installs_libtriton_is_in_the_key(tmp_path: Path) -> None:
    """An editable or source install (direct_url.json): its version does not name the bytes."""
    one = _key_of(_standin_triton(tmp_path / "a", b"\0one", direct_url=True))
    two = _key_of(_standin_triton(tmp_path / "b", b"\0two", direct_url=True))
    assert one != two


def test_a_libtriton_rebuilt_in_place_changes_the_key_in_the_same_process(tmp_path: Path) -> None:
    """The key's memo (in the process and under tools/) is keyed on the native libraries' stats too."""
    site = _standin_triton(tmp_path / "a", b"\0one")
    code = KEY_OF_STANDIN.replace("print(at.codegen_key(None))", """
import time
from pathlib import Path
memo = Path(sys.argv[2])
before = at.codegen_key(memo)
time.sleep(0.02)
with open(sys.argv[1] + "/triton/_C/libtriton.so", "ab") as f:
    f.write(b"\\0rebuilt")
print(before != at.codegen_key(memo))
""")
    out = subprocess.run([sys.executable, "-c", code, str(site), str(tmp_path / "tools")], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.stdout.strip() == "True", out.stderr[-2000:]
