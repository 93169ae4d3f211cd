"""Progress in a log (stderr not a terminal, ABICACHE_PROGRESS unset): long work
is reported, short work is silent; a terminal or ABICACHE_PROGRESS=1 sees all."""

from __future__ import annotations

import time

import pytest

from abicache.console import progress
from abicache.engine import pool


@pytest.fixture
def log_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ABICACHE_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "LONG_SECONDS", 0.2)


def test_in_a_log_only_long_steps_are_reported(log_mode: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert progress.mode() == "long"  # pytest's captured stderr is not a terminal
    with progress.step("building quick"):
        pass
    assert capsys.readouterr().err == ""
    with progress.step("building slow"):
        time.sleep(0.5)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("abicache: building slow ... (") and lines[0].endswith("s so far)")
    assert lines[1].startswith("abicache: building slow: done in 0.")
    with pytest.raises(RuntimeError):
        with progress.step("building broken"):
            time.sleep(0.4)
            raise RuntimeError("compiler said no")
    assert "building broken: failed after" in capsys.readouterr().err


def test_a_long_parallel_build_reports_in_a_log_and_a_short_one_does_not(
        log_mode: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_JOBS", "2")
    pool.run(lambda n: n, [1, 2, 3], str, "quick")
    assert capsys.readouterr().err == ""
    pool.run(lambda n: time.sleep(0.15), [1, 2, 3, 4], str, "library slow")
    said = capsys.readouterr().err
    assert "compiling library slow: 4/4 units" in said and said.count("\n") <= 2


def test_forced_off_is_silent_and_forced_on_says_everything(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress, "LONG_SECONDS", 0.1)
    monkeypatch.setenv("ABICACHE_PROGRESS", "0")
    with progress.step("building"):
        time.sleep(0.3)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("ABICACHE_PROGRESS", "1")
    with progress.step("building"):
        pass
    assert capsys.readouterr().err.count("abicache: building") == 2
