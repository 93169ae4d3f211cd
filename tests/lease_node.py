"""One machine of a simulated fleet (tests/test_lease.py): its own cache root, the
shared remote; asks for one key and prints, as JSON, how it got it. Each call of
its builder appends a line to a log shared by the fleet, so builds are counted.

    python lease_node.py ROOT URL NAME SECONDS LOG [fail] [start_at]

LEASE_NODE_SKEW=S sets this machine's clock S seconds off; LEASE_NODE_BURN=1 makes the
builder burn CPU for SECONDS instead of sleeping.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

_real_time = time.time
if os.environ.get("LEASE_NODE_SKEW"):  # this machine's clock is off by that many seconds
    _skew = float(os.environ["LEASE_NODE_SKEW"])
    time.time = lambda: _real_time() + _skew  # type: ignore[assignment]

import abicache  # noqa: E402


def main(root: str, url: str, name: str, seconds: str, log: str, fail: str = "", start_at: str = "0") -> None:
    cache = abicache.Cache(root, remote=url)

    def build(out: Path) -> None:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        if os.environ.get("LEASE_NODE_BURN"):  # working: CPU time, as a compiler
            end = time.monotonic() + float(seconds)
            while time.monotonic() < end:
                sum(range(10000))
        else:
            time.sleep(float(seconds))  # asleep: no CPU time, as a hung compiler
        if fail:
            raise RuntimeError("this builder fails on purpose")
        (out / "out.bin").write_text(f"built by {os.getpid()}")

    time.sleep(max(0.0, float(start_at) - _real_time()))  # the fleet starts together
    start = time.monotonic()
    try:
        art = cache.get_or_build("test", name, {"extra": {"name": name}}, build)
    except RuntimeError as exc:
        print(json.dumps({"error": str(exc), "seconds": time.monotonic() - start}))
        return
    print(json.dumps({"pid": os.getpid(), "origin": art.origin, "text": art.file().read_text(),
                      "seconds": time.monotonic() - start,
                      "stats": dict(cache.remote.stats) if cache.remote else {}}))


if __name__ == "__main__":
    main(*sys.argv[1:])
