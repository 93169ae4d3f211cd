"""The compiler launcher (`abicache g++ -c x.cpp -o x.o`, src/abicache/launcher/run.py)
with the real compilers: one compile is one entry (its object, its dependency file, what it
printed), a hit writes what a fresh build would, an edit, a shadowing header, a word of the
command or a variable that steers the compiler each compile again, and what it cannot
cache runs as written, counted by reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SRC, need
from remote_fixtures import s3_endpoint  # noqa: F401  (the fixture a fleet's remote asks for)

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ is not installed")


def launch(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    """`abicache ARGV...` in cwd, as a build system runs it."""
    full = {**os.environ, "PYTHONPATH": str(SRC), "PWD": str(cwd), **env}
    return subprocess.run([sys.executable, "-m", "abicache", *argv], cwd=cwd, env=full, capture_output=True,
                          timeout=300)


def stats(**env: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "abicache", "stats", "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC), **env}, check=True)
    return json.loads(done.stdout)["counts"]


def project(folder: Path) -> Path:
    """A unit including a header by a quoted name and a search folder, and printing a warning."""
    (folder / "include").mkdir(parents=True)
    (folder / "src").mkdir()
    (folder / "include" / "common.h").write_text("#define COMMON 7\n")
    (folder / "src" / "unit.cpp").write_text('#include "common.h"\n#warning from the unit\n'
                                             "int unit() { return COMMON + sizeof(__FILE__); }\n")
    return folder


def compile_words(folder: Path, *more: str) -> list[str]:
    return ["g++", "-Iinclude", *more, "-MD", "-MF", "unit.d", "-o", "unit.o", "-c", "src/unit.cpp"]


def test_a_second_compile_is_a_hit_that_writes_every_output_and_replays_the_warning(tmp_path: Path) -> None:
    folder = project(tmp_path / "p")
    first = launch(compile_words(folder), folder)
    assert first.returncode == 0, first.stderr
    assert b"warning: #warning from the unit" in first.stderr
    made = {name: (folder / name).read_bytes() for name in ("unit.o", "unit.d")}
    for name in made:
        (folder / name).unlink()
    second = launch(compile_words(folder), folder)
    assert second.returncode == 0, second.stderr
    assert second.stderr == first.stderr and second.stdout == first.stdout
    assert {name: (folder / name).read_bytes() for name in made} == made
    counts = stats()
    assert (counts["hits_local"], counts["misses"], counts["builds"]) == (1, 1, 1)
    assert counts["by_kind"] == {"cc.compile": {"hits": 1, "misses": 1, "uncacheable": 0, "errors": 0}}


def test_what_a_hit_writes_is_what_the_compiler_writes(tmp_path: Path) -> None:
    """The bytes a hit hands back are the bare compiler's for the same command."""
    folder = project(tmp_path / "p")
    assert launch(compile_words(folder), folder).returncode == 0
    assert launch(compile_words(folder), folder).returncode == 0  # the hit
    served = (folder / "unit.o").read_bytes(), (folder / "unit.d").read_bytes()
    subprocess.run(compile_words(folder), cwd=folder, check=True, capture_output=True)
    assert ((folder / "unit.o").read_bytes(), (folder / "unit.d").read_bytes()) == served


def test_a_failed_compile_says_why_exits_as_the_compiler_did_and_is_not_kept(tmp_path: Path) -> None:
    folder = project(tmp_path / "p")
    (folder / "src" / "unit.cpp").write_text("int broken( {\n")
    bare = subprocess.run(compile_words(folder), cwd=folder, capture_output=True)
    done = launch(compile_words(folder), folder)
    assert done.returncode == bare.returncode != 0
    assert done.stderr == bare.stderr
    again = launch(compile_words(folder), folder)
    assert again.returncode == bare.returncode
    assert stats()["hits_local"] == 0


@pytest.mark.parametrize("change", ["header edited", "shadowing header", "word of the command", "CPATH",
                                    "source edited"])
def test_each_input_compiles_again_exactly_its_units(tmp_path: Path, change: str) -> None:
    """Two units, one of them including the header: a change compiles again the units that depend
    on it, and only those (the other is a hit)."""
    folder = project(tmp_path / "p")
    (folder / "src" / "other.cpp").write_text("int other() { return 1; }\n")
    (folder / "extra").mkdir()

    def build(*more: str, **env: str) -> None:
        for unit in ("unit", "other"):
            words = ["g++", "-Iextra", "-Iinclude", *more, "-o", f"{unit}.o", "-c", f"src/{unit}.cpp"]
            assert launch(words, folder, **env).returncode == 0

    build()
    before = stats()
    more, env = [], {}
    if change == "header edited":
        (folder / "include" / "common.h").write_text("#define COMMON 8\n")
    elif change == "shadowing header":
        (folder / "extra" / "common.h").write_text("#define COMMON 9\n")  # found first by -Iextra
    elif change == "word of the command":
        more = ["-DMORE=1"]
    elif change == "CPATH":
        env = {"CPATH": str(folder / "extra")}
    else:
        (folder / "src" / "unit.cpp").write_text((folder / "src" / "unit.cpp").read_text() + "int more;\n")
    build(*more, **env)
    after = stats()
    rebuilt = after["builds"] - before["builds"]
    hits = after["hits_local"] - before["hits_local"]
    expected = (2, 0) if change in ("word of the command", "CPATH") else (1, 1)
    assert (rebuilt, hits) == expected, change
    bare = subprocess.run(["g++", "-Iextra", "-Iinclude", *more, "-o", "bare.o", "-c", "src/unit.cpp"],
                          cwd=folder, env={**os.environ, **env}, check=True, capture_output=True)
    assert bare.returncode == 0
    assert (folder / "bare.o").read_bytes() == (folder / "unit.o").read_bytes()


def test_two_clones_share_hits_under_a_base_folder(tmp_path: Path) -> None:
    """CMake's words (every path absolute) from two clones: with ABICACHE_BASE_DIR above both, the
    second clone's compile is a hit, and writes what a fresh build there writes."""
    clones = [project(tmp_path / name) for name in ("one", "two")]
    for clone in clones:
        (clone / "build").mkdir()

    def words(clone: Path) -> list[str]:
        return [GXX, f"-I{clone}/include", "-MD", "-MT", "unit.o", "-MF", "unit.o.d", "-o", "unit.o",
                "-c", f"{clone}/src/unit.cpp"]

    for clone in clones:
        done = launch(words(clone), clone / "build", ABICACHE_BASE_DIR=str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert b"../src/unit.cpp" in done.stderr  # the message names the source relative, as ccache's
    counts = stats()
    assert (counts["hits_local"], counts["builds"]) == (1, 1)
    served = (clones[1] / "build" / "unit.o").read_bytes(), (clones[1] / "build" / "unit.o.d").read_bytes()
    fresh = [GXX, "-I../include", "-MD", "-MT", "unit.o", "-MF", "unit.o.d", "-o", "unit.o", "-c", "../src/unit.cpp"]
    subprocess.run(fresh, cwd=clones[1] / "build", check=True, capture_output=True)
    assert ((clones[1] / "build" / "unit.o").read_bytes(), (clones[1] / "build" / "unit.o.d").read_bytes()) == served
    # the second clone's header is the one its hit checked: an edit there compiles again
    (clones[1] / "include" / "common.h").write_text("#define COMMON 70\n")
    assert launch(words(clones[1]), clones[1] / "build", ABICACHE_BASE_DIR=str(tmp_path)).returncode == 0
    assert stats()["builds"] == 2


def test_a_path_through_dot_dot_is_made_relative_up_to_its_first_dot_dot(tmp_path: Path) -> None:
    """llama.cpp's CMake writes `-I<clone>/ggml/src/../include`: found by bench/fleet.py --cmake,
    whose four clones then shared nothing. The part before '..' is made relative and the '..'
    kept (resolved through whatever links it meets, as the compiler does), so clones share hits;
    a '..' that leaves the base folder keeps the path whole."""
    from abicache.launcher import paths

    clones = [project(tmp_path / name) for name in ("one", "two")]
    for clone in clones:
        (clone / "build").mkdir()
    base, cwd = str(tmp_path), str(clones[0] / "build")
    assert paths.relative([f"-I{clones[0]}/src/../include"], cwd, base) == ["-I../src/../include"]
    assert paths.relative([f"-I{clones[0]}/src/.."], cwd, base) == ["-I../src/.."]
    outside = f"-I{tmp_path}/../elsewhere"
    assert paths.relative([outside], cwd, base) == [outside]

    def words(clone: Path) -> list[str]:
        return [GXX, f"-I{clone}/src/../include", "-MD", "-MT", "unit.o", "-MF", "unit.o.d", "-o", "unit.o",
                "-c", f"{clone}/src/unit.cpp"]

    for clone in clones:
        done = launch(words(clone), clone / "build", ABICACHE_BASE_DIR=base)
        assert done.returncode == 0, done.stderr
    counts = stats()
    assert (counts["hits_local"], counts["builds"]) == (1, 1)


def test_without_a_base_folder_absolute_paths_keep_clones_apart(tmp_path: Path) -> None:
    clones = [project(tmp_path / name) for name in ("one", "two")]
    for clone in clones:
        words = [GXX, f"-I{clone}/include", "-o", str(clone / "unit.o"), "-c", str(clone / "src" / "unit.cpp")]
        assert launch(words, clone).returncode == 0
    assert stats()["builds"] == 2


def test_debug_information_holds_the_folder_unless_a_prefix_map_rewrites_it(tmp_path: Path) -> None:
    """-g writes the working directory into the object (DW_AT_comp_dir): two folders, two entries;
    with -fdebug-prefix-map of the folder to '.', one."""
    for mapped in (False, True):
        builds = stats()["builds"]
        for name in ("one", "two"):
            folder = project(tmp_path / f"{name}-{mapped}")
            more = ["-g", f"-fdebug-prefix-map={folder}=."] if mapped else ["-g"]
            words = ["g++", "-Iinclude", *more, "-o", "unit.o", "-c", "src/unit.cpp"]
            assert launch(words, folder, ABICACHE_BASE_DIR=str(tmp_path)).returncode == 0
        assert stats()["builds"] - builds == (1 if mapped else 2)


def test_what_it_cannot_cache_runs_as_written_and_is_counted_by_reason(tmp_path: Path) -> None:
    folder = project(tmp_path / "p")
    (folder / "main.cpp").write_text("int main() { return 0; }\n")
    done = launch(["g++", "main.cpp", "-o", "main"], folder)
    assert done.returncode == 0 and (folder / "main").exists()
    assert launch(["g++", "-E", "main.cpp", "-o", "main.i"], folder).returncode == 0
    counts = stats()
    assert counts["uncacheable_by_reason"] == {"link": 1, "preprocessing only (-E)": 1}
    assert counts["builds"] == 0
    assert counts["by_kind"]["cc.compile"]["uncacheable"] == 2


def test_a_store_it_cannot_use_does_not_stop_the_build(tmp_path: Path) -> None:
    folder = project(tmp_path / "p")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = launch(compile_words(folder), folder, ABICACHE_DIR=str(blocker / "store"))
    assert done.returncode == 0 and (folder / "unit.o").exists()
    assert b"compiling without the cache" in done.stderr
    assert b"Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["with space", "hash#dollar$", b"latin\xe9"])
def test_paths_are_bytes(tmp_path: Path, name: str | bytes) -> None:
    folder = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), os.fsencode(name))))
    project(folder)
    for _ in range(2):
        done = launch(compile_words(folder), folder)
        assert done.returncode == 0, done.stderr
    assert stats()["hits_local"] == 1


def test_a_make_build_cleaned_and_built_again_hits_every_compile(tmp_path: Path) -> None:
    need("make")
    folder = project(tmp_path / "p")
    for unit in ("a", "b", "c"):
        (folder / "src" / f"{unit}.cpp").write_text(f'#include "common.h"\nint {unit}() {{ return COMMON; }}\n')
    (folder / "Makefile").write_text(
        "OBJS = src/a.o src/b.o src/c.o src/unit.o\n"
        "liball.a: $(OBJS)\n\tar rcs $@ $^\n"
        "%.o: %.cpp\n\t$(CXX) -Iinclude -MMD -c $< -o $@\n"
        "clean:\n\trm -f $(OBJS) liball.a src/*.d\n"
        "-include $(OBJS:.o=.d)\n")
    cxx = f"{sys.executable} -m abicache g++"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    for _ in range(2):
        subprocess.run(["make", "-s", f"CXX={cxx}", "clean", "liball.a"], cwd=folder, env=env, check=True,
                       capture_output=True)
    counts = stats()
    assert (counts["builds"], counts["hits_local"]) == (4, 4)
    assert (folder / "src" / "a.d").read_text().split(":")[0] == "src/a.o"


NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_nvcc_compiles_are_cached_without_a_gpu(tmp_path: Path) -> None:
    folder = tmp_path / "k"
    folder.mkdir()
    (folder / "kernel.cu").write_text("__global__ void add(float *x) { x[threadIdx.x] += 1.0f; }\n")
    words = [str(NVCC), "-arch=sm_80", "-MD", "-MF", "kernel.d", "-c", "kernel.cu", "-o", "kernel.o"]
    first = launch(words, folder)
    assert first.returncode == 0, first.stderr
    made = (folder / "kernel.o").read_bytes()
    (folder / "kernel.o").unlink()
    assert launch(words, folder).returncode == 0
    assert (folder / "kernel.o").read_bytes() == made
    counts = stats()
    assert (counts["builds"], counts["hits_local"]) == (1, 1)


@pytest.fixture
def fleet_remote(request: pytest.FixtureRequest) -> str:
    import remote_fixtures

    url, _ = remote_fixtures.make_remote(request, "s3")
    return url


def test_a_fleet_building_one_project_at_once_compiles_each_unit_once(tmp_path: Path, fleet_remote: str) -> None:
    """Four machines (stores of their own, one SeaweedFS remote with leases), each a clone of the
    project at its own path under the base folder, run `make -j2` at the same moment: each unit is
    compiled once in the fleet, and every machine has the same objects."""
    need("make")
    units = [f"u{i}" for i in range(6)]
    machines = []
    for m in range(4):
        folder = project(tmp_path / f"machine{m}" / "clone")
        for unit in units:
            (folder / "src" / f"{unit}.cpp").write_text(
                f'#include "common.h"\nint {unit}() {{ volatile int x = COMMON; for (int i = 0; i < 1000; i++) '
                f'x += i; return x; }}\n')
        objects = " ".join(f"src/{u}.o" for u in units)
        (folder / "Makefile").write_text(f"all: {objects}\n%.o: %.cpp\n\t$(CXX) -Iinclude -O2 -c $< -o $@\n")
        machines.append(folder)
    env = {**os.environ, "PYTHONPATH": str(SRC), "ABICACHE_REMOTE": fleet_remote, "ABICACHE_BASE_DIR": str(tmp_path)}
    cxx = f"{sys.executable} -m abicache g++"
    procs = [subprocess.Popen(["make", "-s", "-j2", f"CXX={cxx}"], cwd=folder, stderr=subprocess.PIPE,
                              env={**env, "ABICACHE_DIR": str(folder.parent / "store"), "PWD": str(folder)})
             for folder in machines]
    for proc in procs:
        assert proc.wait(timeout=600) == 0, proc.stderr.read().decode() if proc.stderr else ""
    builds = sum(stats(ABICACHE_DIR=str(folder.parent / "store"))["builds"] for folder in machines)
    assert builds == len(units)
    for unit in units:
        assert len({(folder / "src" / f"{unit}.o").read_bytes() for folder in machines}) == 1
