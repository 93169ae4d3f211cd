"""torch.compile's caches as abicache entries.

torch keeps what a compile produced (Inductor's FX graphs, AOTAutograd
graphs, Triton kernels) in per-machine folders. `torch.compiler.
save_cache_artifacts()` packs them into bytes and `load_cache_artifacts()`
unpacks them into this process's caches, unchecked: bytes from another torch
build are loaded as if they were its own. Here those bytes are an abicache
entry (kind "torch.compile"), shared and signed through the remote tier like
any other:

    from abicache.torch import compile_cache

    with compile_cache.session("llama-7b-v3"):   # load before compiling, save after
        model = torch.compile(model)
        model(example)

or compile_cache.load(key) before the first compiled call and
compile_cache.save(key) after warm-up (a CI job, the first node of a fleet).

The key is the user's key, the device (CUDA capability, or "cpu:" and the
vector ISA torch uses, e.g. cpu:AVX512) and
Triton's version; the exact torch build is a requirement, so an entry that
another torch build saved is found, refused, and the reason said. Entries
are immutable, as every abicache entry: a second save under a key that holds
one keeps the first (put the model's version in the key).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..core.cache import Artifact, Cache, default_cache
from ..errors import AbicacheWarning, ManifestError
from ..core.key import Inputs
from ..values.records import named_tuple
from ..values.requirements import Requirements

KIND = "torch.compile"
FILE = "artifacts.bin"


@named_tuple
class Loaded:
    loaded: bool
    reason: str  # why not, when not loaded
    artifact: Artifact | None = None
    info: Any = None  # torch's CacheInfo for what was loaded


def save(key: str, *, device: str | None = None, cache: Cache | None = None) -> Artifact | None:
    """Store what this process compiled (None if torch has nothing to save)."""
    import torch

    got = torch.compiler.save_cache_artifacts()
    if got is None:
        return None
    data = bytes(got[0])
    cache = cache or default_cache()

    def build(out: Path) -> None:
        (out / FILE).write_bytes(data)

    return cache.get_or_build(KIND, key, _inputs(key, device), build, requires=_requires(cache))


def load(key: str, *, device: str | None = None, cache: Cache | None = None) -> Loaded:
    """Load the entry for key into torch's caches, before anything is compiled."""
    cache = cache or default_cache()
    inputs = _inputs(key, device)
    found = cache.lookup(KIND, key, inputs)
    if found is None:
        reason = _why_not(cache, key, inputs)
        if reason:
            warnings.warn(f"abicache: torch.compile cache {key!r} not loaded: {reason}", AbicacheWarning,
                          stacklevel=2)
        return Loaded(False, reason or "no entry for this key, device and Triton version")
    import torch

    info = torch.compiler.load_cache_artifacts(found.file(FILE).read_bytes())
    return Loaded(True, "", found, info)


@contextmanager
def session(key: str, *, device: str | None = None, cache: Cache | None = None) -> Iterator[Loaded]:
    """load() on entry; save() on a clean exit when nothing was loaded."""
    loaded = load(key, device=device, cache=cache)
    yield loaded
    if not loaded.loaded:
        save(key, device=device, cache=cache)


def _inputs(key: str, device: str | None) -> Inputs:
    return Inputs.make(extra={"key": key, "device": device or _device(), "triton": _triton() or "none"})


def _requires(cache: Cache) -> Requirements:
    build = cache.facts.get("torch.build")
    return Requirements.of([f"torch.build == {build}"] if build else [])


def _device() -> str:
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{'rocm' if torch.version.hip else 'cuda'}:{major}.{minor}"
    # Inductor's CPU code is vectorized for the ISA it finds: AVX-512 graphs are misses on AVX2
    return f"cpu:{torch.backends.cpu.get_cpu_capability()}"


def _triton() -> str | None:
    from importlib import metadata

    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _why_not(cache: Cache, key: str, inputs: Inputs) -> str:
    """Why the entries under this key (if any) cannot load here, in their own words."""
    digest, _ = cache.key_for(KIND, key, inputs)
    reasons = []
    for vdir in cache.store.variant_dirs(KIND, digest):
        try:
            manifest = cache.store.read_manifest(vdir)
        except (OSError, ManifestError):
            continue
        unmet = manifest.requirements.unmet(cache.facts)
        if unmet:
            reasons.append("; ".join(str(u) for u in unmet))
    return " | ".join(sorted(set(reasons)))
