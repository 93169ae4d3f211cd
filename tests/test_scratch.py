"""A build's scratch folder (engine/scratch.py): held while its build runs, removed when it
ends, and swept by a later build where its process was killed first. The SIGKILLed build
itself: tests/test_build.py test_sigkill_during_a_parallel_build_leaves_nothing_partial."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from abicache.engine import scratch
from abicache.errors import BuildError

HOLD = """
import fcntl, os, sys, time
fd = os.open(os.path.join(sys.argv[1], ".alive"), os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def _aged(path: Path, seconds: float) -> Path:
    os.utime(path, (time.time() - seconds,) * 2, follow_symlinks=False)
    return path


def _left(where: Path, name: str, age: float = 2 * scratch.GRACE, alive: bool = True) -> Path:
    """A scratch folder as a build of this user leaves it, made age seconds ago."""
    folder = where / name
    folder.mkdir()
    (folder / "unit.o").write_bytes(b"\x7fELF")
    if alive:
        (folder / scratch.ALIVE).touch()
    return _aged(folder, age)


def test_a_folder_whose_process_died_is_swept_and_the_rest_is_not(tmp_path: Path) -> None:
    dead = _left(tmp_path, f"{scratch.PREFIX}dead0000")
    unlocked = _left(tmp_path, f"{scratch.PREFIX}nolock00", alive=False)  # its build could not take a lock
    running = _left(tmp_path, f"{scratch.PREFIX}running0")
    fresh = _left(tmp_path, f"{scratch.PREFIX}fresh000", age=1)  # its lock not taken yet, maybe
    old = _left(tmp_path, "abicache-launch-old00000", age=8 * 86400, alive=False)  # an earlier version's
    recent = _left(tmp_path, "abicache-build-new00000", age=86400, alive=False)  # could still be building
    other = _left(tmp_path, "unrelated-folder")
    target = _left(tmp_path, "linked-to")
    (tmp_path / f"{scratch.PREFIX}link0000").symlink_to(target)
    (tmp_path / f"{scratch.PREFIX}file0000").write_text("not a folder")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(running)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        _aged(running, 2 * scratch.GRACE)
        removed = scratch.sweep(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    assert sorted(removed) == sorted(map(str, (dead, old)))
    assert not dead.exists() and not old.exists()
    for kept in (running, unlocked, fresh, recent, other, target):
        assert (kept / "unit.o").exists(), kept
    assert (tmp_path / f"{scratch.PREFIX}link0000").is_symlink()
    assert (tmp_path / f"{scratch.PREFIX}file0000").read_text() == "not a folder"
    # once its process ended, the running build's folder is the next sweep's
    assert scratch.sweep(str(tmp_path)) == [str(running)]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_another_users_scratch_folder_is_never_swept(tmp_path: Path) -> None:
    theirs = _left(tmp_path, f"{scratch.PREFIX}theirs00", alive=False)
    os.chown(theirs, 65534, 65534)
    assert scratch.sweep(str(tmp_path)) == []
    assert (theirs / "unit.o").exists()


def _held(folder: str) -> bool:
    probe = ("import fcntl, os, sys\n"
             "fd = os.open(os.path.join(sys.argv[1], '.alive'), os.O_RDONLY)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError:\n    sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", probe, folder], timeout=60).returncode == 3


def test_a_scratch_folder_is_held_while_its_build_runs_and_removed_when_it_ends(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # tempfile reads TMPDIR again
    with scratch.scratch() as folder:
        assert Path(folder).parent == tmp_path and Path(folder).name.startswith(scratch.PREFIX)
        assert _held(folder)
        assert scratch.sweep(str(tmp_path)) == []
        _aged(Path(folder), 2 * scratch.GRACE)
        assert scratch.sweep(str(tmp_path)) == []  # old, but its build runs: held
    deadline = time.monotonic() + 30
    while os.path.exists(folder) and time.monotonic() < deadline:  # removed in the background
        time.sleep(0.01)
    assert not os.path.exists(folder)
    with pytest.raises(BuildError):
        with scratch.scratch() as failed:
            raise BuildError("the compiler failed", output="")
    assert not os.path.exists(failed)  # a failed build's at once


def test_a_user_sweeps_at_most_once_in_a_while(tmp_path: Path) -> None:
    """The compiler launcher under `make -j` is a process a compile: each would list the
    temporary folder. A marker file of the user's says when the last sweep began."""
    assert scratch._due(str(tmp_path))  # none yet
    marker = tmp_path / f"{scratch.MARKER}{os.geteuid()}"
    assert marker.is_file() and not scratch._due(str(tmp_path))
    _aged(marker, scratch.EVERY + 1)
    assert scratch._due(str(tmp_path)) and not scratch._due(str(tmp_path))
    marker.unlink()
    marker.symlink_to(tmp_path / "elsewhere")  # not a marker: a sweep is due, nothing written through it
    assert scratch._due(str(tmp_path)) and not (tmp_path / "elsewhere").exists()
    if os.geteuid() == 0:  # another user's file by that name is no marker either
        marker.unlink()
        marker.write_text("")
        os.chown(marker, 65534, 65534)
        assert scratch._due(str(tmp_path)) and scratch._due(str(tmp_path))
