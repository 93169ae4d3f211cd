"""Which variant of a GPU kernel a machine takes, from real nvcc output: CUDA's rules for every
visible device, and exact machine code preferred over family code over PTX.

One kernel, one key, five variants (as a kernel library ships a build per arch): cubins for
sm_80, sm_90, sm_90a and sm_100f, and compute_80 PTX, each compiled here by nvcc; their
requirements are what the audit reads from the binaries. Device sets are given as facts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from abicache import Cache, cuda
from abicache.env import Facts, probes

KERNEL = ('extern "C" __global__ void scale(float* x, float a, int n) '
          "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }")
VARIANTS = {"sm_80": "cubin", "sm_90": "cubin", "sm_90a": "cubin", "sm_100f": "cubin", "compute_80": "ptx"}
INPUTS = {"sources": {"scale.cu": KERNEL}, "extra": {"per-arch builds": "1"}}
# device set -> the variant CUDA's rules and the preference give, or None (nothing runs there)
EXPECTED = [
    ("sm_90", "sm_90a"),  # exact machine code; the arch-specific build before the plain one
    ("sm_80", "sm_80"),
    ("sm_86", "sm_80"),  # sm_80 machine code runs on 8.6; PTX would be JIT-compiled
    ("sm_100", "sm_100f"),  # the family build; sm_90a never runs on 10.0
    ("sm_103", "sm_100f"),
    ("sm_90,sm_80", "compute_80"),  # one variant must serve both devices: only the PTX does
    ("sm_120", "compute_80"),  # no machine code for 12.0: the PTX, JIT-compiled by a new enough driver
    ("sm_75", None),  # older than every build
    ("gfx942", None),  # NVIDIA code never runs on an AMD device
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each arch built by a job of its own (one store each, as a CI matrix), then bundled
    into one store: five variants of one key."""
    from abicache.shipping.bundle import write_store

    if probes.nvcc_path() is None:
        pytest.skip("nvcc is not installed (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    root = tmp_path_factory.mktemp("arch-fit")
    chosen = []
    for arch, output in VARIANTS.items():
        device = {"gpu.arch": "sm_" + arch.split("_")[1].rstrip("af"), "cuda.driver": "13.0"}
        made = cuda.compile(KERNEL, arch=arch, output=output, compiler="nvcc",
                            cache=Cache(root / "compile").for_target(device))
        data, filename = made.data, f"scale.{output}"
        job = Cache(root / f"job-{arch}").for_target(device)
        art = job.get_or_build("gpu.kernel", "scale", INPUTS, lambda out: (out / filename).write_bytes(data))
        assert art.origin == "built", (arch, art.requirements)
        chosen.append((art.path, art.manifest))
    write_store(chosen, root / "shipped")
    return root / "shipped"


def _chosen(store: Path, devices: str, tmp_path: Path | None = None) -> str | None:
    """The gpu.arch of the variant a lookup takes, from the store itself or (tmp_path given)
    from a fresh local store that has it as a read-only store."""
    facts = Facts().with_overrides({"gpu.arch": devices, "cuda.driver": "13.0"})
    cache = Cache(store if tmp_path is None else tmp_path / "local", facts=facts)
    art = cache.lookup("gpu.kernel", "scale", INPUTS)
    if art is None:
        return None
    (gpu,) = [r for r in art.requirements if r.name == "gpu.arch"]
    return gpu.value


@pytest.mark.parametrize(("devices", "expected"), EXPECTED)
def test_the_variant_chosen_for_each_device_set_follows_cudas_rules(store: Path, devices: str,
                                                                    expected: str | None) -> None:
    keys = {p.name.partition(".")[0] for p in store.glob("v3/entries/gpu.kernel/*/*.*")}
    assert len(keys) == 1 and len(list(store.glob("v3/entries/gpu.kernel/*/*.*"))) == len(VARIANTS)
    assert _chosen(store, devices) == expected


@pytest.mark.parametrize(("devices", "expected"), EXPECTED)
def test_a_read_only_store_chooses_as_the_local_one_does(store: Path, devices: str, expected: str | None,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from abicache.shipping import tiers

    monkeypatch.setenv("ABICACHE_READ_STORES", str(store))
    tiers.forget()
    assert _chosen(store, devices, tmp_path) == expected


def test_an_arch_specific_build_is_never_chosen_for_another_arch(store: Path) -> None:
    for devices in ("sm_100", "sm_103", "sm_120", "sm_89", "sm_90,sm_100"):
        assert _chosen(store, devices) != "sm_90a"
