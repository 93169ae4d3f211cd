"""Truncated, flipped and random inputs: only AuditError escapes, nothing hangs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from abicache.audit import AuditError, audit_file
from corpus import PLAIN_C, gxx, nvcc

SEEDS: dict[str, bytes] = {}


@pytest.fixture(scope="module", autouse=True)
def seeds(tmp_path_factory: pytest.TempPathFactory) -> None:
    work = tmp_path_factory.mktemp("seeds")
    SEEDS["so"] = gxx(PLAIN_C, work / "libseed.so", lang="c").read_bytes()
    try:
        SEEDS["cubin"] = nvcc(work / "seed.cubin", "-cubin", "-arch=sm_90a").read_bytes()
        SEEDS["fatbin"] = nvcc(work / "seed.fatbin", "-fatbin", "-gencode", "arch=compute_80,code=sm_80",
                               "-gencode", "arch=compute_90,code=compute_90").read_bytes()
        SEEDS["ptx"] = nvcc(work / "seed.ptx", "-ptx", "-arch=compute_80").read_bytes()
    except pytest.skip.Exception:
        pass  # without nvcc, fuzz the host library alone


def _audit_bytes(data: bytes, tmp: Path) -> None:
    path = tmp / "fuzzed.bin"
    path.write_bytes(data)
    start = time.monotonic()
    try:
        audit_file(path)
    except AuditError:
        pass
    assert time.monotonic() - start < 10, "audit took too long: a hang on bad input"


fuzz = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@fuzz
@given(st.data())
def test_truncated_inputs(tmp_path: Path, data: st.DataObject) -> None:
    seed = SEEDS[data.draw(st.sampled_from(sorted(SEEDS)))]
    cut = data.draw(st.integers(0, len(seed)))
    _audit_bytes(seed[:cut], tmp_path)


@fuzz
@given(st.data())
def test_flipped_bytes(tmp_path: Path, data: st.DataObject) -> None:
    seed = bytearray(SEEDS[data.draw(st.sampled_from(sorted(SEEDS)))])
    # Aim at the headers, where the parsers' offsets and counts live, and anywhere.
    for _ in range(data.draw(st.integers(1, 8))):
        limit = data.draw(st.sampled_from([64, 256, len(seed)]))
        pos = data.draw(st.integers(0, min(limit, len(seed)) - 1))
        seed[pos] = data.draw(st.integers(0, 255))
    _audit_bytes(bytes(seed), tmp_path)


@fuzz
@given(prefix=st.sampled_from([b"\x7fELF", b"\x50\xed\x55\xba", b".version 9.0\n.target sm_90\n", b""]),
       body=st.binary(max_size=2048))
def test_random_inputs_behind_real_magic(tmp_path: Path, prefix: bytes, body: bytes) -> None:
    _audit_bytes(prefix + body, tmp_path)


@pytest.mark.parametrize("target", ["sm_8", "sm_", "sm_9x", "sm_8a"])
def test_a_ptx_header_cut_inside_its_target_is_an_audit_error(tmp_path: Path, target: str) -> None:
    # found by test_truncated_inputs: `.target sm_80` cut after `sm_8` escaped as a RequirementSyntaxError
    path = tmp_path / "cut.ptx"
    path.write_text(f".version 8.0\n.target {target}\n.address_size 64\n")
    with pytest.raises(AuditError, match="PTX target"):
        audit_file(path)
