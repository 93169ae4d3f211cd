"""bench/matrix's simulation as a regression test: abicache's real keys and
requirements give no unsafe reuse and no needless rebuild over the matrix's
environments, while the schemes it replaces are caught by the same harness."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def matrix():  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the torch frontends' plans need an installed torch (for its headers)")
    # Loaded by path: bench/ also holds triton.py and cuda.py, which must not shadow the real ones.
    spec = importlib.util.spec_from_file_location("abicache_bench_matrix", ROOT / "bench" / "matrix.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_abicache_reuses_nothing_unsafe_and_rebuilds_nothing_needlessly(matrix) -> None:  # type: ignore[no-untyped-def]
    tally = matrix.simulate_abicache()
    assert (tally.unsafe, tally.needless) == (0, 0), tally.examples
    assert tally.builds == matrix.minimum_builds()


def test_the_harness_catches_the_schemes_abicache_replaces(matrix) -> None:  # type: ignore[no-untyped-def]
    tallies = {s.name: matrix.simulate_scheme(s) for s in matrix.SCHEMES}
    assert all(t.unsafe > 0 for t in tallies.values()), {n: t.unsafe for n, t in tallies.items()}
    torch_ext = tallies["torch cpp_extension"]
    assert any("E4 torch patch 2.9.0" in e for e in torch_ext.examples)  # torch version not in its key


def test_amd_machines_share_code_objects_and_never_torch_builds(matrix) -> None:  # type: ignore[no-untyped-def]
    """Triton's gfx942 code object serves both MI300X machines (ROCm 6 and 7, Python 3.11 and
    3.12) from one entry; a classic op built for torch +rocm6.4 is not reused by +cu128."""
    envs = {e.label.split()[0]: e for e in matrix.ENVS}
    facts = {n: matrix.facts_for(envs[n]) for n in ("E1", "E13", "E14", "E15")}

    def key(art: str, name: str) -> str:
        kind, n, inputs, _ = matrix.abicache_plan(art, envs[name], facts[name])
        return matrix.keys.compute(kind, n, inputs.describe(facts[name]))

    hsaco = matrix.HSACO
    assert key(hsaco, "E13") == key(hsaco, "E15") != key(hsaco, "E14")
    assert matrix.requirements_of(hsaco, envs["E13"]).satisfied_by(facts["E15"])
    assert not matrix.requirements_of(hsaco, envs["E14"]).satisfied_by(facts["E13"])
    op = "classic torch op"
    assert not matrix.requirements_of(op, envs["E13"]).satisfied_by(facts["E1"])
    assert not matrix.requirements_of(op, envs["E1"]).satisfied_by(facts["E13"])
    assert not matrix.applies("cubin", envs["E13"]) and not matrix.applies(hsaco, envs["E1"])


def test_the_fidelity_rows_catch_a_depfile_cache_and_not_abicache(matrix) -> None:  # type: ignore[no-untyped-def]
    """A header created in an earlier include folder: ninja's depfiles (torch cpp_extension)
    reuse the old build; abicache's record of what was looked for and not found does not."""
    torch_ext = matrix.simulate_scheme(next(s for s in matrix.SCHEMES if s.name == "torch cpp_extension"))
    assert any(matrix.SHADOWED in e for e in torch_ext.examples), torch_ext.examples
    ours = matrix.simulate_abicache()
    assert not any(a in e for e in ours.examples for a in (matrix.SHADOWED, matrix.WORDS))


def test_a_machine_without_a_gpu_shares_the_cuda_extension_and_another_gpu_never_gets_it(matrix) -> None:  # type: ignore[no-untyped-def]
    """The CUDA torch extension built on an H100 for arch list 9.0 (E1) is the build farm's (E16,
    no GPU: one key, its requirements hold) and never an A100's given the same arch list (E17:
    one key, gpu.arch ~= sm_90 fails); the schemes that key on folders reuse it there."""
    envs = {e.label.split()[0]: e for e in matrix.ENVS}
    facts = {n: matrix.facts_for(envs[n]) for n in ("E1", "E16", "E17")}
    ext = matrix.CUDA_EXT

    def key(name: str) -> str:
        kind, n, inputs, _ = matrix.abicache_plan(ext, envs[name], facts[name])
        return matrix.keys.compute(kind, n, inputs.describe(facts[name]))

    assert key("E1") == key("E16") == key("E17")
    built = matrix.requirements_of(ext, envs["E1"])
    assert "gpu.arch ~= sm_90" in str(built)
    assert built.satisfied_by(facts["E16"]) and not built.satisfied_by(facts["E17"])
    ours = matrix.simulate_abicache()
    assert not any(ext in e for e in ours.examples), ours.examples
    torch_ext = matrix.simulate_scheme(next(s for s in matrix.SCHEMES if s.name == "torch cpp_extension"))
    assert any(e.startswith(f"{ext}: ") and e.endswith("-> E17 A100, arch list 9.0") for e in torch_ext.examples)
