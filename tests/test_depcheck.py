"""The header check of a hit (store/deps.py, store/stamps.py): a summary of
every header's witness vouches for all of them at once, and stops vouching
the moment any one is touched, whatever the edit restores; sources are keyed
on their bytes.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from pathlib import Path

import pytest

from abicache import Cache, cc
from abicache.store import deps as depcheck
from abicache.store import manifest as mf
from abicache.store import stamps
from conftest import need

LIB = '#include "helper.h"\nextern "C" int answer() { return helper(); }\n'


@pytest.fixture(autouse=True)
def _fresh_memory() -> None:
    depcheck.forget()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    need("c++")
    root = tmp_path / "proj"
    root.mkdir()
    (root / "lib.cpp").write_text(LIB)
    (root / "helper.h").write_text("inline int helper() { return 41; }\n")
    return root


def _settle() -> None:
    time.sleep(stamps.FINE_SECONDS * 3)  # witnesses younger than this are never remembered


def _stamp(cache: Cache, art_path: Path) -> stamps.Stamp:
    return stamps.read(art_path, cache.store.trust.ok)


def test_the_summary_vouches_until_a_header_is_touched(project: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    src = [project / "lib.cpp"]
    built = cc.build_library("x", src, cache=Cache(tmp_path / "store"))
    _settle()
    first = cc.build_library("x", src, cache=Cache(tmp_path / "store"))  # checks each header, then remembers
    assert first.hit and first.path == built.path
    assert len(_stamp(Cache(tmp_path / "store"), first.path).deps_ok) == 1

    def per_file(*args: object, **kwargs: object) -> object:
        raise AssertionError("the summary should have vouched for every header")

    with monkeypatch.context() as m:
        m.setattr(depcheck, "first_changed", per_file)
        assert cc.build_library("x", src, cache=Cache(tmp_path / "store")).hit

    # Same size, and the old mtime put back: only the ctime tells. Not a hit.
    header = project / "helper.h"
    before = header.stat()
    header.write_text("inline int helper() { return 42; }\n")
    os.utime(header, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert header.stat().st_size == before.st_size
    depcheck.forget()
    lib = cc.load_library("x", src, cache=Cache(tmp_path / "store"))
    assert lib.answer() == 42


def test_a_touch_is_checked_once_then_vouched_for_again(project: Path, tmp_path: Path) -> None:
    src = [project / "lib.cpp"]
    cc.build_library("x", src, cache=Cache(tmp_path / "store"))
    _settle()
    art = cc.build_library("x", src, cache=Cache(tmp_path / "store"))
    old = _stamp(Cache(tmp_path / "store"), art.path).deps_ok
    os.utime(project / "helper.h")  # the bytes are the same: still a hit, with a new summary
    _settle()
    depcheck.forget()
    again = cc.build_library("x", src, cache=Cache(tmp_path / "store"))
    assert again.hit and again.path == art.path
    new = _stamp(Cache(tmp_path / "store"), art.path).deps_ok
    assert len(new) == 2 and new[1:] == old


def test_two_checkouts_keep_a_summary_each(project: Path, tmp_path: Path) -> None:
    import shutil

    clone = tmp_path / "clone"
    shutil.copytree(project, clone)
    cache = tmp_path / "store"
    a = cc.build_library("x", [project / "lib.cpp"], cache=Cache(cache))
    _settle()
    b = cc.build_library("x", [clone / "lib.cpp"], cache=Cache(cache))
    assert b.path == a.path  # one entry for both checkouts
    _settle()
    cc.build_library("x", [project / "lib.cpp"], cache=Cache(cache))
    cc.build_library("x", [clone / "lib.cpp"], cache=Cache(cache))
    assert len(_stamp(Cache(cache), a.path).deps_ok) == 2


def test_a_damaged_stamp_only_costs_a_check(project: Path, tmp_path: Path) -> None:
    src = [project / "lib.cpp"]
    cc.build_library("x", src, cache=Cache(tmp_path / "store"))
    _settle()
    art = cc.build_library("x", src, cache=Cache(tmp_path / "store"))
    (named,) = [p for p in art.path.iterdir() if p.name.startswith(stamps.NAME_PREFIX)]  # the stamp, a name
    bad = art.path / f"{stamps.NAME_PREFIX}zz.9-x-1.{'0' * 31}"  # an index past the files, a bad number
    named.rename(bad)
    for name in (stamps.FILENAME, stamps.DEPS_FILENAME):
        path = art.path / name
        if path.exists():
            path.chmod(0o644)
        path.write_text('{"verified": "x", "files": 3, "deps_ok": [1, null]}')
        path.chmod(0o444)
    depcheck.forget()
    assert cc.load_library("x", src, cache=Cache(tmp_path / "store")).answer() == 41
    assert not bad.exists() and not (art.path / stamps.FILENAME).exists()  # the check's new stamp replaced both
    assert _stamp(Cache(tmp_path / "store"), art.path).files


def test_sources_are_keyed_on_their_bytes(tmp_path: Path) -> None:
    """A Latin-1 comment and CRLF line ends compile as gcc takes them; two
    sources that differ in one such byte are two entries."""
    need("c++")
    cache = Cache(tmp_path / "store")
    paths = []
    for i, byte in enumerate((b"\xe9", b"\xe8")):
        path = tmp_path / f"v{i}" / "lib.cpp"
        path.parent.mkdir()
        path.write_bytes(b"// caf" + byte + b"\r\nextern \"C\" int answer() { return 7; }\r\n")
        paths.append(path)
    first = cc.build_library("latin", [paths[0]], cache=cache)
    second = cc.build_library("latin", [paths[1]], cache=cache)
    assert first.key != second.key
    assert cc.load_library("latin", [paths[0]], cache=cache).answer() == 7


def test_manifest_dependencies_are_read_in_canonical_order(tmp_path: Path) -> None:
    sha = "0" * 64
    doc = {"schema": mf.SCHEMA, "key": "a" * 64, "kind": "cc.library", "name": "x",
           "files": {"libx.so": {"sha256": sha, "size": 1, "mode": 0o555}},
           "requirements": [], "abicache_version": "0", "created": 0, "build_seconds": 0,
           "deps": [["src", "b.h", sha], ["src", "a.h", sha], ["src", "b.h", sha]]}
    doc["variant"] = mf.variant_id(mf.Requirements(), tuple(mf.Dependency(*d) for d in doc["deps"]))
    for local in (True, False):
        got = mf.parse(json.dumps(doc).encode(), local=local)
        assert [d.path for d in got.deps] == ["a.h", "b.h"]
    doc["deps"][0] = ["src", "b.h", 5]
    with pytest.raises(mf.ManifestError, match="dependency"):
        mf.parse(json.dumps(doc).encode(), local=True)


@pytest.mark.parametrize("asked", ["FIONREAD first", "the read alone"])
def test_abicaches_inotify_reports_what_inotify_simple_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              asked: str) -> None:
    """store/inotify.py replaced inotify_simple (whose import cost the second call of a process
    8-16 ms): the same folder watched by both, the same operations, the same events; whether
    it asks how many bytes are pending first (where Linux's ioctl numbers are known) or not."""
    inotify_simple = pytest.importorskip("inotify_simple")
    if sys.platform != "linux":
        pytest.skip("inotify is Linux's")
    from abicache.store import inotify

    if asked == "the read alone":
        monkeypatch.setattr(inotify, "_FIONREAD", None)
    elif inotify._FIONREAD is None:
        pytest.skip(f"no FIONREAD known for {os.uname().machine}")

    mask = (inotify.IN_MODIFY | inotify.IN_ATTRIB | inotify.IN_CLOSE_WRITE | inotify.IN_MOVED_FROM
            | inotify.IN_MOVED_TO | inotify.IN_CREATE | inotify.IN_DELETE | inotify.IN_DELETE_SELF
            | inotify.IN_MOVE_SELF)
    folder = tmp_path / "watched"
    folder.mkdir()
    ours, theirs = inotify.Inotify(), inotify_simple.INotify()
    try:
        our_wd = ours.add_watch(str(folder), mask)
        their_wd = theirs.add_watch(str(folder), mask)
        assert ours.read() == [] and theirs.read(timeout=0) == []
        (folder / "a.h").write_text("1")
        os.chmod(folder / "a.h", 0o600)
        os.rename(folder / "a.h", folder / "b.h")
        (folder / "b.h").unlink()
        (folder / "sub").mkdir()
        os.rmdir(folder / "sub")
        os.rmdir(folder)  # the watch itself goes: DELETE_SELF, then IGNORED
        got = ours.read()
        want = [(our_wd, e.mask) for e in theirs.read(timeout=0) if e.wd == their_wd]
        assert got == want and len(got) >= 8, (got, want)
        assert got[-1][1] & inotify.IN_IGNORED
        assert ours.read() == []  # all taken
        with pytest.raises(OSError) as missing:
            ours.add_watch(str(tmp_path / "nowhere"), mask)
        assert missing.value.errno == errno.ENOENT
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("count", [2, 40])
@pytest.mark.parametrize("how", ["in place", "through a hard link", "through a symbolic link", "replaced"])
def test_the_watch_sees_each_kind_of_edit_with_few_or_many_files_in_a_folder(tmp_path: Path, count: int,
                                                                             how: str) -> None:
    """Files are watched one by one and their folder for its names only (watching a folder
    for its files' writes makes the kernel mark every name it has cached there: 35 ms for a
    second call whose source sat in a /tmp of 2,300 names); a folder holding more than
    watch.MANY checked files is watched as a whole. Each way of changing a file is seen."""
    if sys.platform != "linux":
        pytest.skip("inotify is Linux's")
    from abicache.store import watch

    folder, other = tmp_path / "src", tmp_path / "elsewhere"
    folder.mkdir()
    other.mkdir()
    files = [folder / f"h{i}.h" for i in range(count)]
    for f in files:
        f.write_text("1")
    target = files[0]
    os.link(target, other / "alias.h")
    os.symlink(target, other / "link.h")
    w = watch.Watch([str(f) for f in files])
    assert w.marks is not None and w.unchanged()
    events = watch._shared()
    assert events is not None
    armed = dict(events.armed)
    if count <= watch.MANY:
        assert armed[str(folder)] & events.all_mask == events.names_mask and str(target) in armed
    else:
        assert armed[str(folder)] & events.all_mask == events.all_mask
    (other / "unrelated.h").write_text("x")
    assert w.unchanged()
    if how == "in place":
        with open(target, "r+") as fh:
            fh.write("2")
    elif how == "through a hard link":
        (other / "alias.h").write_text("2")
    elif how == "through a symbolic link":
        (other / "link.h").write_text("2")
    else:
        (folder / "new.h").write_text("2")
        os.rename(folder / "new.h", target)
    assert not w.unchanged()


UNWRITABLE = """
import atexit, json, os, shutil, sys, tempfile, traceback
from abicache.store import inotify, watch  # imported before the drop: nobody may not read this Python's files
base = tempfile.mkdtemp(prefix="abicache-watch-")
os.chmod(base, 0o755)  # a user dropped to below can reach it
system, mine = os.path.join(base, "system"), os.path.join(base, "mine")
files = {}
for folder in (system, mine):
    os.mkdir(folder)
    files[folder] = [os.path.join(folder, f"h{i}.h") for i in range(3)]
    for f in files[folder]:
        open(f, "w").write("1")
os.chmod(system, 0o555)
os.chmod(mine, 0o777)
told, tell = os.pipe()
edited, edit = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(told)
    os.close(edit)
    try:
        if os.geteuid() == 0:
            os.setgid(65534)
            os.setuid(65534)  # nobody: root may write anywhere
        plan = dict(watch.plan(files[system] + files[mine]))
        watched = watch.Watch(files[system])
        os.write(tell, json.dumps({"plan": plan, "armed": watched.marks is not None,
                                   "unchanged": watched.unchanged()}).encode())
        os.read(edited, 1)
        os.write(tell, b"seen" if not watched.unchanged() else b"missed")
    except BaseException:
        os.write(tell, traceback.format_exc().encode())
    os._exit(0)
os.close(tell)
os.close(edited)
try:
    said = os.read(told, 1 << 20)
    first = json.loads(said) if said.startswith(b"{") else sys.exit(said.decode())
    with open(files[system][1], "a") as fh:
        fh.write("2")
    os.write(edit, b"x")
    after = os.read(told, 1 << 16).decode()
finally:
    os.waitpid(pid, 0)
    os.chmod(system, 0o755)
    shutil.rmtree(base)
print(json.dumps({"system": first["plan"].get(system), "system_files": [first["plan"].get(f) for f in files[system]],
                  "mine": first["plan"].get(mine), "mine_files": [first["plan"].get(f) for f in files[mine]],
                  "masks": watch.masks(), "armed": first["armed"], "unchanged": first["unchanged"], "after": after}))
"""


def test_a_folder_this_process_may_not_write_is_watched_as_a_whole(tmp_path: Path) -> None:
    """The system's folders (the headers a build read, the compiler's) change when someone
    upgrades them, not while the user works beside them: one watch for all their files (a torch
    extension's record: 51 watches, not 209). A folder the user may write keeps a watch a file.
    An edit in the folder watched whole is seen. As root, the trial drops to nobody (root may
    write anywhere); it runs in a process of its own (a pytest worker has threads: no fork)."""
    if sys.platform != "linux":
        pytest.skip("inotify is Linux's")
    from conftest import run_py

    out = run_py(UNWRITABLE)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    file_mask, names_mask, all_mask = got["masks"]
    assert got["system"] == all_mask and got["system_files"] == [None] * 3, got
    assert got["mine"] == names_mask and got["mine_files"] == [file_mask] * 3, got
    assert got["armed"] and got["unchanged"] and got["after"] == "seen", got


FORKED = """
import os, sys
from abicache.store import watch
f = os.path.join(sys.argv[1], "h.h")
open(f, "w").write("1")
w = watch.Watch([f])
assert w.unchanged()
r, wr = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(wr)
    os.read(r, 1)  # the parent has edited the file
    child = watch.Watch([f])  # the child watches too (its own instance), and asks the inherited one
    print("child:", "seen" if not w.unchanged() else "missed", flush=True)
    os._exit(0)
os.close(r)
with open(f, "a") as fh:
    fh.write("2")
os.write(wr, b"x")
os.waitpid(pid, 0)
print("parent:", "seen" if not w.unchanged() else "missed", flush=True)
"""


def test_a_forked_child_takes_none_of_its_parents_events(tmp_path: Path) -> None:
    """A child forked after the parent armed its watch (a DataLoader's workers) shared the
    parent's inotify instance: its reads took the event of an edit, and the parent's memo
    then served the old build. The trial runs in a process of its own (a pytest worker
    has threads: it does not fork)."""
    if sys.platform != "linux":
        pytest.skip("inotify is Linux's")
    from conftest import run_py

    out = run_py(FORKED.replace("sys.argv[1]", repr(str(tmp_path))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["child: seen", "parent: seen"]
