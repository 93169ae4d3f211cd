"""abicache.torch.compile_cache: torch.compile's caches (torch.compiler.save_cache_artifacts)
as abicache entries, with the real torch CPU wheel and Inductor's CPU backend. Each
process gets its own TORCHINDUCTOR_CACHE_DIR: a new machine, as far as torch knows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_py
from corpus import torch_root

pytestmark = pytest.mark.usefixtures("_torch")


@pytest.fixture(scope="module")
def _torch() -> None:
    torch_root()  # skips, saying why, where torch is not installed

# Compiles (or warm-starts) one function; prints torch's own cache counters and the result.
PROGRAM = """
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
from abicache import Cache
from abicache.torch import compile_cache
cache = Cache(sys.argv[1], remote=False)
mode, key = sys.argv[2], sys.argv[3]

def g(x, y):
    return (torch.sin(x) * y + torch.cos(y)).relu().sum(dim=-1)

out = {}
if mode == "load":
    got = compile_cache.load(key, cache=cache)
    out["loaded"], out["reason"] = got.loaded, got.reason
    if not got.loaded:
        print(json.dumps(out)); raise SystemExit
x = torch.arange(12.0).reshape(3, 4)
out["value"] = torch.compile(g)(x, x / 7).tolist()
from torch._dynamo.utils import counters
out["fxgraph_hits"] = counters["inductor"]["fxgraph_cache_hit"]
out["aot_hits"] = counters["aot_autograd"]["autograd_cache_hit"]
if mode == "save":
    art = compile_cache.save(key, cache=cache)
    out["saved"] = art.name
    other = cache.for_target({"torch.build": "2.12.0+cpu/git-0000000/cuda-none"})  # what another torch wrote
    out["saved_other"] = compile_cache.save(key + "-other-torch", cache=other).name
print(json.dumps(out))
"""


def _run(tmp_path: Path, tag: str, *argv: str) -> dict:
    done = run_py(PROGRAM.replace("sys.argv[1]", repr(str(tmp_path / "store")))
                  .replace("sys.argv[2]", repr(argv[0])).replace("sys.argv[3]", repr(argv[1])),
                  env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{tag}"), "ABICACHE_PROGRESS": "0"},
                  timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_process_warm_starts_from_the_saved_entry(tmp_path: Path) -> None:
    cold = _run(tmp_path, "a", "save", "tiny-model-v1")
    assert cold["saved"] == "tiny-model-v1" and (cold["fxgraph_hits"], cold["aot_hits"]) == (0, 0)
    warm = _run(tmp_path, "b", "load", "tiny-model-v1")
    assert warm["loaded"], warm
    assert warm["fxgraph_hits"] == 1 and warm["aot_hits"] == 1  # torch compiled nothing it had saved
    assert warm["value"] == cold["value"]
    other = _run(tmp_path, "c", "load", "tiny-model-v1-other-torch")
    assert not other["loaded"]
    assert "torch.build" in other["reason"] and "2.12.0+cpu" in other["reason"], other["reason"]
    missing = _run(tmp_path, "d", "load", "never-saved")
    assert not missing["loaded"] and "no entry" in missing["reason"]
