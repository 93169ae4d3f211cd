"""abicache check: entries built again from scratch and compared — a planted
stale entry is found and its missed input named; a __TIME__ build is called
not reproducible; a sound entry is the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from abicache import Cache, cc
from abicache.store import manifest as mf
import hostile
from conftest import SRC, need, writer


def check(root: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "abicache", "check", "--root", str(root), "--json", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})})
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    need("c++")
    p = tmp_path / "proj"
    (p / "inc").mkdir(parents=True)
    (p / "inc" / "v.h").write_text("#define VALUE 1\n")
    (p / "x.cpp").write_text('#include "v.h"\nextern "C" int f() { return VALUE; }\n')
    monkeypatch.chdir(p)
    return p


def _build(cache: Cache) -> object:
    return cc.build_library("x", [Path("x.cpp")], cflags=["-Iinc"], cache=cache)


def _forget(art: object, path: str) -> None:
    """Plant a stale entry: its record of one input edited away (variant id kept consistent)."""
    vdir = art.path  # type: ignore[attr-defined]
    doc = hostile.manifest_doc(vdir)
    doc["deps"] = [d for d in doc["deps"] if d[1] != path]
    assert len(doc["deps"]) < len(art.manifest.deps)  # type: ignore[attr-defined]
    manifest = mf.parse(json.dumps(doc).encode())
    doc["variant"] = mf.variant_of(manifest)
    hostile.rewrite_manifest(vdir, json.dumps(doc).encode())
    for stamp in vdir.glob(".abicache-*"):
        stamp.unlink()
    os.rename(vdir, vdir.parent / f"{doc['key']}.{doc['variant']}")


def test_a_sound_entry_is_the_same(project: Path, tmp_path: Path) -> None:
    art = _build(Cache(tmp_path / "store"))
    code, report = check(tmp_path / "store")
    assert code == 0
    assert [(v["key"], v["verdict"]) for v in report["checked"]] == [(art.key, "same")]


def test_a_planted_stale_entry_is_found_and_its_input_named(project: Path, tmp_path: Path) -> None:
    cache = Cache(tmp_path / "store")
    art = _build(cache)
    _forget(art, "v.h")
    (project / "inc" / "v.h").write_text("#define VALUE 2\n")
    stale = _build(Cache(tmp_path / "store"))
    assert stale.hit  # the planted entry keeps hitting: what check is for
    code, report = check(tmp_path / "store", art.key[:12])
    assert code == 1 and report["stale"] == 1
    [verdict] = report["checked"]
    assert verdict["verdict"] == "stale key" and "inc/v.h" in verdict["detail"]


def test_a_build_that_stamps_the_time_is_not_reproducible(project: Path, tmp_path: Path) -> None:
    (project / "x.cpp").write_text('extern "C" const char *f() { return __TIME__; }\n')
    art = _build(Cache(tmp_path / "store"))
    time.sleep(1.1)  # __TIME__ has whole seconds
    code, report = check(tmp_path / "store")
    assert code == 0
    assert [(v["key"], v["verdict"]) for v in report["checked"]] == [(art.key, "not reproducible")]


def test_an_entry_a_lookup_would_rebuild_is_skipped(project: Path, tmp_path: Path) -> None:
    _build(Cache(tmp_path / "store"))
    (project / "inc" / "v.h").write_text("#define VALUE 3\n")
    _, report = check(tmp_path / "store")
    [verdict] = report["checked"]
    assert verdict["verdict"] == "skipped" and "v.h" in verdict["detail"]


def test_an_entry_without_a_recipe_is_skipped_when_named(tmp_path: Path) -> None:
    art = Cache(tmp_path / "store").get_or_build("blob", "b", {"sources": {"b": "x"}}, writer({"b.txt": "x"}))
    _, everything = check(tmp_path / "store")
    assert everything["checked"] == []  # a sample takes entries with a recipe only
    _, named = check(tmp_path / "store", art.key)
    assert [v["verdict"] for v in named["checked"]] == ["skipped"]


def test_an_unknown_key_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "abicache", "check", "--root", str(tmp_path / "s"), "ffff"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 2 and "no entry with a key starting ffff" in done.stderr


def test_abicache_check_env_checks_hits_in_the_background(project: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cache = Cache(tmp_path / "store")
    art = _build(cache)
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    monkeypatch.setenv("ABICACHE_CHECK", "1")  # every hit
    assert _build(cache).hit
    log = tmp_path / "store" / "v3" / "log" / "check.jsonl"
    deadline = time.monotonic() + 120
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.2)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(v["key"], v["verdict"]) for v in lines] == [(art.key, "same")]


def test_the_background_check_imports_this_abicache_and_nothing_beside_it() -> None:
    """The child's sys.path gets the folder that holds the package: the package's own folder
    there would make abicache/torch.py the child's `torch` (and no `abicache` to import at all)."""
    import abicache
    from abicache.frontends import check_spawn

    root = check_spawn.import_root()
    assert (root / "abicache" / "__init__.py").resolve() == Path(abicache.__file__).resolve()
    assert not (root / "torch.py").exists()
