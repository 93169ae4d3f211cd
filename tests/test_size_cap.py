"""The size cap (ABICACHE_MAX_SIZE, the config file's max_size) holds when a short
script exits: the process that built an entry evicts down to the cap before the call
returns, one process at a time, never the entry it is about to load; `gc` takes the
configured cap, its dry run says what the real run does, and `stats` shows the cap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from abicache import Cache
from abicache.cli import main as cli
from abicache.store import gc

from conftest import writer

SRC = Path(__file__).resolve().parents[1] / "src"

# each library a distinct source (a distinct key), about 16 KiB on disk
BUILDER = textwrap.dedent("""
    import sys
    import abicache.cc as cc
    first, count = int(sys.argv[1]), int(sys.argv[2])
    for n in range(first, first + count):
        lib = cc.load_library(f"capped{n}", [f"int value(void) {{ return {n}; }}\\n"], lang="c")
        assert lib.value() == n
""")

# loads a few libraries over and over until told to stop: an evicted one is built again
LOADER = textwrap.dedent("""
    import os, sys, time
    import abicache.cc as cc
    stop, done = sys.argv[1], 0
    while not os.path.exists(stop):
        for n in (100, 101):
            lib = cc.load_library(f"loaded{n}", [f"int value(void) {{ return {n}; }}\\n"], lang="c")
            assert lib.value() == n
            cc._loaded.clear()  # every round a lookup in the store, as a new process would make
        done += 1
    print(done)
""")


def _env(root: Path, cap: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABICACHE_")}
    env.update(ABICACHE_DIR=str(root), ABICACHE_MAX_SIZE=cap, ABICACHE_PROGRESS="0",
               PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]))
    return env


def _size(root: Path) -> int:
    return gc.disk_usage(Cache(root, remote=False).store)[0]


def _one_library(tmp_path: Path) -> int:
    root = tmp_path / "probe"
    subprocess.run([sys.executable, "-c", BUILDER, "0", "1"], env=_env(root, ""), check=True, timeout=120)
    return _size(root)


def test_a_script_that_builds_past_the_cap_and_exits_leaves_the_store_under_it(tmp_path: Path) -> None:
    """Ten libraries over a cap of three, built by a script that exits at once, with two
    loaders running beside it: the store ends at or under the cap, no loader fails, and
    trash/ is empty. Before: eviction ran in a thread that died with the process, at most
    once a minute, and spared every entry used in the last minute (none left)."""
    one = _one_library(tmp_path)
    cap = 3 * one + one // 2
    root = tmp_path / "s"
    env = _env(root, str(cap))
    stop = tmp_path / "stop"
    loaders = [subprocess.Popen([sys.executable, "-c", LOADER, str(stop)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        built = subprocess.run([sys.executable, "-c", BUILDER, "0", "10"], env=env, capture_output=True,
                               text=True, timeout=300)
    finally:
        stop.touch()
        outs = [p.communicate(timeout=300) for p in loaders]
    assert built.returncode == 0, built.stderr
    for p, (out, err) in zip(loaders, outs):
        assert p.returncode == 0 and int(out) >= 1, err
    store = Cache(root, remote=False).store
    assert _size(root) <= cap, (_size(root), cap)
    assert list(store.layout.trash.iterdir()) == [] if store.layout.trash.exists() else True
    # the script's last library is kept (it was about to be loaded), the first ones went
    names = {p.name.partition(".")[0] for p in store.iter_variant_dirs()}
    assert len(names) >= 1


def test_the_cap_spares_only_the_entry_just_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries used a moment ago are evicted like any other (least recently used first):
    the cap is a cap. Only the entry the call is about to hand back stays, even alone
    over the cap."""
    monkeypatch.setenv("ABICACHE_MAX_SIZE", "50K")
    cache = Cache(tmp_path / "s", remote=False)
    arts = [cache.get_or_build("t", f"k{n}", {"extra": {"n": n}}, writer({"f": os.urandom(20_000)}))
            for n in range(5)]
    assert gc.disk_usage(cache.store)[0] <= 50 * 1024
    assert arts[-1].path.exists() and not arts[0].path.exists()
    big = cache.get_or_build("t", "big", {"extra": {"n": "big"}}, writer({"f": os.urandom(80_000)}))
    assert big.path.exists() and big.file().stat().st_size == 80_000
    assert [a.path.exists() for a in arts] == [False] * 5


def test_gc_takes_the_configured_cap_and_its_dry_run_says_what_the_real_run_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    cache = Cache(root, remote=False)
    shared = os.urandom(10_000)  # one blob linked by every entry: freed only with the last
    for n in range(8):
        cache.get_or_build("t", f"k{n}", {"extra": {"n": n}}, writer({"f": os.urandom(10_000), "s": shared}))
        time.sleep(0.01)
    monkeypatch.setenv("ABICACHE_MAX_SIZE", "45K")
    assert cli(["gc", "--root", str(root), "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["max_size"] == 45 * 1024 and dry["dry_run"]
    assert cli(["gc", "--root", str(root), "--json"]) == 0
    real = json.loads(capsys.readouterr().out)
    assert real["entries_removed"] == dry["entries_removed"] == 5, (dry, real)
    assert real["bytes_after"] == dry["bytes_after"] == _size(root) <= 45 * 1024
    assert real["removed"] == dry["removed"]
    assert cli(["gc", "--root", str(root), "--dry-run"]) == 0
    assert "would remove 0 of 3 entries" in capsys.readouterr().out


def test_stats_shows_the_cap_and_how_full_the_store_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    cache = Cache(root, remote=False)
    cache.get_or_build("t", "k", {"extra": {}}, writer({"f": os.urandom(25_000)}))
    monkeypatch.setenv("ABICACHE_MAX_SIZE", "100K")
    assert cli(["stats", "--root", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["max_size"] == 100 * 1024 and doc["max_size_from"] == "environment"
    assert doc["used_fraction"] == pytest.approx(doc["stored_bytes"] / (100 * 1024))
    assert cli(["stats", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{doc['used_fraction'] * 100:.0f}% of the cap, 100.0 KiB" in out, out
    monkeypatch.delenv("ABICACHE_MAX_SIZE")
    assert cli(["stats", "--root", str(root)]) == 0
    assert "no size cap" in capsys.readouterr().out


def test_stats_count_hits_by_tier_uncacheable_builds_by_reason_and_errors_by_kind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """What `ccache -s` shows: hits by where they came from, builds that could not be cached
    and why, failures by kind."""
    import warnings

    from abicache import cc
    from abicache.errors import AbicacheWarning, BuildError

    shipped = tmp_path / "shipped"
    Cache(shipped).get_or_build("t", "k", {}, writer({"f": b"x"}))
    monkeypatch.setenv("ABICACHE_READ_STORES", str(shipped))
    root = tmp_path / "s"
    cache = Cache(root)
    assert cache.get_or_build("t", "k", {}, writer({"f": b"x"})).origin == "tier"
    monkeypatch.delenv("ABICACHE_READ_STORES")
    wrapper = tmp_path / "dropping-cc"  # runs the compiler without the observer's preload
    wrapper.write_text("#!/bin/sh\nunset LD_PRELOAD\nexec cc \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AbicacheWarning)
        assert cc.load_library("hidden", ["int f(void) { return 4; }\n"], lang="c", cache=cache).f() == 4
    monkeypatch.delenv("CC")
    with pytest.raises(BuildError):
        cc.build_library("broken", ["int f(void) { return 1 }\n"], lang="c", cache=cache)
    monkeypatch.setenv("ABICACHE_BUILD", "never")
    with pytest.raises(BuildError):
        Cache(root).get_or_build("t", "absent", {}, writer({"f": b"y"}))
    monkeypatch.delenv("ABICACHE_BUILD")
    assert cli(["stats", "--root", str(root), "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert (counts["hits_read_only"], counts["hits_local"], counts["uncacheable"]) == (1, 0, 1), counts
    assert counts["uncacheable_by_reason"] == {"unobserved program": 1}, counts
    assert counts["errors_by_kind"] == {"build failed": 1, "build not allowed": 1}, counts
    assert cli(["stats", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "uncacheable builds: unobserved program 1" in out and "errors: build failed 1, build not allowed 1" in out


def test_gc_all_clears_the_store_and_keeps_the_statistics(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    cache = Cache(root)
    for n in range(3):
        cache.get_or_build("t", f"k{n}", {"extra": {"n": n}}, writer({"f": os.urandom(1000)}))
    assert cli(["gc", "--all", "--dry-run", "--root", str(root)]) == 0
    assert "would remove 3 of 3 entries" in capsys.readouterr().out
    assert cli(["gc", "--all", "--root", str(root)]) == 0
    assert "removed 3 of 3 entries" in capsys.readouterr().out
    assert list(cache.store.iter_variant_dirs()) == [] and _size(root) == 0
    assert cli(["stats", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["builds"] == 3
    assert cli(["gc", "--all", "--max-size", "1G", "--root", str(root)]) == 2
    assert "not both" in capsys.readouterr().err
