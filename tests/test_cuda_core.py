"""cuda.core's program cache hook (abicache.cuda.program_cache): compile-only, real NVRTC, no GPU needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hostile
from abicache import Cache
from abicache.env import Facts
from abicache.cli.program import main
from conftest import SRC

pytest.importorskip("cuda.core.utils", reason="cuda-core is not installed (pip install 'cuda-core>=1.2' cuda-bindings)")

KERNEL = 'extern "C" __global__ void scale(float* a, float s) { a[threadIdx.x] *= s; }'
COMPILE = textwrap.dedent("""
    import json, sys
    from cuda.core import Program, ProgramOptions
    from abicache import Cache
    from abicache.cuda.program_cache import ProgramCache
    cache = ProgramCache(Cache(sys.argv[1]), target={"gpu.arch": sys.argv[2]})
    obj = Program(sys.argv[3], "c++", ProgramOptions(arch=sys.argv[2])).compile("cubin", cache=cache)
    code = obj.code if isinstance(obj.code, bytes) else open(obj.code, "rb").read()
    print(json.dumps({"size": len(code), "elf": code[:4] == b"\\x7fELF", "entries": len(cache)}))
""")


def _compile(root: Path, arch: str = "sm_90", source: str = KERNEL) -> dict:
    done = subprocess.run([sys.executable, "-c", COMPILE, str(root), arch, source], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=300)
    if done.returncode != 0 and "nvrtc" in done.stderr.lower() and "not found" in done.stderr.lower():
        pytest.skip(f"NVRTC is not found by cuda.core here: {done.stderr.strip().splitlines()[-1][:200]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _counts(root: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["stats", "--json", "--root", str(root)]) == 0
    return json.loads(capsys.readouterr().out)["counts"]


def test_compile_builds_once_and_hits_in_a_fresh_process(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = _compile(root)
    assert first["elf"] and first["entries"] == 1
    again = _compile(root)
    assert again == first
    counts = _counts(root, capsys)
    assert counts["builds"] == 1 and counts["hits_local"] == 1, counts
    (art,) = [m for m in _manifests(root)]
    assert "gpu.arch ~= sm_90" in art["requirements"], art["requirements"]


def test_a_cubin_is_not_returned_where_it_cannot_load_nor_after_a_changed_byte(root: Path) -> None:
    from cuda.core.utils import make_program_cache_key

    from abicache.cuda.program_cache import ProgramCache

    _compile(root)
    (cubin,) = root.glob("v3/entries/cuda_core.program/*/*/program.cubin")
    sm90 = ProgramCache(Cache(root), target={"gpu.arch": "sm_90"})
    sm80 = ProgramCache(Cache(root), target={"gpu.arch": "sm_80"})
    from cuda.core import ProgramOptions

    wanted = make_program_cache_key(code=KERNEL, code_type="c++", options=ProgramOptions(arch="sm_90"),
                                    target_type="cubin")
    assert sm90.get(wanted) == cubin.read_bytes() and sm80.get(wanted) is None
    data = bytearray(cubin.read_bytes())
    data[-1] ^= 1
    cubin.chmod(0o644)
    cubin.write_bytes(bytes(data))
    with pytest.warns(Warning, match="quarantined"):
        assert ProgramCache(Cache(root), target={"gpu.arch": "sm_90"}).get(wanted) is None
    with pytest.raises(KeyError):
        sm90[wanted]


def test_mapping_operations_and_a_program_that_cannot_load_here(root: Path) -> None:
    from abicache.cuda.program_cache import ProgramCache
    from abicache.errors import AbicacheWarning

    cache = ProgramCache(Cache(root), target={"gpu.arch": "sm_90"})
    _compile(root)
    _compile(root, source=KERNEL.replace("*=", "+="))
    assert len(cache) == 2
    cache["k"] = b"plain bytes, no GPU code"
    assert cache["k"] == b"plain bytes, no GPU code" and cache.get(b"k") == cache["k"] and len(cache) == 3
    del cache["k"]
    assert cache.get("k") is None and len(cache) == 2
    with pytest.raises(KeyError):
        del cache["k"]
    cache.clear()
    assert len(cache) == 0
    elf = _any_cubin(root)  # sm_90
    # an A100 (no target: judged against the machine's facts) cannot run it: not kept, with the way out
    a100 = ProgramCache(Cache(root, facts=Facts().with_overrides({"gpu.arch": "sm_80"})))
    with pytest.warns(AbicacheWarning, match="target="):
        a100["x"] = elf
    assert a100.get("x") is None
    # a machine without a GPU (a build machine) runs no GPU code: it keeps and finds what it compiles
    no_gpu = ProgramCache(Cache(root, facts=Facts().with_overrides({"gpu.arch": "none"})))
    no_gpu["x"] = elf
    assert no_gpu.get("x") == elf and a100.get("x") is None


def _any_cubin(root: Path) -> bytes:
    _compile(root)
    for path in root.rglob("program.cubin"):
        return path.read_bytes()
    raise AssertionError("no cubin was cached")


def _manifests(root: Path) -> list[dict]:
    return [hostile.manifest_doc(p) for p in root.glob("v3/entries/cuda_core.program/*/*.*") if p.is_dir()]
