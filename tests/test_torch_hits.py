"""A torch extension's hit record (hits/hits.py torch_call) and the native check of a large
record (hits/native.py, hits/witness.c): a fresh process after `import torch` is served
without the plans, the store or the engine; a record names the torch it was found with; the
native check says what record.py's Python check says, witness by witness."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from abicache import Cache, cc, hits
from abicache.hits import native, record, writer
from conftest import need, run_py
from shared_builds import ADD, ADD_EXT, torch_extension_store

#: a fresh process's call after `import torch`: served by its record or not, what it imported
SERVED = """
import json, sys
import torch
before = set(sys.modules)
import abicache.torch as at
from abicache import Cache, cc, hits
mod = at.load_inline({name!r}, [{code!r}], functions=["add"], cache=Cache({root!r}))
held = next(iter(cc._loaded.values()))[0]
heavy = ("abicache.frontends.torch_plans", "abicache.frontends.cc_plans", "abicache.core.getting",
         "abicache.store.local", "abicache.engine.tree", "abicache.env.probes")
print(json.dumps({{"served": type(held).__name__ == "Served", "value": mod.add(2, 3),
                  "imported": [m for m in heavy if m in sys.modules and m not in before]}}))
"""


def _fresh(root: Path) -> dict[str, object]:
    out = run_py(SERVED.format(name=ADD_EXT, code=ADD, root=str(root)))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_the_facts_a_record_names_are_those_the_lookup_probes() -> None:
    """The record's call holds the live torch's facts (hits.torch_facts); the full lookup reads
    env/probes.py's: they must be the same strings, or no record would ever be written."""
    pytest.importorskip("torch")
    from abicache.env import probes
    from abicache import hits

    live = hits.torch_facts()
    assert live is not None
    probed = probes.torch()
    assert live == {name: probed[name] for name in hits.TORCH_NAMED}


def test_a_fresh_process_after_import_torch_is_served_without_the_plans(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """The first process looks the extension up in full and records it; a later one, made the
    same way, is served by the record: the module is the store's, and no plan, store or
    engine module is imported (issue 49: 18.7 ms of imports before)."""
    root = torch_extension_store(tmp_path_factory, tmp_path / "store")
    first = _fresh(root)
    assert first["value"] == 5 and not first["served"]
    for _ in range(5):
        time.sleep(0.05)
        later = _fresh(root)
        if later["served"]:
            break
    assert later == {"served": True, "value": 5, "imported": []}


def test_a_record_is_not_written_where_the_lookup_found_another_torch(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """A record names the torch facts of the call; where the lookup's facts differ (a torch
    imported after the lookup read version.py, say), none is written: the record would stand
    for a lookup that did not happen."""
    pytest.importorskip("torch")
    import abicache.torch as at
    from abicache import hits

    root = torch_extension_store(tmp_path_factory, tmp_path / "store")
    cache = Cache(root)
    art = at.build_inline(ADD_EXT, [ADD], functions=["add"], cache=cache)
    named = hits.torch_facts()
    assert named is not None
    tools = ["compiler.cxx", "torch.build"]
    assert writer.refusal(cache, art, tools, False, named) is None
    other = {**named, "torch.build": named["torch.build"] + "-other"}
    assert "found otherwise" in (writer.refusal(cache, art, tools, False, other) or "")
    assert "torch.build" in (writer.refusal(cache, art, tools, False) or "")  # no torch named: none


def test_a_call_names_its_torch_and_refuses_what_a_record_cannot_stand_for() -> None:
    pytest.importorskip("torch")
    import torch

    from abicache import hits

    args = {"functions": {"add": "adds"}, "verbose": False, "build_directory": None, "stable": False, "cache": None}
    made = hits.torch_call("torch.inline", "ext", ["int x;"], args)
    assert made is not None
    call, named = made
    assert named["torch.version"].encode() in call and b"cache" not in call
    assert hits.torch_call("torch.inline", "ext", ["int x;"], {**args, "build_directory": "/tmp/x"}) is None
    assert hits.torch_call("torch.inline", "ext", ["int x;"], {**args, "verbose": True}) is None
    assert hits.torch_call("torch.inline", "ext", ["int x;"], {**args, "functions": object()}) is None
    version = torch.version.git_version
    try:
        torch.version.git_version = "another"
        other = hits.torch_call("torch.inline", "ext", ["int x;"], args)
        assert other is not None and other[0] != call  # another torch: another record
    finally:
        torch.version.git_version = version


# -- the native check -------------------------------------------------------------------------

def test_a_record_too_small_for_the_native_check_is_told_so_by_the_same_number() -> None:
    assert hits._WORTH == native.WORTH


def _helper(tools: Path) -> native.Native:
    need("cc")
    path = native.build(str(tools), "cc")
    assert path is not None
    found = native.holder(path)
    assert found is not None
    return found


def _witness(kind: str, path: Path) -> tuple[str, str, tuple[int, int, int, int]]:
    if kind in "am":
        return kind, str(path), (0, 0, 0, 0)
    st = os.lstat(path) if kind in "ltfn" else os.stat(path)
    numbers = (st.st_ino, st.st_mode, st.st_uid, st.st_gid) if kind == "t" else \
        (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return kind, str(path), numbers


def _both(found: native.Native, witnesses: list[tuple[str, str, tuple[int, int, int, int]]]) -> tuple[bool, bool]:
    """(Python's verdict, the native one) on the same witnesses."""
    data = record.encode(time.time() + 100, "/", "/f", "/e", [], 1.0, 1.0, 0, witnesses)
    numbers = b"".join(record._WITNESS.pack(*w) for _, _, w in witnesses)
    paths = b"".join(os.fsencode(p) + b"\0" for _, p, _ in witnesses)
    assert data  # the record's own encoding takes them as they are
    return record._hold(witnesses), found.hold("".join(k for k, _, _ in witnesses).encode(), paths, numbers)


CHANGES = ["none", "edited", "removed", "touched", "a missing path created", "a folder's name added",
           "the trusted folder's mode", "a link retargeted", "written through a hard link",
           "a file moved away and a link to it in its place", "a link replaced by its target", "a file's link edited"]


@pytest.mark.parametrize("change", CHANGES)
def test_the_native_check_says_what_python_says(tmp_path: Path, change: str) -> None:
    found = _helper(tmp_path / "tools")
    tree = tmp_path / "tree é #$"
    tree.mkdir()
    for name, text in (("a.h", "1"), ("b.h", "2"), ("c.h", "3"), ("d.h", "4"), ("e.h", "5")):
        (tree / name).write_text(text)
    os.link(tree / "c.h", tmp_path / "alias.h")
    os.symlink(tree / "b.h", tree / "link.h")
    os.symlink(tree / "e.h", tree / "elink.h")
    witnesses = [_witness("t", tree), _witness("l", tree / "a.h"), _witness("s", tree / "link.h"),
                 _witness("s", tree / "c.h"), _witness("d", tree), _witness("a", tree / "gone.h"),
                 _witness("m", tree / "nothere" / "x.h"), _witness("f", tree / "d.h"), _witness("n", tree / "c.h"),
                 _witness("k", tree / "elink.h")]
    time.sleep(0.02)
    if change == "edited":
        (tree / "a.h").write_text("9")
    elif change == "removed":
        (tree / "c.h").unlink()
    elif change == "touched":
        os.utime(tree / "a.h")
    elif change == "a missing path created":
        (tree / "gone.h").write_text("")
    elif change == "a folder's name added":
        (tree / "new.h").write_text("")
    elif change == "the trusted folder's mode":
        os.chmod(tree, 0o700)
    elif change == "a link retargeted":
        os.unlink(tree / "link.h")
        os.symlink(tree / "a.h", tree / "link.h")
    elif change == "written through a hard link":
        (tmp_path / "alias.h").write_text("33")
    elif change == "a file moved away and a link to it in its place":  # f: no link may lead to it now
        os.rename(tree / "d.h", tmp_path / "d.h")
        os.symlink(tmp_path / "d.h", tree / "d.h")
    elif change == "a link replaced by its target":  # k: a link it must still be
        os.rename(tree / "e.h", tree / "elink.h")
    elif change == "a file's link edited":
        (tree / "elink.h").write_text("55")
    python, native_verdict = _both(found, witnesses)
    assert python == native_verdict == (change == "none")


@pytest.mark.parametrize("change", ["none", "a file in the linked folder edited", "the folder link retargeted",
                                    "the folder moved and another put in its place"])
def test_the_native_check_walks_each_path_as_python_does(tmp_path: Path, change: str) -> None:
    """The same verdicts as Python's for paths through a folder that is a link, with '//', '.'
    and '..' or a trailing '/', the root's own names, a folder that is a file or not there; and
    for the link retargeted or the folder replaced between two checks (each check walks the
    paths again). The root's names witnessed are ones no other test changes: /tmp's own times
    move whenever a test beside this one makes a folder there."""
    found = _helper(tmp_path / "tools")
    real, other = tmp_path / "real", tmp_path / "other"
    for folder in (real, other):
        (folder / "sub").mkdir(parents=True)
        for name in ("a.h", "b.h"):
            (folder / name).write_text(folder.name)
    (tmp_path / "via").symlink_to(real)
    (tmp_path / "plain").write_text("")
    via = f"{tmp_path}/via"
    witnesses = [_witness("f", Path(f"{via}/a.h")), _witness("f", Path(f"{via}//b.h")),
                 _witness("d", Path(f"{via}/sub/")), _witness("d", Path(f"{via}/sub/..")),
                 _witness("f", Path(f"{via}/./a.h")), _witness("d", Path("/")), _witness("s", Path("/usr")),
                 _witness("a", Path("/abicache-no-such-name")), _witness("a", tmp_path / "plain" / "x.h"),
                 _witness("m", tmp_path / "gone" / "x.h"), _witness("k", tmp_path / "via")]
    assert _both(found, witnesses) == (True, True)
    time.sleep(0.02)
    if change == "a file in the linked folder edited":
        (real / "b.h").write_text("edited")
    elif change == "the folder link retargeted":
        (tmp_path / "via").unlink()
        (tmp_path / "via").symlink_to(other)
    elif change == "the folder moved and another put in its place":
        real.rename(tmp_path / "moved")
        other.rename(real)
    assert _both(found, witnesses) == (change == "none",) * 2
    time.sleep(0.02)
    # what the names reach now: witnesses taken now hold
    again = [_witness("f", Path(f"{via}/a.h")), _witness("f", Path(f"{via}//b.h"))]
    assert _both(found, again) == (True, True)


@pytest.mark.parametrize("changed", [None, 0, 1, 299, 300, 301, 599, 899, 1199])
def test_many_witnesses_checked_on_several_threads_name_the_first_that_moved(tmp_path: Path,
                                                                              changed: int | None) -> None:
    """1,200 witnesses: witness.c splits them among threads (at most 4, one per 256 witnesses,
    no more than the cores this process may use). Its answer is the index of the first witness
    that no longer holds, as one thread checking them in order says, wherever the runs are cut;
    and two moved: the first of them."""
    found = _helper(tmp_path / "tools")
    tree = tmp_path / "many"
    tree.mkdir()
    for i in range(1200):
        (tree / f"h{i}.h").write_text(str(i))
    witnesses = [_witness("l" if i % 3 else "f", tree / f"h{i}.h") for i in range(1200)]
    time.sleep(0.02)
    later = None
    if changed is not None:
        (tree / f"h{changed}.h").write_text("moved")
        later = min(changed + 700, 1199)
        (tree / f"h{later}.h").unlink()  # a second one after it, in another run
    kinds = "".join(k for k, _, _ in witnesses).encode()
    paths = b"".join(os.fsencode(p) + b"\0" for _, p, _ in witnesses)
    numbers = b"".join(record._WITNESS.pack(*w) for _, _, w in witnesses)
    first = found._hold(len(witnesses), kinds, paths, numbers)
    assert first == (-1 if changed is None else changed)
    assert found.hold(kinds, paths, numbers) == record._hold(witnesses) == (changed is None)
    threads = found._library.abicache_threads
    cores = len(os.sched_getaffinity(0))
    assert [threads(n) for n in (100, 600, 1200)] == [1, min(2, cores), min(4, cores)]


def test_the_native_arming_gives_the_kernels_descriptors(tmp_path: Path) -> None:
    found = _helper(tmp_path / "tools")
    (tmp_path / "a.h").write_text("1")
    if sys.platform != "linux":
        pytest.skip("inotify is Linux's")
    from abicache.store import inotify

    watcher = inotify.Inotify()
    try:
        paths = [str(tmp_path / "a.h"), str(tmp_path)]
        mask = inotify.IN_MODIFY | inotify.IN_CREATE
        wds = found.arm(watcher.fd, paths, [mask, mask])
        assert wds == [watcher.add_watch(p, mask) for p in paths]  # the kernel's descriptors, the same again
        assert found.arm(watcher.fd, [str(tmp_path / "nothing")], [mask]) is None
    finally:
        watcher.close()


def test_the_native_search_for_link_holders_says_what_python_says(tmp_path: Path) -> None:
    """The folders holding a symbolic link on the way to a watched folder (store/watch.py
    _link_holders), found in one native call: the same holders in the same order, for links at
    any depth, a link to a link, parts shared with the folder before or not, '//' and a
    trailing '/', the root, and folders that are not there."""
    from abicache.store import watch

    found = _helper(tmp_path / "tools")
    real = tmp_path / "real" / "deep" / "er"
    real.mkdir(parents=True)
    (tmp_path / "via").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "hop").symlink_to(tmp_path / "via")
    (tmp_path / "twice").symlink_to(tmp_path / "via")
    folders = sorted({str(real), str(tmp_path / "via" / "deep"), str(tmp_path / "via" / "deep" / "er"),
                      str(tmp_path / "real" / "hop" / "deep"), str(tmp_path / "twice" / "deep" / "er"),
                      f"{tmp_path}/via//deep/", f"{tmp_path}//twice", "/", str(tmp_path / "gone" / "x"),
                      str(tmp_path / "via")})
    watch._holders.clear()
    watch._links.clear()
    python = [holder for folder in folders for holder in watch._link_holders(folder)]
    assert found.holders(folders) == python
    assert str(tmp_path) in python and str(tmp_path / "real") in python  # links were met
    assert found.holders([]) == [] and found.holders([str(real)]) == []
    assert found.holders(["/" + "x" * 5000]) is None  # too long for the kernel: Python answers


def test_the_native_abi_is_the_one_witness_c_says() -> None:
    text = Path(native.SOURCE).read_text()
    assert f"#define WITNESS_ABI {native.ABI}\n" in text


def test_a_writer_that_built_nothing_names_an_older_library_whose_calls_mean_the_same(tmp_path: Path) -> None:
    """After an upgrade that changed witness.c, a process that builds nothing finds no library
    of this source (a hit spawns no compiler): it names one an older source built where its
    calls mean the same (the ABI number), never one without the number or with another."""
    tools = tmp_path / "tools"
    _helper(tools)
    current = Path(native.existing(str(tools)) or "")
    assert current.is_file() and native.holder(str(current)).abi() == native.ABI  # type: ignore[union-attr]
    machine = os.uname().machine
    older = tools / f"witness-0000000000000000-{machine}"
    older.mkdir(mode=0o755)
    (older / native.LIBRARY).write_bytes(current.read_bytes())
    os.chmod(older / native.LIBRARY, 0o555)
    os.chmod(current, 0o755)
    shutil.rmtree(current.parent)
    assert native.existing(str(tools)) == str(older / native.LIBRARY)
    if os.geteuid() == 0:  # another user's older library, the same bytes: never named
        os.chown(older / native.LIBRARY, 65534, 65534)
        assert native.existing(str(tools)) is None
        os.chown(older / native.LIBRARY, 0, 0)
        os.chmod(older / native.LIBRARY, 0o575)  # nor one its group may write
        assert native.existing(str(tools)) is None

    shutil.rmtree(older)
    other = tools / f"witness-ffffffffffffffff-{machine}"
    other.mkdir(mode=0o755)
    source = tmp_path / "other.c"
    source.write_text(Path(native.SOURCE).read_text().replace("#define WITNESS_ABI ", "#define WITNESS_ABI 9"))
    subprocess.run(["cc", "-shared", "-fPIC", "-pthread", "-o", str(other / native.LIBRARY), str(source)], check=True)
    os.chmod(other / native.LIBRARY, 0o555)
    assert native._load(str(other / native.LIBRARY)) is not None  # loadable, but its calls mean other things
    assert native.existing(str(tools)) is None
    assert native.holder(str(other / native.LIBRARY)) is None  # nor does a hit use one a record names


def test_the_native_check_names_the_cxx_runtime_as_python_does(tmp_path: Path) -> None:
    """A c witness (the C++ runtime a C++ library's requirements were read from) is judged by
    the path the helper gets from the dynamic linker, as native/loaded.py gets it; a library
    not loaded is no answer (record.py then asks native/loaded.py, which loads it)."""
    from abicache.native.loaded import LIBSTDCXX, libstdcxx_path

    found = _helper(tmp_path / "tools")
    expected = libstdcxx_path()
    if expected is None:
        pytest.skip("no C++ runtime here")
    assert found.loaded(LIBSTDCXX.encode()) == expected
    assert found.loaded(b"libabicache-never-loaded.so.1") is None


def test_a_record_says_which_files_are_links_and_plans_their_watch(tmp_path: Path) -> None:
    """writer.py names each file the build read f, n or k (record.py), witnesses each link on
    the way to a k file by its own inode (l), and plans the watch from them: what the served
    call arms before it checks anything of the build. A link put back as it was (the same
    target, a new link) no longer holds: the watch planned for the old one may not see it."""
    from abicache.store import watch

    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "a.h").write_text("1")
    (other / "b.h").write_text("2")
    os.symlink(other / "b.h", tmp_path / "link.h")
    (tmp_path / "c.h").write_text("3")
    os.link(tmp_path / "c.h", tmp_path / "alias.h")
    taken = [writer._file(str(tmp_path / n)) for n in ("a.h", "link.h", "c.h")]
    assert [k for k, _, _ in taken] == ["f", "k", "n"]
    links, hops = writer._hops([str(tmp_path / "link.h")])
    assert links == {str(other)} and [(k, p) for k, p, _ in hops] == [("l", str(tmp_path / "link.h"))]
    planned = dict(writer._plan(taken + hops, links))
    file_mask, names_mask, _ = watch.masks()
    assert planned[str(other)] & names_mask == names_mask  # a name changed where the link leads: seen
    assert planned[str(tmp_path / "link.h")] == planned[str(tmp_path / "c.h")] == file_mask
    assert record._hold(taken + hops)
    time.sleep(0.01)
    os.unlink(tmp_path / "link.h")
    os.symlink(other / "b.h", tmp_path / "link.h")
    assert record._hold(taken) and not record._hold(taken + hops)


@pytest.mark.parametrize("how", ["group-writable", "in a group-writable folder", "of another user"])
def test_a_native_check_anyone_else_may_write_is_not_loaded(tmp_path: Path, how: str) -> None:
    need("cc")
    tools = tmp_path / "tools"
    path = Path(native.build(str(tools), "cc") or "")
    assert path.is_file()
    if how == "group-writable":
        os.chmod(path, 0o575)
    elif how == "in a group-writable folder":
        os.chmod(path.parent, 0o775)
    else:
        if os.geteuid() != 0:
            pytest.skip("changing a file's owner needs root")
        os.chown(path, 65534, 65534)
    assert native._load(str(path)) is None
    copy = tmp_path / "copy"
    shutil.copytree(tools, copy)  # the same bytes, as this user: loaded
    os.chmod(next(copy.rglob(native.LIBRARY)), 0o555)
    os.chmod(next(copy.rglob(native.LIBRARY)).parent, 0o755)
    assert native._load(str(next(copy.rglob(native.LIBRARY)))) is not None


LARGE = '#include <bits/stdc++.h>\n#include "answer.h"\nextern "C" int answer() { return std::max(ANSWER, 0); }'


def test_a_large_record_is_checked_natively_and_an_edit_still_sends_the_call_the_full_way(tmp_path: Path) -> None:
    """A C++ library whose build read hundreds of headers: its build writes the native check
    beside it and its record names it; a later process is served through it; an edit of the
    project header it read is a rebuild with the new value, never the old library."""
    need("c++")
    need("cc")
    root, include = tmp_path / "store", tmp_path / "inc"
    include.mkdir()
    (include / "answer.h").write_text("#define ANSWER 7\n")
    code = (f"import json\nfrom abicache import Cache, cc\n"
            f"lib = cc.load_library('large', [{LARGE!r}], cflags=['-I{include}'], cache=Cache({str(root)!r}))\n"
            "held = next(iter(cc._loaded.values()))[0]\n"
            "print(json.dumps([lib.answer(), type(held).__name__ == 'Served']))")
    outs = [json.loads(run_py(code).stdout) for _ in range(3)]
    assert outs[0] == [7, False] and outs[-1] == [7, True]
    (data,) = [p.read_bytes() for p in Path(hits.folder(os.path.realpath(root))).iterdir()]
    head, _, body = data.partition(b"\n")
    n, planned = int(head.split()[2]), int(head.split()[3])
    helper = body[n * record._WITNESS.size + planned * record._MASK.size:].split(b"\0")[8]
    assert helper.endswith(native.LIBRARY.encode()) and Path(os.fsdecode(helper)).is_file()
    time.sleep(0.02)
    (include / "answer.h").write_text("#define ANSWER 8\n")
    assert json.loads(run_py(code).stdout) == [8, False]
    assert stat.S_IMODE(os.stat(os.fsdecode(helper)).st_mode) & 0o022 == 0
    assert cc  # the frontend the child used


#: what a served call checks, in order (a child's native check and watch, logged)
ORDER = """
import json
from abicache import Cache, cc, hits
from abicache.hits import native, record
from abicache.store import watch
log = []
hold, init, python = native.Native.hold, watch.Watch.__init__, record._hold
native.Native.hold = lambda self, kinds, paths, numbers: log.append(["native", len(kinds)]) or hold(self, kinds, paths, numbers)
record._hold = lambda witnesses: log.append(["python", len(witnesses)]) or python(witnesses)
def armed(self, *args, **kwargs):
    log.append(["arm", 0])
    init(self, *args, **kwargs)
watch.Watch.__init__ = armed
lib = cc.load_library('large', [{code!r}], cflags=['-I{include}'], cache=Cache({root!r}))
held = next(iter(cc._loaded.values()))[0]
print(json.dumps([lib.answer(), type(held).__name__ == 'Served', log]))
"""


def test_a_large_record_arms_the_watch_first_and_checks_the_build_once(tmp_path: Path) -> None:
    """Issue 49: the served call checked what the build read twice, before and after arming
    the watch (1.4 ms each for a torch extension's ~600 headers), and the store's witnesses in
    Python. Now the store's are checked natively, the watch is armed, and the build's are
    checked once, natively: nothing slips between the watch and the check."""
    need("c++")
    need("cc")
    root, include = tmp_path / "store", tmp_path / "inc"
    include.mkdir()
    (include / "answer.h").write_text("#define ANSWER 7\n")
    code = ORDER.format(code=LARGE, include=include, root=str(root))
    for _ in range(3):
        value, served, log = json.loads(run_py(code).stdout)
    assert value == 7 and served
    (stored, store_kind), (arm, _), (build, build_kind) = [(k, n) for k, n in log]
    assert (stored, arm, build) == ("native", "arm", "native") and build_kind >= native.WORTH, log
