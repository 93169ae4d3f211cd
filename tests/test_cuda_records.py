"""Hit records of GPU code (hits/cuda_witness.py): a call whose entry requires GPU facts, or
whose key read them, is served by its record in a later process while what those facts
stand on holds (the driver's remembered answer and its premise; no driver at all; the CUDA
runtime loaded), and goes the full way once it moves. Without a GPU here, the driver is a
real stand-in library built by the test, and the kernel module's /proc files are a folder
the child points env/cuda_premise.py at (as tests/test_env.py does)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import need, run_py
from test_env import FAKE_DRIVER, fake_proc

#: a C library that links the driver: the audit requires cuda.driver >= 1.0 of it
DRIVER_USER = 'extern "C" int cuDriverGetVersion(int*);\nextern "C" int driver() { int v = 0; cuDriverGetVersion(&v); return v; }'
CALL = """
import json, os
from pathlib import Path
from abicache.env import cuda_premise
proc = Path(os.environ["FAKE_PROC"])
cuda_premise.BOOT_ID, cuda_premise.MODULE = str(proc / "boot_id"), str(proc / "version")
cuda_premise.GPUS, cuda_premise.DEV, cuda_premise.LD_CACHE = str(proc / "gpus"), str(proc / "dev"), str(proc / "ld.so.cache")
from abicache import cc
lib = cc.load_library("driver_user", [{src!r}], ldflags=["-L" + os.environ["DRIVER_DIR"], "-l:libcuda.so.1"])
held = next(iter(cc._loaded.values()))[0]
print(json.dumps({{"served": type(held).__name__ == "Served", "value": lib.driver()}}))
"""


@pytest.fixture()
def stand_in(tmp_path: Path) -> dict[str, str]:
    """A driver that counts its cuInit calls, a kernel module's /proc files, and the
    environment of every process of the test (the driver found by LD_LIBRARY_PATH)."""
    need("c++")
    src = tmp_path / "cuda.c"
    src.write_text('#include <stdio.h>\n#include <stdlib.h>\n' + FAKE_DRIVER.replace(
        "int cuInit(unsigned flags) { return 0; }",
        'int cuInit(unsigned flags) { FILE* f = fopen(getenv("CUINIT_LOG"), "a"); fputs("cuInit\\n", f); '
        "fclose(f); return 0; }"))
    driver = tmp_path / "driver"
    driver.mkdir()
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(src), "-o",
                    str(driver / "libcuda.so.1")], check=True)
    proc = tmp_path / "proc"
    fake_proc(proc)
    return {"FAKE_PROC": str(proc), "DRIVER_DIR": str(driver), "LD_LIBRARY_PATH": str(driver),
            "CUINIT_LOG": str(tmp_path / "cuinit.log"), "ABICACHE_DIR": str(tmp_path / "store"),
            "ABICACHE_KFD_TOPOLOGY": str(tmp_path / "no-kfd")}


def _call(env: dict[str, str]) -> tuple[bool, int, int]:
    """(served by its record, what the library answered, cuInit calls so far) of a new process."""
    out = run_py(CALL.format(src=DRIVER_USER), env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    log = Path(env["CUINIT_LOG"])
    return got["served"], got["value"], log.read_text().count("cuInit") if log.exists() else 0


def _until_served(env: dict[str, str]) -> int:
    """Calls until a record serves one (a build's witnesses settle a tick after it); the cuInit count then."""
    for _ in range(6):
        served, value, inits = _call(env)
        assert value == 13000
        if served:
            return inits
    raise AssertionError("no hit record was served")


def _record_field(env: dict[str, str]) -> str:
    """The GPU field of the store's one record (record.py: the text's tenth field)."""
    (path,) = (Path(env["ABICACHE_DIR"]) / "v3" / "hits").iterdir()
    head, _, body = path.read_bytes().partition(b"\n")
    n, p, size = (int(x) for x in head.split(b" ")[-3:])
    return body[len(body) - size:].split(b"\0")[9].decode()


def test_a_record_of_gpu_code_is_served_while_the_drivers_premise_stands(stand_in: dict[str, str]) -> None:
    """The entry requires cuda.driver: the record holds the premise of the driver's
    remembered answer (and the memo as a witness); later processes are served without asking
    the driver. A new boot (or any part of the premise) sends the call the full way, which
    asks the driver again and records anew."""
    inits = _until_served(stand_in)
    assert inits == 1  # the driver was asked once, by the first process; served calls ask nothing
    assert _record_field(stand_in).startswith("gpu=") and _record_field(stand_in) != "gpu=none"
    assert _call(stand_in)[:2] == (True, 13000) and _call(stand_in)[2] == 1
    Path(stand_in["FAKE_PROC"], "boot_id").write_text("another-boot\n")
    served, value, inits = _call(stand_in)
    assert (served, value, inits) == (False, 13000, 2)  # the full way: the driver asked again
    assert _until_served(stand_in) == 2
    (Path(stand_in["FAKE_PROC"]) / "gpus" / "0000:3b:00.0").mkdir()  # a GPU more
    assert _call(stand_in)[0] is False


def test_a_record_stands_on_the_drivers_memo_file_as_well(stand_in: dict[str, str]) -> None:
    """The memo the premise names is a witness: rewritten (another answer under the same
    premise, as a full lookup would write it), the call goes the full way."""
    _until_served(stand_in)
    memos = [_driver_memo(stand_in)]
    assert "sm_80,sm_90" in memos[0].read_text()
    text = memos[0].read_text()
    memos[0].unlink()
    memos[0].write_text(text)
    assert _call(stand_in)[0] is False


def _driver_memo(env: dict[str, str]) -> Path:
    from abicache.env import cuda_premise
    from abicache.values.digest import sha256_hex

    named = sha256_hex(cuda_premise.REMEMBERED.encode())[:32] + ".json"  # env/toolid.py's name for it
    (memo,) = Path(env["ABICACHE_DIR"]).rglob(named)
    return memo


TRUSTED = """
import os
from pathlib import Path
from abicache.env import cuda_premise
proc = Path(os.environ["FAKE_PROC"])
cuda_premise.BOOT_ID, cuda_premise.MODULE = str(proc / "boot_id"), str(proc / "version")
cuda_premise.GPUS, cuda_premise.DEV, cuda_premise.LD_CACHE = str(proc / "gpus"), str(proc / "dev"), str(proc / "ld.so.cache")
from abicache import Cache
from abicache.hits import cuda_witness
facts = Cache(os.environ["ABICACHE_DIR"]).facts
facts.get("cuda.driver"), facts.get("gpu.arch")  # the lookup's, from the memo as it was
before = cuda_witness._remembered(facts, cuda_premise.seen(), [])
os.chown(os.environ["MEMO"], 65534, 65534)  # nobody's now, the same bytes
print(before, "|", cuda_witness._remembered(facts, cuda_premise.seen(), []))
"""


def test_no_record_stands_on_a_driver_memo_another_user_owns(stand_in: dict[str, str]) -> None:
    """The memo a record's premise names steers the GPU facts: the writer takes the driver's
    answer from it only as a new process's lookup would believe it (env/toolid.py: this
    user's, or root's, and no one else may write it). Given to `nobody`, no record stands on it."""
    if os.getuid() != 0:
        pytest.skip("giving the memo to another user needs root")
    _until_served(stand_in)
    out = run_py(TRUSTED, env={**stand_in, "MEMO": str(_driver_memo(stand_in))})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("|")[0].strip() == "None"
    assert "no memo of the driver's answer" in out.stdout.split("|")[1]


def test_no_record_stands_where_the_driver_is_asked_in_each_process(stand_in: dict[str, str]) -> None:
    """No kernel module to read: the driver's answer is not remembered, so no record may stand
    for it (a driver that loads here is asked by every lookup)."""
    Path(stand_in["FAKE_PROC"], "version").unlink()
    for _ in range(4):
        served, value, _ = _call(stand_in)
        assert (served, value) == (False, 13000)
    assert not (Path(stand_in["ABICACHE_DIR"]) / "v3" / "hits").exists() or \
        not any((Path(stand_in["ABICACHE_DIR"]) / "v3" / "hits").iterdir())


def test_the_premise_is_read_by_the_probe_and_the_hit_alike() -> None:
    """cuda_probe's premise is cuda_premise's (one reading for both), and a field of an
    unknown part, or of a runtime this process has not loaded, holds nothing."""
    from abicache.env import cuda_premise, cuda_probe
    from abicache.hits import cuda_witness

    assert cuda_probe._seen() == cuda_premise.seen()
    assert not cuda_witness.holds("gpu=none;future=1")
    assert not cuda_witness.holds("cudart=999")
    if cuda_premise.seen() is None and not cuda_premise.driver_loads():
        assert cuda_witness.holds("gpu=none")
    if os.path.exists(cuda_premise.MODULE):
        assert not cuda_witness.holds("gpu=none")


NONE_HOLDS = "from abicache.hits import cuda_witness; print(cuda_witness.holds('gpu=none'))"


def test_no_driver_holds_only_while_none_loads(stand_in: dict[str, str]) -> None:
    """`gpu=none` (a machine without a GPU: no kernel module, no driver library) holds while
    the loader finds no libcuda.so.1, and not once one is there (a real stand-in)."""
    from abicache.env import cuda_premise

    if cuda_premise.seen() is not None:
        pytest.skip("this machine has NVIDIA's kernel module")
    empty = str(Path(stand_in["FAKE_PROC"]).parent / "empty")
    os.mkdir(empty)
    without = run_py(NONE_HOLDS, env={"LD_LIBRARY_PATH": empty})
    if cuda_premise.driver_loads() or "False" in without.stdout:
        pytest.skip("this machine's loader finds a libcuda.so.1")
    assert without.stdout.split() == ["True"], without.stderr
    assert run_py(NONE_HOLDS, env={"LD_LIBRARY_PATH": stand_in["DRIVER_DIR"]}).stdout.split() == ["False"]
