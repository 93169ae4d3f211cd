"""Read-only stores (tiers.py): a package's prebuilt entries, found after the local store.

Each test proves "zero compiles" the strong way: the lookup runs in a process
whose PATH has no compiler at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from conftest import SRC, need, read_only, tmpfs

ADD = 'extern "C" int add(int a, int b) { return a + b; }'
LOAD = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("always")
    from abicache import Cache, cc
    cache = Cache(sys.argv[1])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            art = cc.build_library("adder", [sys.argv[2]] if len(sys.argv) > 2 else [ADD], cache=cache)
            import ctypes
            value = ctypes.CDLL(str(art.file())).add(2, 40)
            out = {"origin": art.origin, "path": str(art.path), "value": value}
        except Exception as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out["said"] = [str(w.message) for w in said]
    print(json.dumps(out))
""").replace("ADD", repr(ADD))


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "mnt", "64m") as where:
        yield where


def _read_only(mount: Path) -> None:
    read_only(mount)


def _bare_path(tmp_path: Path) -> str:
    """A PATH with the interpreter and nothing else: no cc, c++, clang, ld."""
    bare = tmp_path / "bare-bin"
    bare.mkdir(exist_ok=True)
    if not (bare / "python3").exists():
        os.symlink(sys.executable, bare / "python3")
    return str(bare)


def _load(local: Path, tmp_path: Path, *args: str, compilers: bool = False, **env: str) -> dict:
    full = {**os.environ, "PYTHONPATH": str(SRC), "CC": "", "CXX": "", **env}
    if not compilers:
        full["PATH"] = _bare_path(tmp_path)
    done = subprocess.run([sys.executable, "-c", LOAD, str(local), *args], capture_output=True, text=True,
                          env=full, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def _build_into(store: Path, *args: str, **env: str) -> dict:
    full = {**os.environ, "PYTHONPATH": str(SRC), **env}
    done = subprocess.run([sys.executable, "-c", LOAD, str(store), *args], capture_output=True, text=True,
                          env=full, timeout=120)
    out = json.loads(done.stdout.splitlines()[-1])
    assert out.get("origin") == "built", out
    return out


def test_a_read_only_store_built_by_another_compiler_serves_a_machine_without_one(
        mount: Path, tmp_path: Path) -> None:
    """Built with clang++ by the maintainer, copied onto a read-only mount: a machine with no
    compiler loads it with zero compiles; with g++ present, its own store stays strict
    (the local store rebuilds for its compiler) while the tier is still found first."""
    need("clang++")
    built = _build_into(mount / "store", CXX="clang++")
    _read_only(mount)
    local = tmp_path / "local"
    got = _load(local, tmp_path, ABICACHE_READ_STORES=str(mount / "store"))
    assert got["origin"] == "tier" and got["value"] == 42 and got["path"] == built["path"], got
    assert not (local / "v3" / "entries" / "cc.library").exists()  # nothing copied, nothing built
    need("c++")
    with_gcc = _load(local, tmp_path, compilers=True, ABICACHE_READ_STORES=str(mount / "store"))
    assert with_gcc["origin"] == "tier", with_gcc
    no_tier = _load(local, tmp_path, compilers=True)
    assert no_tier["origin"] == "built"  # the local store: a compiler of another identity builds


def test_a_changed_byte_in_a_read_only_store_never_runs(mount: Path, tmp_path: Path) -> None:
    built = _build_into(mount / "store")
    library = Path(built["path"]) / "libadder.so"
    data = bytearray(library.read_bytes())
    data[-1] ^= 1  # the last byte: the library still loads, and runs something else
    library.chmod(0o644)
    library.write_bytes(bytes(data))
    library.chmod(0o444)
    _read_only(mount)
    got = _load(tmp_path / "local", tmp_path, ABICACHE_READ_STORES=str(mount / "store"))
    assert "error" in got and "not found" in got["error"], got  # no compiler here: nothing loaded
    assert any("refused" in s and "sha256" in s for s in got["said"]), got["said"]
    need("c++")
    rebuilt = _load(tmp_path / "local", tmp_path, compilers=True, ABICACHE_READ_STORES=str(mount / "store"))
    assert rebuilt["origin"] == "built" and rebuilt["value"] == 42


def test_an_installed_package_registers_its_store_through_an_entry_point(tmp_path: Path) -> None:
    """`pip install mylib-kernels` is all a user does: its abicache.stores entry point names the
    folder; a broken entry point of another package is named and skipped."""
    site = tmp_path / "site"
    package = site / "mylib_kernels"
    package.mkdir(parents=True)
    _build_into(package / "store")
    (package / "__init__.py").write_text("from pathlib import Path\nSTORE = Path(__file__).parent / 'store'\n")
    for dist, value in (("mylib_kernels-1.0", "mylib_kernels:STORE"), ("broken-1.0", "no_such_module:STORE")):
        info = site / f"{dist}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.split('-')[0]}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[abicache.stores]\n{dist.split('-')[0]} = {value}\n")
    got = _load(tmp_path / "local", tmp_path, PYTHONPATH=f"{SRC}{os.pathsep}{site}")
    assert got["origin"] == "tier" and got["value"] == 42, got
    assert any("no_such_module" in s and "skipped" in s for s in got["said"]), got["said"]


def test_a_tier_entry_holds_only_while_the_project_files_it_read_hold(tmp_path: Path) -> None:
    """An entry built from a project file and its header: a user whose header differs gets no
    hit from the tier (the sources' folder is what was asked for, not the maintainer's machine)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "k.h").write_text("#define K 40\n")
    source = project / "add.cpp"
    source.write_text('#include "k.h"\nextern "C" int add(int a, int b) { return a + b + K - 40; }\n')
    tier = tmp_path / "tier"
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from abicache import Cache, cc
        art = cc.build_library("adder", [Path({str(source)!r})], cache=Cache(sys.argv[1]))
        print(json.dumps({{"origin": art.origin}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    assert json.loads(subprocess.run([sys.executable, "-c", code, str(tier)], capture_output=True, text=True,
                                     env=env, timeout=120).stdout)["origin"] == "built"
    reader = {**env, "PATH": _bare_path(tmp_path), "CC": "", "CXX": "", "ABICACHE_READ_STORES": str(tier)}
    same = subprocess.run([sys.executable, "-c", code, str(tmp_path / "local")], capture_output=True, text=True,
                          env=reader, timeout=120)
    assert json.loads(same.stdout)["origin"] == "tier", same.stderr[-1500:]
    (project / "k.h").write_text("#define K 41\n")
    changed = subprocess.run([sys.executable, "-c", code, str(tmp_path / "local")], capture_output=True, text=True,
                             env=reader, timeout=120)
    assert changed.returncode != 0 and "not found" in changed.stderr, changed.stdout + changed.stderr[-1500:]


def test_a_tier_owned_by_another_user_is_not_trusted(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    tier = tmp_path / "tier"
    _build_into(tier)
    shutil.chown(tier, user="nobody")
    for folder, dirs, files in os.walk(tier):
        for name in dirs + files:
            os.lchown(os.path.join(folder, name), 65534, 65534)
    got = _load(tmp_path / "local", tmp_path, ABICACHE_READ_STORES=str(tier))
    assert "error" in got and any("skipped" in s or "refused" in s for s in got["said"]), got


def test_explain_lists_each_read_only_variant_and_why_it_does_not_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace when nothing fits: one row per shipped variant, with what it lacks here."""
    from abicache import Cache
    from abicache.cli.program import main

    built = Cache(tmp_path / "maintainer").for_target({"python.abi": "cp399"})
    built.get_or_build("t", "x", {"extra": {"n": "1"}}, lambda out: (out / "f").write_bytes(b"x"),
                       ["python.abi == cp399"])
    assert main(["bundle", "--out", str(tmp_path / "shipped"), "--root", str(tmp_path / "maintainer"), "x"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("ABICACHE_READ_STORES", str(tmp_path / "shipped"))
    assert main(["explain", "x", "--root", str(tmp_path / "user"), "--json"]) == 1  # nothing loads: a miss
    (row,) = [r["read_only"] for r in json.loads(capsys.readouterr().out)]
    assert row["store"] == str(tmp_path / "shipped") and row["verdict"].startswith("needs python.abi == cp399")


def test_a_wheels_entry_reaches_a_read_only_local_store_through_its_fallback(
        mount: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel's store keeps each file once (blobs only): its entry is copied into the local
    store at first use. Where the local store is read-only, that copy goes to the user's own
    fallback store, for lookup() as for get_or_build(), rather than failing."""
    from abicache import Cache
    from abicache.shipping import tiers
    from abicache.shipping.bundle import write_store

    maintainer = Cache(tmp_path / "maintainer")
    built = maintainer.get_or_build("t", "x", {"extra": {"n": "1"}}, lambda out: (out / "f").write_bytes(b"x"))
    write_store([(built.path, built.manifest)], tmp_path / "shipped", blobs=True)
    assert not list((tmp_path / "shipped").rglob("f"))  # the file is a blob only
    Cache(mount / "local").store.ensure(writing=True)
    read_only(mount)
    monkeypatch.setenv("ABICACHE_READ_STORES", str(tmp_path / "shipped"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    tiers.forget()
    with pytest.warns(Warning, match="misses build into"):
        found = Cache(mount / "local").lookup("t", "x", {"extra": {"n": "1"}})
    assert found is not None and found.file().read_bytes() == b"x"
    assert str(found.path).startswith(str(tmp_path / "xdg")), found.path
    again = Cache(mount / "local").get_or_build("t", "x", {"extra": {"n": "1"}},
                                                lambda out: (_ for _ in ()).throw(AssertionError("built")))
    assert again.file().read_bytes() == b"x"
