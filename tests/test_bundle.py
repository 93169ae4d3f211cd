"""`abicache bundle`: named entries as a store folder or a wheel, loaded elsewhere with zero compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from abicache import Cache, cc
from abicache.shipping.bundle import platform_tag
from abicache.cli.program import main
from abicache.values.requirements import Requirements
from conftest import SRC, need, writer
import shared_builds

ADD = 'extern "C" int add(int a, int b) { return a + b; }'
TWICE = textwrap.dedent(r"""
    #include <Python.h>
    static PyObject* twice(PyObject* self, PyObject* arg) { return PyLong_FromLong(2 * PyLong_AsLong(arg)); }
    static PyMethodDef methods[] = {{"twice", twice, METH_O, ""}, {NULL, NULL, 0, NULL}};
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "twice", NULL, -1, methods};
    PyMODINIT_FUNC PyInit_twice(void) { return PyModule_Create(&def); }
""")
USE = textwrap.dedent(f"""
    import json, sys
    from abicache import Cache, cc
    cache = Cache(sys.argv[1])
    lib = cc.build_library("adder", [{ADD!r}], cache=cache)
    mod = cc.build_module("twice", [{TWICE!r}], lang="c", cache=cache)
    print(json.dumps({{"origins": [lib.origin, mod.origin], "value": cc.load_module("twice", [{TWICE!r}],
                      lang="c", cache=cache).twice(21)}}))
""")


@pytest.fixture
def built(root: Path) -> Path:
    need("c++")
    need("cc")
    cache = Cache(root)
    cc.build_library("adder", [ADD], cache=cache)
    cc.build_module("twice", [TWICE], lang="c", cache=cache)
    return root


def _no_compiler(tmp_path: Path, **env: str) -> dict[str, str]:
    bare = tmp_path / "bare-bin"
    bare.mkdir(exist_ok=True)
    if not (bare / "python3").exists():
        os.symlink(sys.executable, bare / "python3")
    return {**os.environ, "PYTHONPATH": str(SRC), "PATH": str(bare), "CC": "", "CXX": "", **env}


def test_a_bundled_store_folder_serves_a_machine_without_a_compiler(built: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "shipped"
    assert main(["bundle", "--out", str(out), "--root", str(built), "--json", "adder", "twice"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(e["name"] for e in doc["entries"]) == ["adder", "twice"] and doc["tag"] is None
    assert not list(out.rglob("*.o")) and not (out / "v3" / "entries" / "cc.object").exists()  # only what was named
    used = subprocess.run([sys.executable, "-c", USE, str(tmp_path / "fresh")], capture_output=True, text=True,
                          env=_no_compiler(tmp_path, ABICACHE_READ_STORES=str(out)), timeout=120)
    assert used.returncode == 0, used.stderr[-2000:]
    assert json.loads(used.stdout) == {"origins": ["tier", "tier"], "value": 42}
    assert main(["bundle", "--out", str(out), "--root", str(built), "adder"]) == 2  # never over a folder
    assert main(["bundle", "--out", str(tmp_path / "x"), "--root", str(built), "nosuch"]) == 2
    assert "nothing named nosuch" in capsys.readouterr().err


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask-022", "umask-002"])
def test_a_bundle_wheel_installs_and_registers_its_store(built: Path, tmp_path: Path, umask: int) -> None:
    """pip install the wheel (no compiler, no setting): its entry point names the store. Under
    umask 002 (the default where each user has a private group) pip leaves the store
    group-writable: it was refused whole, so ABICACHE_BUILD=never failed."""
    from packaging.tags import sys_tags

    dist = tmp_path / "dist"
    assert main(["bundle", "--wheel", "mylib-kernels==1.0", "--out", str(dist), "--root", str(built),
                 "adder", "twice"]) == 0
    (wheel,) = dist.glob("*.whl")
    tag = wheel.name.rsplit("-", 1)[1].removesuffix(".whl")
    assert wheel.name.startswith("mylib_kernels-1.0-py3-none-") and tag.endswith(os.uname().machine)
    assert f"py3-none-{tag}" in {str(t) for t in sys_tags()}  # pip installs it here
    with zipfile.ZipFile(wheel) as z:
        assert "[abicache.stores]" in z.read("mylib_kernels-1.0.dist-info/entry_points.txt").decode()
    venv = tmp_path / "venv"
    old = os.umask(umask)  # pip makes the venv's files as the umask says
    try:
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300)
        assert made.returncode == 0, made.stderr
        python = str(venv / "bin" / "python")
        installed = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                                   capture_output=True, text=True, timeout=300)
    finally:
        os.umask(old)
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = _no_compiler(tmp_path, ABICACHE_BUILD="never")
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{os.pathsep.join(p for p in sys.path if p.endswith('site-packages'))}"
    used = subprocess.run([python, "-c", USE, str(tmp_path / "fresh")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert used.returncode == 0, used.stderr[-2000:]
    assert json.loads(used.stdout) == {"origins": ["tier", "tier"], "value": 42}


def test_a_damaged_entry_is_not_bundled(built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (lib,) = [p for p in built.rglob("libadder.so")]
    lib.chmod(0o644)
    lib.write_bytes(lib.read_bytes()[:-1] + b"\0")
    assert main(["bundle", "--out", str(tmp_path / "shipped"), "--root", str(built), "adder"]) == 2
    assert "damaged" in capsys.readouterr().err and not (tmp_path / "shipped").exists()


@pytest.mark.parametrize(("requirements", "tag"), [
    ([["platform.machine == x86_64"]], "manylinux_2_17_x86_64"),
    ([["platform.machine == x86_64", "platform.glibc >= 2.34"], ["platform.machine == x86_64",
                                                                  "platform.glibc >= 2.28"]],
     "manylinux_2_34_x86_64"),
    ([["gpu.arch ~= sm_90"]], "any"),
])
def test_the_wheels_platform_tag_is_read_from_the_requirements(requirements: list[list[str]], tag: str) -> None:
    assert platform_tag(SimpleNamespace(requirements=Requirements.of(r)) for r in requirements) == tag


def test_entries_for_two_machines_need_two_wheels() -> None:
    from abicache.errors import UsageError

    with pytest.raises(UsageError, match="one wheel per machine"):
        platform_tag(SimpleNamespace(requirements=Requirements.of([f"platform.machine == {m}"]))
                     for m in ("x86_64", "aarch64"))


def test_the_last_job_of_a_matrix_bundles_every_jobs_variants(tmp_path: Path) -> None:
    """Each job of a CI matrix bundles what it built (a store folder, its artifact); the last one
    bundles them all (--from) into one wheel's store: one variant per GPU arch here, each job's own."""
    from abicache.shipping.bundle import select, write_store
    from abicache.env import Facts
    from abicache.shipping.tiers import Tier

    jobs = []
    for arch in ("sm_80", "sm_90"):
        cache = Cache(tmp_path / f"job-{arch}", facts=Facts().with_overrides({"gpu.arch": arch}))
        art = cache.get_or_build("t", "kern", {"flags": ["-O3"]}, lambda out, a=arch: (out / "k.bin").write_text(a),
                                 [f"gpu.arch ~= {arch}"])
        shipped = tmp_path / f"artifact-{arch}"
        assert main(["bundle", "--out", str(shipped), "--root", str(cache.root), "kern"]) == 0
        for path in shipped.rglob("*"):  # as a CI artifact comes back: every mode 0644 / 0755
            path.chmod(0o755 if path.is_dir() else 0o644)
        jobs.append((art, shipped))
    assert jobs[0][0].key == jobs[1][0].key and jobs[0][0].variant != jobs[1][0].variant
    final = Cache(tmp_path / "final")
    chosen = select(final.store, ["kern"], None, [shipped for _, shipped in jobs])
    assert sorted(m.variant for _, m in chosen) == sorted(a.variant for a, _ in jobs)
    write_store(chosen, tmp_path / "all")
    tier = Tier(tmp_path / "all", "test")
    tier.store.ensure()
    for arch in ("sm_80", "sm_90"):
        here = Cache(tmp_path / "user", facts=Facts().with_overrides({"gpu.arch": arch}))
        vdir, manifest = tier.find("t", "kern", jobs[0][0].key, jobs[0][0].manifest.inputs, here.usable, {})
        assert (vdir / "k.bin").read_text() == arch


def test_without_a_compiler_a_missing_variant_is_named_with_what_it_needs(built: Path, tmp_path: Path) -> None:
    """A user whose Python no shipped variant serves, and no compiler: the error names the
    variants there are and what each needs that this environment lacks."""
    out = tmp_path / "shipped"
    assert main(["bundle", "--out", str(out), "--root", str(built), "twice"]) == 0
    code = textwrap.dedent(f"""
        from abicache import Cache, cc
        from abicache.env import Facts
        cache = Cache({str(tmp_path / 'fresh')!r}, facts=Facts().with_overrides({{"python.abi": "cp399"}}))
        cc.build_module("twice", [{TWICE!r}], lang="c", cache=cache)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_no_compiler(tmp_path, ABICACHE_READ_STORES=str(out)), timeout=120)
    assert done.returncode == 1
    assert "No prebuilt cc.module 'twice' fits this environment" in done.stderr, done.stderr[-2000:]
    assert f"{out}: variant " in done.stderr and "needs python.abi == cp3" in done.stderr


def test_bundle_check_says_which_variant_loads_in_each_target_environment(
        built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    abi = Cache(built).facts.get("python.abi")
    assert main(["bundle", "--check", "--json", "--root", str(built), "--env", f"python.abi={abi}",
                 "--env", "python.abi=cp399,platform.machine=riscv64", "adder", "twice"]) == 1
    verdicts = {(v["environment"], v["name"]): v for v in json.loads(capsys.readouterr().out)}
    assert verdicts[(f"python.abi={abi}", "twice")]["variant"] and verdicts[(f"python.abi={abi}", "adder")]["variant"]
    odd = verdicts[("python.abi=cp399,platform.machine=riscv64", "twice")]
    assert odd["variant"] is None and "python.abi == " in odd["needs"] and "platform.machine" in odd["needs"]
    assert main(["bundle", "--check", "--root", str(built), "adder"]) == 0  # here: it loads
    assert "loads variant" in capsys.readouterr().out
    assert main(["bundle", "--root", str(built), "adder"]) == 2  # neither --out nor --check


def test_a_signed_bundle_loads_where_signatures_are_required_and_an_unsigned_one_does_not(
        built: Path, tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from abicache.remote import keys

    key = tmp_path / "release.pem"
    keys.write_pair(key)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    for name, extra in (("signed", {"ABICACHE_SIGNING_KEY": str(key)}), ("unsigned", {})):
        done = subprocess.run([sys.executable, "-m", "abicache", "bundle", "--out", str(tmp_path / name),
                               "--root", str(built), "adder", "twice"], capture_output=True, text=True,
                              env={**env, **extra}, timeout=120)
        assert done.returncode == 0, done.stderr
    trusted = {"ABICACHE_TRUSTED_KEYS": f"{key}.pub"}
    signed = subprocess.run([sys.executable, "-c", USE, str(tmp_path / "fresh")], capture_output=True, text=True,
                            env=_no_compiler(tmp_path, ABICACHE_READ_STORES=str(tmp_path / "signed"), **trusted),
                            timeout=120)
    assert signed.returncode == 0 and json.loads(signed.stdout)["origins"] == ["tier", "tier"], signed.stderr
    unsigned = subprocess.run([sys.executable, "-c", USE, str(tmp_path / "fresh2")], capture_output=True,
                              text=True, timeout=120,
                              env=_no_compiler(tmp_path, ABICACHE_READ_STORES=str(tmp_path / "unsigned"), **trusted))
    assert unsigned.returncode != 0 and "unsigned" in unsigned.stderr, unsigned.stderr[-2000:]


def test_abicache_build_never_and_always(built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """never: a miss no store serves is an error naming every variant and what it lacks, and
    this environment, with nothing compiled (counted); always: the read-only stores are
    skipped and it builds here; a bad value is flagged by `abicache env`."""
    from abicache.env import Facts
    from abicache.errors import BuildForbiddenError

    out = tmp_path / "shipped"
    assert main(["bundle", "--out", str(out), "--root", str(built), "twice"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("ABICACHE_READ_STORES", str(out))
    monkeypatch.setenv("ABICACHE_BUILD", "never")
    fresh = tmp_path / "fresh"
    assert cc.build_module("twice", [TWICE], lang="c", cache=Cache(fresh)).origin == "tier"
    elsewhere = Cache(fresh, facts=Facts().with_overrides({"python.abi": "cp399"}))
    with pytest.raises(BuildForbiddenError) as refused:
        cc.build_module("twice", [TWICE], lang="c", cache=elsewhere)
    text = str(refused.value)
    assert "ABICACHE_BUILD=never forbids building" in text and "python.abi=cp399" in text, text
    assert f"{out}: variant " in text and "needs python.abi == cp3" in text
    assert main(["stats", "--json", "--root", str(fresh)]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts["builds"] == 0 and counts["errors"] == 1, counts
    assert main(["demo", "--root", str(tmp_path / "demo")]) == 2  # the CLI: exit 2
    assert "ABICACHE_BUILD=never" in capsys.readouterr().err
    monkeypatch.setenv("ABICACHE_BUILD", "always")
    assert cc.build_module("twice", [TWICE], lang="c", cache=Cache(tmp_path / "fresh2")).origin == "built"
    monkeypatch.setenv("ABICACHE_BUILD", "sometimes")
    assert main(["env", "--json"]) == 1
    assert "ABICACHE_BUILD" in json.loads(capsys.readouterr().out)["problems"]


@pytest.mark.parametrize(("requirements", "tags", "torch"), [
    ([["platform.machine == x86_64"]], ("py3", "none"), None),
    ([["python.abi == cp311"]], ("cp311", "cp311"), None),
    ([["python.abi == cp311"], ["python.abi == cp312"]], ("cp311.cp312", "cp311.cp312"), None),
    ([["python.abi3 >= 3.10"], ["python.abi3 >= 3.12"]], ("cp310", "abi3"), None),
    ([["python.abi == cp311"], ["platform.machine == x86_64"]], ("py3", "none"), None),  # a C library rides along
    ([["python.abi == cp311", "torch.build == 2.13.0+cpu/git=abc/cuda=none/hip=none/cxx11abi=1"],
      ["python.abi == cp311", "torch.build == 2.12.1+cu128/git=def/cuda=12.8/hip=none/cxx11abi=1"]],
     ("cp311", "cp311"), "torch>=2.12,<2.14"),
    ([["torch.version >= 2.9"], ["torch.version >= 2.10"]], ("py3", "none"), "torch>=2.9"),
])
def test_the_wheels_python_tags_and_torch_pin_come_from_the_variants(
        requirements: list[list[str]], tags: tuple[str, str], torch: str | None) -> None:
    from abicache.shipping.bundle import python_tags, torch_requirement

    manifests = [SimpleNamespace(requirements=Requirements.of(r)) for r in requirements]
    assert python_tags(manifests) == tags and torch_requirement(manifests) == torch


def test_pip_check_pairs_the_wheel_only_with_a_torch_it_can_load(tmp_path: Path,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """Requires-Dist pins the torch the classic variant was built for: `pip check` is clean
    where that torch is installed and names it where it is not."""
    root = shared_builds.torch_extension_store(tmp_path_factory, tmp_path / "store")
    dist = tmp_path / "dist"
    assert main(["bundle", "--wheel", "pinned-kernels==1.0", "--out", str(dist), "--root", str(root),
                 shared_builds.ADD_EXT]) == 0
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read("pinned_kernels-1.0.dist-info/METADATA").decode()
    import torch

    major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    here = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert f"Requires-Dist: torch>={major}.{minor},<{major}.{minor + 1}" in metadata, metadata
    assert wheel.name.split("-")[2:4] == [here, here]
    results = {}
    for name, system in (("with-torch", True), ("without", False)):
        venv = tmp_path / name
        subprocess.run([sys.executable, "-m", "venv", *(["--system-site-packages"] if system else []), str(venv)],
                       check=True, capture_output=True, timeout=300)
        python = str(venv / "bin" / "python")
        installed = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                                   capture_output=True, text=True, timeout=300)
        assert installed.returncode == 0, installed.stderr[-1500:]
        checked = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
        results[name] = [line for line in checked.stdout.splitlines() if line.startswith("pinned-kernels")]
    assert not any("torch" in line for line in results["with-torch"]), results
    assert any("requires torch, which is not installed" in line for line in results["without"]), results


def test_bundle_check_of_another_torch_version_does_not_take_this_torchs_build(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--env torch.version=2.14.0 says another torch install: its torch.build is not this
    one's, so an extension tied to this torch's build does not "load" there (it did)."""
    cache = Cache(tmp_path / "s")
    build = cache.facts.get("torch.build")
    if build is None:
        pytest.skip("torch is not installed here")
    cache.get_or_build("t", "ext", {}, writer({"ext.so": b"x"}), requires=[f"torch.build == {build}"])
    version = cache.facts.get("torch.version")
    assert main(["bundle", "--check", "--json", "--root", str(tmp_path / "s"), "--env", "torch.version=2.14.0",
                 "--env", f"torch.version={version},torch.build={build}", "ext"]) == 1
    verdicts = {v["environment"]: v for v in json.loads(capsys.readouterr().out)}
    assert verdicts["torch.version=2.14.0"]["variant"] is None, verdicts
    assert f"torch.build == {build}" in verdicts["torch.version=2.14.0"]["needs"]
    assert verdicts[f"torch.version={version},torch.build={build}"]["variant"]


def test_build_always_without_a_compiler_says_the_shipped_variant_fits(built: Path, tmp_path: Path) -> None:
    """ABICACHE_BUILD=always and no compiler: the shipped variant of these very inputs was
    said to be "built from other inputs"; it fits, and the setting is why it was not loaded."""
    out = tmp_path / "shipped"
    assert main(["bundle", "--out", str(out), "--root", str(built), "twice"]) == 0
    code = f"from abicache import Cache, cc\ncc.build_module('twice', [{TWICE!r}], lang='c', " \
           f"cache=Cache({str(tmp_path / 'fresh')!r}))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_no_compiler(tmp_path, ABICACHE_READ_STORES=str(out), ABICACHE_BUILD="always"))
    assert done.returncode == 1
    assert "fits here, of these very inputs: ABICACHE_BUILD=always builds anyway" in done.stderr, done.stderr[-2000:]
    assert "built from other inputs" not in done.stderr
