from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))  # test this checkout, whatever an editable install points at

from abicache import Cache  # noqa: E402
from abicache.env import Facts  # noqa: E402

# A keeper outlives the test that started it (hits/keeper.py): none for the whole run, module and
# session fixtures included (they run before _isolated_env); tests/test_keeper.py starts its own.
os.environ["ABICACHE_KEEPER"] = "0"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test touches the user's cache, and progress lines stay off."""
    monkeypatch.setenv("ABICACHE_DIR", str(tmp_path / "default-root"))
    monkeypatch.setenv("ABICACHE_PROGRESS", "0")
    monkeypatch.setenv("ABICACHE_KEEPER", "0")  # as set above, whatever a test before this one left
    monkeypatch.delenv("ABICACHE_EXPLAIN", raising=False)
    monkeypatch.delenv("ABICACHE_SHARED", raising=False)
    for name in ("ABICACHE_REMOTE", "ABICACHE_REMOTE_MODE", "ABICACHE_REMOTE_TIMEOUT", "ABICACHE_REMOTE_LEASE",
                 "ABICACHE_SIGNING_KEY", "ABICACHE_TRUSTED_KEYS", "ABICACHE_MAX_SIZE", "ABICACHE_LEASE_STUCK",
                 "ABICACHE_LEASE_WAIT", "ABICACHE_RETRY_FAILED", "ABICACHE_READ_STORES"):
        monkeypatch.delenv(name, raising=False)
    # the user's own config file (~/.config/abicache/config.toml) must not steer the tests
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))
    from abicache.settings import settings_file
    from abicache.shipping import tiers

    settings_file.forget()
    tiers.forget()  # read-only stores are found once per process: each test finds its own


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def cache(root: Path) -> Cache:
    return Cache(root)


def writer(files: dict[str, bytes | str]) -> Callable[[Path], None]:
    """A builder that writes the given files (no compiler needed)."""

    def build(out: Path) -> None:
        for name, content in files.items():
            path = out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode() if isinstance(content, str) else content
            path.write_bytes(data)

    return build


def plant(path: Path, kind: str, outside: Path) -> None:
    """What a neighbour plants where abicache opens a file: a FIFO ("fifo": a plain open()
    waits for a writer for ever), or a symbolic link to outside, an empty file made there."""
    if kind == "fifo":
        os.mkfifo(path)
    else:
        outside.write_text("")
        path.symlink_to(outside)


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed")
    return path


def alive(pid: int) -> bool:
    """Whether the process is there and has not ended: a zombie (its parent has not waited for
    it yet) has."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2:][:1] not in (b"Z", b"X")


def python_with_src(version: str) -> str:
    """A pyenv interpreter of that version, or skip."""
    base = Path.home() / ".pyenv" / "versions"
    for candidate in sorted(base.glob(f"{version}.*")) if base.is_dir() else []:
        exe = candidate / "bin" / "python3"
        if exe.exists():
            return str(exe)
    pytest.skip(f"no Python {version} under {base}")


def run_py(code: str, *, python: str = sys.executable, env: dict[str, str] | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return subprocess.run([python, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def fixed_facts(**overrides: str | None) -> Facts:
    """Real probed facts with some replaced (what the hit path would see elsewhere)."""
    return Facts().with_overrides({k.replace("__", "."): v for k, v in overrides.items()})


def gpu_present() -> str | None:
    """None if a driver answers with at least one GPU, else why not."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"no NVIDIA driver: {exc}"
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "the driver sees no GPU"
    return None


@contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of that size mounted at folder (remount it read-only with read_only()); mounting
    needs root: skipped with the reason otherwise. Unmounted after."""
    folder.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()[:80]}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def read_only(mount: Path) -> None:
    assert subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True).returncode == 0


# --- running the suite in parallel (pytest-xdist: `-n auto --dist loadscope` in pyproject.toml) ---

#: the modules that build torch extensions or wait on real timeouts, longest first (by
#: `--durations` on a 2-core machine). They are handed out first so that the workers finish
#: together; in the order of their names they came last and ran alone at the end.
LONGEST_FIRST = ("test_torch_newest.py", "test_torch_dropin.py", "test_lease.py", "test_torch_frontend.py",
                 "test_docs_blocks.py", "test_tvm_ffi.py", "test_bundle.py", "test_remote.py", "test_ship_e2e.py",
                 "test_fidelity.py", "test_bundle_split.py", "test_torch_compile_cache.py", "test_build.py", "test_crash.py",
                 "test_audit.py", "test_torch_lines.py", "test_store_safety.py", "test_triton.py")


def pytest_sessionstart(session: pytest.Session) -> None:
    """abicache's bytecode, compiled once before the workers start. With PYTHONDONTWRITEBYTECODE=1
    (set on this project's machines) every one of the suite's subprocesses compiled each module
    it imported again: 0.1 s of CPU per process that imports the CLI, over a thousand of them."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        import compileall

        compileall.compile_dir(str(SRC / "abicache"), quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the order within a module is kept


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers a core (4 on 2 cores), at most 8. Half of the suite's time is spent
    waiting (leases, timeouts, servers), so one worker a core left the cores idle."""
    return min(8, 2 * (os.cpu_count() or 1))
