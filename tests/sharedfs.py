"""Shared-filesystem trials, used by tests/test_shared_fs.py (a sample of steps,
asserted) and bench/faults.py (every step, counted).

A store on NFS, Lustre or a volume shared by pods meets errors a local disk
never gives: a file another machine just removed (ENOENT), a stale handle
(ESTALE), a busy target (EBUSY); and some have no hard links or no flock.
fsfault.c makes these happen here (LD_PRELOAD). A trial fails one step of a
publish or of a lookup with one errno, then checks what the caller got:

    ok          the right bytes, at once
    wrong       bytes that are not the artifact's (a wrong load: must be 0)
    crash       an exception reached the caller (must be 0)
    quarantined a good entry was moved aside (must be 0)
    partial     an entry a later reader would find that is not whole (must be 0)

Run as `python sharedfs.py LIB WORK ERRNOS EVERY` in a process started with
LD_PRELOAD=LIB; it prints one JSON line of counts.
"""

from __future__ import annotations

import ctypes
import errno as errnos
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultlib  # noqa: E402

#: the library every trial publishes and loads: real code, compiled once per run
LIB_SOURCE = 'extern "C" int answer(void) { return 42; }\n'


def compile_fault_layer(out: Path) -> Path:
    """libfsfault.so from tests/fsfault.c, built with the system compiler."""
    lib = out / "libfsfault.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", str(Path(__file__).with_name("fsfault.c")), "-o", str(lib),
                    "-ldl"], check=True, capture_output=True)
    return lib


def compile_payload(out: Path) -> Path:
    src = out / "answer.cpp"
    src.write_text(LIB_SOURCE)
    lib = out / "libanswer.so"
    subprocess.run(["c++", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, capture_output=True)
    return lib


class Faults:
    """The fault layer's controls, in this process (it must run under LD_PRELOAD)."""

    def __init__(self) -> None:
        self._c = ctypes.CDLL(None)
        self._c.abicache_fault_arm.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_long]
        self._c.abicache_fault_calls.restype = ctypes.c_long
        self._c.abicache_fault_injected.restype = ctypes.c_long

    def arm(self, where: Path, err: int, at: int) -> None:
        self._c.abicache_fault_arm(os.fsencode(where), err, at)

    def disarm(self) -> None:
        self._c.abicache_fault_arm(b"", 0, 0)

    def hold(self, on: bool) -> None:
        self._c.abicache_fault_hold(int(on))

    @property
    def calls(self) -> int:
        return int(self._c.abicache_fault_calls())

    @property
    def injected(self) -> int:
        return int(self._c.abicache_fault_injected())


def _builder(payload: bytes, faults: Faults, built: list[int]):  # type: ignore[no-untyped-def]
    def build(out: Path) -> None:
        faults.hold(True)  # the builder's own writes are the user's code, not under test
        try:
            built.append(1)
            (out / "lib").mkdir()
            (out / "lib" / "libanswer.so").write_bytes(payload)
            (out / "README").write_text("answer\n")
        finally:
            faults.hold(False)
    return build


def trial(work: Path, n: int, phase: str, err: int, at: int, payload: bytes, faults: Faults) -> dict[str, int]:
    """One store, one fault at step `at` of the phase ("publish" or "lookup")."""
    from abicache import Cache
    from abicache.errors import AbicacheWarning  # noqa: F401  (warnings are allowed, not errors)

    root = work / f"store-{n}"
    built: list[int] = []
    if phase == "lookup":
        Cache(root, remote=False).get_or_build("t", "answer", {"sources": {"answer.cpp": LIB_SOURCE}}, _builder(payload, faults, built))
    quarantine = root / "v3" / "quarantine"
    before = len(list(quarantine.iterdir())) if quarantine.exists() else 0
    faults.arm(root, err, at)
    out = {"trials": 1}
    try:
        art = Cache(root, remote=False).get_or_build("t", "answer", {"sources": {"answer.cpp": LIB_SOURCE}},
                                                     _builder(payload, faults, built))
        faults.hold(True)  # what the caller then reads is its own business
        got = art.file("lib/libanswer.so").read_bytes()
        out["ok" if got == payload else "wrong"] = 1
    except Exception as exc:  # noqa: BLE001  what reached the caller: counted, and the first kept
        out["crash"] = 1
        out["first_crash"] = (f"{phase} errno {errnos.errorcode.get(err)} step {at}: "  # type: ignore[assignment]
                              f"{type(exc).__name__}: {exc}")
    finally:
        out["injected"] = faults.injected
        faults.disarm()
    after = len(list(quarantine.iterdir())) if quarantine.exists() else 0
    out["quarantined"] = after - before
    out["partial"] = len(faultlib.partial_entries(Cache(root, remote=False)))
    out["rebuilt"] = int(phase == "lookup" and len(built) > 1)
    return out


def _count(work: Path, phase: str, payload: bytes, faults: Faults) -> int:
    from abicache import Cache

    root = work / f"count-{phase}"
    built: list[int] = []
    if phase == "lookup":
        Cache(root, remote=False).get_or_build("t", "answer", {"sources": {"answer.cpp": LIB_SOURCE}}, _builder(payload, faults, built))
    faults.arm(root, errnos.ENOENT, 0)
    Cache(root, remote=False).get_or_build("t", "answer", {"sources": {"answer.cpp": LIB_SOURCE}}, _builder(payload, faults, built))
    calls = faults.calls
    faults.disarm()
    return calls


def run(work: Path, payload_path: Path, errs: list[int], every: int) -> dict[str, object]:
    """Every `every`-th step of a publish and every step of a lookup, failed with each errno; counts."""
    faults = Faults()
    payload = payload_path.read_bytes()
    totals: dict[str, object] = {"ok": 0, "wrong": 0, "crash": 0, "quarantined": 0, "partial": 0, "rebuilt": 0,
                                 "trials": 0,
                                 "injected": 0, "steps": {}}
    n = 1
    for phase in ("publish", "lookup"):
        count = _count(work, phase, payload, faults)
        totals["steps"][phase] = count  # type: ignore[index]
        chosen = sorted({*range(1, count + 1, every if phase == "publish" else 1), count})  # a lookup is short
        for err in errs:
            for at in chosen:
                got = trial(work, n, phase, err, at, payload, faults)
                n += 1
                for k, v in got.items():
                    if k == "first_crash":
                        totals.setdefault("first_crash", v)
                        kinds = totals.setdefault("crash_kinds", {})
                        kind = str(v).split(": ", 1)[1][:160]
                        kinds[kind] = kinds.get(kind, 0) + 1  # type: ignore[union-attr]
                    else:
                        totals[k] = int(totals.get(k, 0)) + int(v)  # type: ignore[arg-type]
    totals["sha256"] = hashlib.sha256(payload).hexdigest()[:16]
    return totals


def main() -> None:
    work, payload, names, every = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    start = time.perf_counter()
    got = run(work, payload, [getattr(errnos, name) for name in names.split(",")], every)
    got["seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(got))


if __name__ == "__main__":
    main()
