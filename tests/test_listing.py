"""`abicache ls` of a big store: the memo of rows it keeps (cli/listing_memo) and its
--json lines, checked against what reading every manifest shows."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from abicache import Cache
from abicache.cli import listing, listing_memo, main
import hostile
from conftest import writer


def _store(root: Path, count: int) -> Cache:
    cache = Cache(root, remote=False)
    for n in range(count):
        cache.get_or_build("t", f"e{n}", {"extra": {"n": n}}, writer({"lib.so": f"{n}"}))
    return cache


def _ls(capsys: pytest.CaptureFixture[str], root: Path) -> list[dict]:
    assert main(["ls", "--json", "--root", str(root)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def manifest_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The entries whose manifest `ls` reads (a file or names: manifest_names.read_any)."""
    opened: list[str] = []
    real = listing.read_any

    def counting(vdir, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(os.fspath(vdir))
        return real(vdir, *args, **kwargs)

    monkeypatch.setattr(listing, "read_any", counting)
    return opened


def _drop_logs(cache: Cache) -> None:
    """As a store filled before publishing logged rows (or by another user) is."""
    for log in cache.store.layout.listing.glob("*.log"):
        log.unlink()


def test_a_second_ls_reads_no_manifest_and_a_new_entry_is_read_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest_reads: list[str]) -> None:
    cache = _store(tmp_path / "s", 5)
    _drop_logs(cache)
    first = _ls(capsys, tmp_path / "s")
    assert len(first) == 5 and len(manifest_reads) == 5
    assert (cache.store.layout.listing / "t.rows").is_file()
    manifest_reads.clear()
    assert _ls(capsys, tmp_path / "s") == first and manifest_reads == []
    cache.get_or_build("t", "new", {"extra": {"n": "new"}}, writer({"lib.so": "new"}))
    _drop_logs(cache)
    manifest_reads.clear()
    third = _ls(capsys, tmp_path / "s")
    assert [r["name"] for r in third] == ["e0", "e1", "e2", "e3", "e4", "new"] and len(manifest_reads) == 1


def test_the_first_ls_of_a_store_just_filled_reads_no_manifest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest_reads: list[str]) -> None:
    """Publishing logs each entry's row (store/listing_log): the first `ls` takes the log into
    its memo and shows what reading every manifest shows (issue 49: 10^4 entries in 0.4 s)."""
    cache = _store(tmp_path / "s", 5)
    cache.get_or_build("t", "gpu", {"extra": {"n": "gpu"}}, writer({"a.so": "a", "sub/b.so": "bb"}),
                       ["gpu.arch ~= sm_90"])
    log = cache.store.layout.listing / f"t.{os.geteuid()}.log"
    assert len(log.read_bytes().splitlines()) == 6
    first = _ls(capsys, tmp_path / "s")
    assert manifest_reads == [] and not log.exists() and (cache.store.layout.listing / "t.rows").is_file()
    (cache.store.layout.listing / "t.rows").unlink()
    assert _ls(capsys, tmp_path / "s") == first and len(manifest_reads) == 6  # read from the manifests
    assert [r["name"] for r in first] == ["e0", "e1", "e2", "e3", "e4", "gpu"]
    assert first[-1]["files"] == ["a.so", "sub/b.so"] and first[-1]["size"] == 3
    assert first[-1]["requirements"] == ["gpu.arch ~= sm_90"]


@pytest.mark.parametrize("damage", ["a cut line", "a line break in a name", "another inode"])
def test_a_logged_row_that_is_not_whole_is_read_from_its_manifest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest_reads: list[str], damage: str) -> None:
    cache = _store(tmp_path / "s", 3)
    log = cache.store.layout.listing / f"t.{os.geteuid()}.log"
    lines = log.read_bytes().splitlines()
    row = json.loads(lines[1])
    if damage == "a cut line":  # a crash in the middle of a write
        lines[1] = lines[1][:len(lines[1]) // 2]
    elif damage == "a line break in a name":
        lines[1] = json.dumps([*row[:3], "e1\nfake", *row[4:]]).encode()
    else:  # the folder was replaced since (its row says another inode)
        lines[1] = json.dumps([row[0], row[1] + 1, *row[2:]]).encode()
    log.write_bytes(b"\n".join(lines) + b"\n")
    shown = _ls(capsys, tmp_path / "s")
    assert [r["name"] for r in shown] == ["e0", "e1", "e2"] and len(manifest_reads) == 1


def test_the_log_stops_growing_at_its_limit_and_gc_removes_it_with_its_kind(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest_reads: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from abicache.store import gc, listing_log

    monkeypatch.setattr(listing_log, "LIMIT", 300)  # room for two rows of these (140 bytes each)
    cache = _store(tmp_path / "s", 5)
    log = cache.store.layout.listing / f"t.{os.geteuid()}.log"
    assert len(log.read_bytes().splitlines()) == 2 and log.stat().st_size <= 300
    cache.get_or_build("u", "other", {}, writer({"lib.so": "u"}))
    assert len(_ls(capsys, tmp_path / "s")) == 6 and len(manifest_reads) == 3  # the 3 t's log had no room for
    cache.get_or_build("u", "again", {}, writer({"lib.so": "again"}))
    for entry in (cache.store.layout.entries / "u").glob("*/*.*"):
        shutil.rmtree(entry)
    gc.collect_garbage(cache.store, max_size=None)
    assert not (cache.store.layout.listing / f"u.{os.geteuid()}.log").exists()


def test_an_entry_gone_or_replaced_shows_as_it_is_now(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A row is kept under its folder's name and inode: an entry removed is no longer
    listed, and a folder put in its place (a new inode) is read again."""
    cache = _store(tmp_path / "s", 3)
    before = _ls(capsys, tmp_path / "s")
    gone, replaced = Path(before[0]["path"]), Path(before[1]["path"])
    shutil.rmtree(gone)
    copy = tmp_path / "copy"
    shutil.copytree(replaced, copy)
    doc = hostile.manifest_doc(copy)
    hostile.rewrite_manifest(copy, json.dumps({**doc, "name": "renamed"}).encode())
    shutil.rmtree(replaced)
    copy.rename(replaced)
    after = _ls(capsys, tmp_path / "s")
    assert [r["name"] for r in after] == ["e2", "renamed"]
    assert cache.store.layout.listing.joinpath("t.rows").is_file()


def _rows_of(path: Path) -> list[list]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def _write_rows(path: Path, rows: list[list]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("memo", [
    b"not json",
    b'{"version": 1, "rows": {}}',  # format 1's text under format 2's name
    "bad rows",  # the real memo with its rows' fields of the wrong types
    "a file that is no text",  # the real memo with a number among a row's files
    "a line break",  # the real memo with a control character in a name (a second row on screen)
])
def test_a_memo_ls_did_not_write_is_not_used(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             memo: bytes | str) -> None:
    cache = _store(tmp_path / "s", 3)
    truth = _ls(capsys, tmp_path / "s")
    path = cache.store.layout.listing / "t.rows"
    rows = _rows_of(path)
    if memo == "bad rows":
        _write_rows(path, [[r[0], r[1], 1, 2, "3", 4, 5, "6"] for r in rows])
    elif memo == "a file that is no text":
        _write_rows(path, [[*r[:5], [7], *r[6:]] for r in rows])
    elif memo == "a line break":
        _write_rows(path, [[*r[:3], "e\nfake", *r[4:]] for r in rows])
    else:
        path.write_bytes(memo)
    assert _ls(capsys, tmp_path / "s") == truth
    assert sorted(_rows_of(path)) == sorted(rows)  # written again as it should be


def test_the_first_ls_keeps_the_log_as_its_memo_and_a_later_one_appends_the_next_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest_reads: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo is the log's lines: the first `ls` of a store just filled renames the log it
    took into place, and a later `ls` puts the new log's lines after the memo's, encoding
    no row (10,000 rows took 0.1 s to encode)."""
    cache = _store(tmp_path / "s", 3)
    listing_dir = cache.store.layout.listing
    log = listing_dir / f"t.{os.geteuid()}.log"
    logged, inode = log.read_bytes(), log.stat().st_ino
    encoded: list[object] = []  # the memos written row by row
    real = listing_memo.save
    monkeypatch.setattr(listing_memo, "save", lambda *a: encoded.append(a) or real(*a))
    first = _ls(capsys, tmp_path / "s")
    memo = listing_dir / "t.rows"
    assert memo.read_bytes() == logged and memo.stat().st_ino == inode and memo.stat().st_mode & 0o777 == 0o600
    cache.get_or_build("t", "more", {"extra": {"n": "more"}}, writer({"lib.so": "more"}))
    more = log.read_bytes()
    second = _ls(capsys, tmp_path / "s")
    assert memo.read_bytes() == logged + more and not log.exists()
    unused = [{**r, "last_used": 0} for r in second[:3]]  # the build stamped the others' use
    assert unused == [{**r, "last_used": 0} for r in first] and second[3]["name"] == "more"
    assert manifest_reads == [] and encoded == []
    shutil.rmtree(second[0]["path"])  # an entry gone: the memo is written again, without it
    assert _ls(capsys, tmp_path / "s") == second[1:] and len(_rows_of(memo)) == 3 and encoded


def test_a_memo_of_format_1_is_not_read_and_goes_when_ls_writes_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest_reads: list[str]) -> None:
    cache = _store(tmp_path / "s", 2)
    _drop_logs(cache)
    old = cache.store.layout.listing / "t.json"  # as an older abicache wrote it, each name changed
    cache.store.layout.listing.mkdir(exist_ok=True)
    old.write_text(json.dumps({"version": 1, "rows": {}}))
    shown = _ls(capsys, tmp_path / "s")
    assert [r["name"] for r in shown] == ["e0", "e1"] and len(manifest_reads) == 2
    assert not old.exists() and (cache.store.layout.listing / "t.rows").is_file()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_memo_another_user_owns_is_not_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = _store(tmp_path / "s", 2)
    truth = _ls(capsys, tmp_path / "s")
    path = cache.store.layout.listing / "t.rows"
    _write_rows(path, [[*r[:3], "theirs", *r[4:]] for r in _rows_of(path)])
    os.chown(path, 12345, 12345)
    assert listing_memo.load(str(path)).by_name == {}
    assert _ls(capsys, tmp_path / "s") == truth


def test_json_lines_are_what_json_writes(tmp_path: Path) -> None:
    """Row.json_line (one format, json's C quoting) against json.dumps of Row.summary, for
    texts json escapes: quotes, backslashes, non-ASCII, a path with an undecodable byte."""
    odd = listing.Row(path=os.fsdecode(b"/st\xffore/a \"b\"\\c"), kind="t.k", name="n\u00e9 \U0001f600 '\"",
                      key="ab" * 32, variant="cd" * 8, size=12, files=("lib.so", "dir/x \u00e9"),
                      requirements=("python.abi3 >= 3.10", "torch == 2.13.0"), created=1795690186.5905967,
                      last_used=float("inf"))
    plain = odd._replace(files=(), requirements=(), created=0.0, last_used=1.5)
    for row in (odd, plain):
        assert row.json_line() == json.dumps(row.summary(), sort_keys=True, default=str)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_log_another_user_owns_is_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             manifest_reads: list[str]) -> None:
    """In a group's store another member could put a log under this user's name: its rows
    (here each renamed) are not shown, the manifests are read instead."""
    cache = _store(tmp_path / "s", 2)
    log = cache.store.layout.listing / f"t.{os.geteuid()}.log"
    rows = [json.loads(line) for line in log.read_bytes().splitlines()]
    log.write_text("".join(json.dumps([*r[:3], "theirs", *r[4:]]) + "\n" for r in rows))
    os.chown(log, hostile.ATTACKER, hostile.ATTACKER)  # nobody's
    shown = _ls(capsys, tmp_path / "s")
    assert [r["name"] for r in shown] == ["e0", "e1"] and len(manifest_reads) == 2


@pytest.mark.parametrize("plant", ["fifo", "symlink"])
@pytest.mark.parametrize("memo", ["log", "memo"])
def test_a_fifo_or_link_for_a_log_or_memo_neither_hangs_nor_redirects(tmp_path: Path, plant: str, memo: str) -> None:
    """A FIFO where the listing log or memo goes (a group's member could make one) once hung
    every publish or `ls` (a FIFO opened plainly waits for a writer or reader); a link
    never leads elsewhere. The trial runs in a process of its own, bounded in time."""
    import subprocess
    import sys

    from conftest import SRC, plant as planted

    cache = _store(tmp_path / "s", 1)
    cache.store.layout.listing.mkdir(exist_ok=True)
    name = f"t.{os.geteuid()}.log" if memo == "log" else "t.rows"
    path = cache.store.layout.listing / name
    path.unlink(missing_ok=True)
    outside = tmp_path / "outside"
    planted(path, plant, outside)
    code = ("import sys\nfrom abicache import Cache\nfrom abicache.cli import main\n"
            "c = Cache(sys.argv[1], remote=False)\n"
            "c.get_or_build('t', 'new', {'extra': {}}, lambda out: (out / 'lib.so').write_text('n'))\n"
            "assert main(['ls', '--json', '--root', sys.argv[1]]) == 0\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(r["name"] for r in json.loads(done.stdout)) == ["e0", "new"]
    assert not outside.exists() or outside.read_text() == ""
