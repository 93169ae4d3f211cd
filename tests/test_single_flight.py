from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import SRC

WORKER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from abicache import Cache
    root, log, start = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])

    def build(out):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        time.sleep(1.0)
        (out / "lib.so").write_bytes(os.urandom(4096))  # a different result per build

    while time.time() < start:
        time.sleep(0.001)
    art = Cache(root).get_or_build("flight", "same", {"sources": {"a": "b"}}, build)
    print(json.dumps({"path": str(art.file()), "data": art.file().read_bytes().hex(), "hit": art.hit}))
""")


def test_eight_processes_one_build(tmp_path: Path) -> None:
    log = tmp_path / "builds.log"
    start = time.time() + 2.0  # all processes are up and waiting by then
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "store"), str(log), str(start)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(8)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert len(log.read_text().split()) == 1  # exactly one build
    assert len({r["path"] for r in results}) == 1
    assert len({r["data"] for r in results}) == 1
    assert sorted(r["hit"] for r in results) == [False] + [True] * 7
