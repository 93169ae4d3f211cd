"""The launcher's native front (src/abicache/launcher/front.c): it names a compile's hit
record as launcher/records.py does, serves a hit by stat alone (no Python), and hands
anything it cannot vouch for to the Python launcher, which is never wrong."""

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

from conftest import SRC, need

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("cc") is None,
                                reason="g++ and cc (which builds the front) are needed")

HANDED = 75  # front.c: --abicache-serve-only's status where Python would have run


def environment(**more: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), **more}


@pytest.fixture
def front(tmp_path: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "abicache", "launcher", "--json"], capture_output=True, text=True,
                          env=environment(), check=True)
    made = json.loads(done.stdout)
    assert made["path"], made["why"]
    return Path(made["path"])


def project(folder: Path) -> Path:
    (folder / "inc").mkdir(parents=True)
    (folder / "inc" / "value.h").write_text("#define VALUE 3\n")
    (folder / "unit.cpp").write_text('#include "value.h"\n#warning served\nint unit() { return VALUE; }\n')
    time.sleep(0.05)  # past a clock tick: a source younger than that is bound by no record (a warm miss reads it at once)
    return folder


WORDS = ["g++", "-Iinc", "-MD", "-MF", "unit.d", "-c", "unit.cpp", "-o", "unit.o"]


def run(front: Path, folder: Path, *words: str, only: bool = False, env: dict[str, str] | None = None) \
        -> subprocess.CompletedProcess[bytes]:
    argv = [str(front), *(["--abicache-serve-only"] if only else []), *(words or WORDS)]
    return subprocess.run(argv, cwd=folder, capture_output=True, env=env or environment(), timeout=300)


def settled(front: Path, folder: Path) -> subprocess.CompletedProcess[bytes]:
    """The front's answer once the record a miss leaves to a child has been written."""
    for _ in range(100):
        done = run(front, folder, only=True)
        if done.returncode != HANDED:
            return done
        time.sleep(0.05)
    return done


def counts() -> dict:
    done = subprocess.run([sys.executable, "-m", "abicache", "stats", "--json"], capture_output=True, text=True,
                          env=environment(), check=True)
    return json.loads(done.stdout)["counts"]


@pytest.mark.parametrize("odd", ["", "dir with space/and#hash$", "latin\udce9"])
def test_the_front_names_a_record_as_python_does(front: Path, tmp_path: Path, odd: str) -> None:
    folder = tmp_path / odd if odd else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    env = environment(ODD_VARIABLE="caf\udce9 = x".encode("utf-8", "surrogateescape").decode("latin-1"),
                      MAKEFLAGS=f" -j4 --jobserver-auth=fifo:/tmp/GMfifo{os.getpid()}", _="/usr/bin/make")
    words = [*WORDS, f"-DNAME={odd}"]
    code = ("import sys; from abicache.launcher import records; from abicache import hits; "
            "print(records.name(hits.default_root(), sys.argv[1:]))")
    python = subprocess.run([sys.executable, "-c", code, *words], cwd=folder, env=env, capture_output=True,
                            text=True, check=True)
    native = subprocess.run([str(front), "--abicache-name", *words], cwd=folder, env=env, capture_output=True,
                            text=True, check=True)
    assert native.stdout == python.stdout and len(native.stdout.strip()) == 64


def test_a_hit_is_served_without_python_and_writes_what_the_miss_wrote(front: Path, tmp_path: Path) -> None:
    folder = project(tmp_path / "p")
    miss = run(front, folder)
    assert miss.returncode == 0, miss.stderr
    made = {name: (folder / name).read_bytes() for name in ("unit.o", "unit.d")}
    for name in made:
        (folder / name).unlink()
    hit = settled(front, folder)
    assert hit.returncode == 0, hit.stderr
    assert hit.stderr == miss.stderr and b"#warning served" in hit.stderr
    assert {name: (folder / name).read_bytes() for name in made} == made
    by_kind = counts()["by_kind"]["cc.compile"]
    assert (by_kind["misses"], by_kind["hits"]) == (1, 1)


@pytest.mark.parametrize("change", ["header edited", "header shadowed", "source edited", "environment",
                                    "record writable by others", "record of another user", "entry file replaced"])
def test_what_moved_is_handed_to_python(front: Path, tmp_path: Path, change: str) -> None:
    folder = project(tmp_path / "p")
    assert run(front, folder).returncode == 0
    assert settled(front, folder).returncode == 0
    env = None
    if change == "header edited":
        (folder / "inc" / "value.h").write_text("#define VALUE 4\n")
    elif change == "header shadowed":
        (folder / "value.h").write_text("#define VALUE 5\n")  # the source's own folder is searched first
    elif change == "source edited":
        (folder / "unit.cpp").write_text((folder / "unit.cpp").read_text() + "int more;\n")
    elif change == "environment":
        env = environment(CPATH=str(folder))
    else:
        root = Path(os.environ["ABICACHE_DIR"]) / "v3"
        if change == "record writable by others":
            for record in (root / "hits").iterdir():
                record.chmod(0o666)
        elif change == "record of another user":  # as `nobody` could have written it: never read
            if os.geteuid() != 0:
                pytest.skip("chown to nobody needs root")
            import pwd

            for record in (root / "hits").iterdir():
                os.chown(record, pwd.getpwnam("nobody").pw_uid, -1)
        else:
            for output in root.glob("entries/cc.compile/*/*.*/output-0"):
                data = output.read_bytes()
                output.unlink()
                output.write_bytes(data)
                output.chmod(0o444)
    assert run(front, folder, only=True, env=env).returncode == HANDED
    again = run(front, folder, env=env)  # Python: a miss, or a hit the full way, never a stale object
    assert again.returncode == 0, again.stderr
    bare = subprocess.run(["g++", "-Iinc", "-c", "unit.cpp", "-o", "bare.o"], cwd=folder, capture_output=True,
                          env=env or environment())
    assert bare.returncode == 0
    assert (folder / "unit.o").read_bytes() == (folder / "bare.o").read_bytes()


def test_a_missing_output_folder_is_the_compilers_error(front: Path, tmp_path: Path) -> None:
    folder = project(tmp_path / "p")
    (folder / "objects").mkdir()
    words = [*WORDS[:-1], "objects/unit.o"]
    assert run(front, folder, *words).returncode == 0
    for _ in range(100):
        if run(front, folder, *words, only=True).returncode == 0:
            break
        time.sleep(0.05)
    shutil.rmtree(folder / "objects")
    assert run(front, folder, *words, only=True).returncode == HANDED
    done = run(front, folder, *words)
    bare = subprocess.run(words, cwd=folder, capture_output=True)
    assert done.returncode == bare.returncode != 0


def test_a_make_build_cleaned_and_built_again_is_served_by_the_front(front: Path, tmp_path: Path) -> None:
    need("make")
    folder = project(tmp_path / "p")
    for unit in ("a", "b", "c"):
        (folder / f"{unit}.cpp").write_text(f'#include "value.h"\nint {unit}() {{ return VALUE; }}\n')
    time.sleep(0.05)  # past a clock tick, as project() does: a warm launcher left by an earlier test serves the
    # first build's misses at once, and a source younger than that is bound by no record
    (folder / "Makefile").write_text(
        "OBJS = a.o b.o c.o unit.o\n"
        "lib.a: $(OBJS)\n\tar rcs $@ $^\n"
        "%.o: %.cpp\n\t$(CXX) -Iinc -MMD -c $< -o $@\n"
        "clean:\n\trm -f $(OBJS) lib.a *.d\n")
    env = environment()
    link = tmp_path / "launcher"  # $CXX is in the environment make gives its recipes: one for both builds
    link.symlink_to(front)
    make = ["make", "-s", f"CXX={link} g++"]
    subprocess.run([*make, "clean", "lib.a"], cwd=folder, env=env, check=True, capture_output=True)
    records = Path(os.environ["ABICACHE_DIR"]) / "v3" / "hits"
    for _ in range(200):  # the records a miss leaves to a child
        if records.is_dir() and len(list(records.iterdir())) == 4:
            break
        time.sleep(0.05)
    subprocess.run([*make, "clean"], cwd=folder, env=env, check=True, capture_output=True)
    # the same front without Python: a compile it handed over would run uncounted, so 4 hits are 4 served
    link.unlink()
    link.symlink_to(without_python(front, tmp_path))
    alone = subprocess.run([*make, "lib.a"], cwd=folder, env=env, capture_output=True)
    assert alone.returncode == 0 and b"cannot run" not in alone.stderr, alone.stderr
    by_kind = counts()["by_kind"]["cc.compile"]
    assert (by_kind["misses"], by_kind["hits"]) == (4, 4)


def without_python(front: Path, tmp_path: Path) -> Path:
    """The front built as `abicache launcher` builds it, but for an interpreter that is not there."""
    from abicache.launcher import front as builder

    header = builder.config_header().replace(os.fsencode(sys.executable), b"/nonexistent/python")
    (tmp_path / "config.h").write_bytes(header)
    program = tmp_path / "front-without-python"
    subprocess.run(["cc", "-O2", "-include", str(tmp_path / "config.h"), "-o", str(program), str(builder.SOURCE)],
                   check=True)
    return program


def test_the_front_and_the_records_leave_out_the_same_names() -> None:
    from abicache.launcher.records import VOLATILE
    from abicache.store import stamps

    source = (SRC / "abicache" / "launcher" / "front.c").read_text()
    for name in (stamps.FILENAME, stamps.DEPS_FILENAME, stamps.NAME_PREFIX, *VOLATILE):
        assert f'"{name}"' in source


def test_the_front_is_this_users_alone(front: Path) -> None:
    for path in (front, front.parent):
        st = os.lstat(path)
        assert st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def test_a_link_named_after_the_compiler_is_its_launcher(front: Path, tmp_path: Path) -> None:
    """Masquerading, as /usr/lib/ccache: `abicache launcher --links` holds g++ -> the front; run as
    CXX=LINKS/g++ (torch's BuildExtension takes one word), it launches the first other g++ on PATH."""
    links = Path(subprocess.run([sys.executable, "-m", "abicache", "launcher", "--links"], capture_output=True,
                                text=True, env=environment(), check=True).stdout.strip())
    assert (links / "g++").resolve() == front.resolve()
    folder = project(tmp_path / "p")
    words = [str(links / "g++"), *WORDS[1:]]
    env = environment(PATH=f"{links}:{os.environ['PATH']}")  # first on PATH too: it must not find itself
    first = subprocess.run(words, cwd=folder, env=env, capture_output=True, timeout=300)
    assert first.returncode == 0, first.stderr
    made = (folder / "unit.o").read_bytes()
    (folder / "unit.o").unlink()
    for _ in range(100):
        served = subprocess.run([str(front), "--abicache-serve-only", shutil.which("g++"), *WORDS[1:]], cwd=folder,
                                env=env, capture_output=True)
        if served.returncode == 0:
            break
        time.sleep(0.05)
    assert served.returncode == 0 and (folder / "unit.o").read_bytes() == made
    lonely = subprocess.run([str(links / "g++"), "--version"], env={**env, "PATH": str(links)}, capture_output=True)
    assert lonely.returncode == 127 and b"no g++ on PATH but this launcher" in lonely.stderr


def test_the_front_knows_a_compiler_by_the_names_the_launcher_does(tmp_path: Path) -> None:
    """A link is that compiler's launcher where launcher/command.py family() knows its name; any
    other name (the front's own, a link named `launcher`) is the launcher, the compiler after it."""
    from abicache.launcher.command import family

    source = (SRC / "abicache" / "launcher" / "front.c").read_text()
    harness = source.replace("int main(int argc, char **argv) {", "int front_main(int argc, char **argv) {") + (
        '\nint main(int argc, char **argv) { for (int i = 1; i < argc; i++) printf("%d", compiler_name(argv[i]));'
        " return 0; }\n")
    (tmp_path / "names.c").write_text(harness)
    subprocess.run(["cc", '-DABICACHE_VERSION="x"', '-DABICACHE_PYTHON="x"', '-DABICACHE_PATH="x"', "-o",
                    str(tmp_path / "names"), str(tmp_path / "names.c")], check=True)
    names = ["gcc", "g++", "cc", "c++", "clang", "clang++", "nvcc", "x86_64-linux-gnu-g++-12", "clang-17", "gcc-12.2",
             "c++-12", "clang++-17.0.1", "g++-", "launcher", "abicache-launch", "ccache", "ld", "cc1plus", "my-cc",
             "mycc", "12", "icc", "distcc"]
    said = subprocess.run([str(tmp_path / "names"), *names], capture_output=True, text=True, check=True).stdout
    assert {n: s == "1" for n, s in zip(names, said)} == {n: family(n) is not None for n in names}


EDITED_DURING = """
import os, sys, time
from abicache.launcher import compiling

built = compiling.build


def build(*args, **kwargs):
    result = built(*args, **kwargs)  # compiled from the bytes the key holds
    time.sleep(0.05)
    with open("unit.cpp", "a") as f:  # saved by an editor after the compile, before the record
        f.write("int edited = 1;\\n")
    return result


compiling.build = build
os.fork, os.setsid = (lambda: 0), (lambda: None)  # the child that writes the record is this process
from abicache.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_a_source_saved_after_its_bytes_were_read_is_never_bound_to_their_object(front: Path, tmp_path: Path) -> None:
    """The record witnesses the source at the stat its key's bytes were read under: a save after
    that (here, while the object was being kept) leaves no record, so the front never serves
    the old object for the new source."""
    folder = project(tmp_path / "p")
    done = subprocess.run([sys.executable, "-c", EDITED_DURING, *WORDS], cwd=folder, env=environment(),
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert run(front, folder, only=True).returncode == HANDED
    assert run(front, folder).returncode == 0
    subprocess.run(["g++", "-Iinc", "-c", "unit.cpp", "-o", "bare.o"], cwd=folder, check=True, capture_output=True)
    assert (folder / "unit.o").read_bytes() == (folder / "bare.o").read_bytes()


@pytest.mark.parametrize("bytes_", ["the same", "others of the same size"])
def test_a_project_file_written_again_is_judged_by_its_bytes(front: Path, tmp_path: Path, bytes_: str) -> None:
    """A configure step writes its headers again into a clean build folder: new inode and times,
    the same bytes. The front hashes a project file whose stat moved and serves the hit where
    the bytes are the recorded ones; other bytes (of the same size) are Python's to judge."""
    folder = project(tmp_path / "p")
    assert run(front, folder).returncode == 0
    assert settled(front, folder).returncode == 0
    header = folder / "inc" / "value.h"
    text = header.read_text() if bytes_ == "the same" else header.read_text().replace("3", "4")
    header.unlink()
    header.write_text(text)
    assert run(front, folder, only=True).returncode == (0 if bytes_ == "the same" else HANDED)


def test_a_source_written_again_with_its_bytes_is_served(front: Path, tmp_path: Path) -> None:
    """As a generated source (llama.cpp's build-info.cpp, written by each configure)."""
    folder = project(tmp_path / "p")
    assert run(front, folder).returncode == 0
    assert settled(front, folder).returncode == 0
    source = folder / "unit.cpp"
    text = source.read_bytes()
    source.unlink()
    source.write_bytes(text)
    assert run(front, folder, only=True).returncode == 0
