"""Remote tier benchmarks, against real servers on 127.0.0.1: SeaweedFS's S3
gateway and redis-server with an ACL user over TLS (tests/servers.py).

- Remote hit of a 1 MB and a 100 MB artifact of random bytes (machine B fetches
  what A published: list, manifest, blob streamed, inflated and hashed, fsync,
  commit) vs the raw client downloading the same object (its frame) to a file, in
  the same run.
- Hit latency through the remote for a small artifact: in a warm process, and
  in a fresh process (import abicache + client + fetch).
- Client choice for S3: obstore vs boto3, import + first request.
- Packed blobs (remote/packed.py): a remote hit of 100 MiB of real shared-library bytes
  (libtorch_cpu.so's first 100 MiB, else this machine's largest libraries) stored as a zstd
  frame, against the same entry stored raw as before (an older writer's blob: the reader's
  fallback), in the same run: bytes moved and time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

import servers  # noqa: E402
from common import run_json  # noqa: E402

RESULTS = ROOT / "bench" / "results"
REPEAT = 5


def median_time(fn: Callable[[], Any], repeat: int = REPEAT) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def abicache_hit(url: str, work: Path, name: str, data: bytes) -> tuple[float, str]:
    import abicache

    a = abicache.Cache(work / "A", remote=url)
    art = a.get_or_build("bench", name, {"extra": {"size": len(data)}},
                         lambda out: (out / "blob.bin").write_bytes(data))
    b = abicache.Cache(work / "B", remote=url)
    times = []
    for _ in range(REPEAT):
        b.store.ensure()
        start = time.perf_counter()
        got = b.get_or_build("bench", name, {"extra": {"size": len(data)}}, _never)
        times.append(time.perf_counter() - start)
        assert got.origin == "remote", got.origin
        b._memo.clear()  # machine B again, with the entry gone (outside the timing)
        for folder in (b.store.layout.entries, b.store.layout.blobs):
            shutil.rmtree(folder)
            folder.mkdir()
    from abicache.remote import packed

    return statistics.median(times), packed.packed_name(art.manifest.files[0].sha256)  # the object as stored


def _never(out: Path) -> None:
    raise AssertionError("benchmark machine B built instead of fetching")


def raw_obstore(url: str, sha: str, out: Path) -> float:
    import obstore
    from obstore.store import S3Store

    from abicache.remote import url as urlmod

    parsed = urlmod.parse(url)
    store = S3Store(parsed.location, prefix=parsed.path,
                    config={"endpoint": parsed.option("endpoint"), "region": "us-east-1"},
                    client_options={"allow_http": True})

    def get() -> None:
        with open(out, "wb") as fh:
            for chunk in obstore.get(store, f"v2/blobs/{sha[:2]}/{sha}").stream(min_chunk_size=1 << 20):
                fh.write(chunk)

    return median_time(get)


def raw_boto3(endpoint: str, url: str, sha: str, out: Path) -> float:
    client = servers.raw_s3(endpoint)
    prefix = url.split("/")[3].split("?")[0]
    return median_time(lambda: client.download_file(servers.BUCKET, f"{prefix}/v2/blobs/{sha[:2]}/{sha}", str(out)))


def raw_redis(server: servers.RedisServer, url: str, sha: str, out: Path) -> float:
    from abicache.remote import url as urlmod

    r = server.client()  # the same user, over the same TLS
    name = f"{urlmod.parse(url).option('prefix')}:v2:b:{sha}"
    return median_time(lambda: out.write_bytes(r.get(name)))


def fresh_process_hit(url: str, work: Path) -> float:
    import abicache

    abicache.Cache(work / "A", remote=url).get_or_build("bench", "small", {}, lambda out: (out / "s.so").write_bytes(b"x" * 4096))
    times = []
    for i in range(REPEAT):
        got = run_json(f"""
            import time; t = time.perf_counter()
            import json, abicache
            art = abicache.Cache({str(work / f'F{i}')!r}, remote={url!r}).get_or_build("bench", "small", {{}}, None)
            assert art.origin == "remote"
            print(json.dumps(time.perf_counter() - t))""", {**servers.CREDENTIALS, "ABICACHE_PROGRESS": "0",
                                                            "PYTHONPATH": str(ROOT / "src")})
        times.append(got)
    return statistics.median(times)


def real_library_bytes(size: int) -> bytes:
    """size bytes of real machine code and data: torch's CPU library, else the largest
    shared libraries under /usr/lib, concatenated (never zeros or random bytes)."""
    found: list[Path] = []
    try:
        import torch  # noqa: F401  (only its folder)

        found.append(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")
    except ImportError:
        pass
    found += sorted((p for p in Path("/usr/lib").rglob("*.so*") if p.is_file() and not p.is_symlink()),
                    key=lambda p: -p.stat().st_size)
    out = bytearray()
    for path in found:
        if path.is_file():
            out += path.read_bytes()[: size - len(out)]
        if len(out) >= size:
            return bytes(out)
    raise SystemExit(f"fewer than {size} bytes of shared libraries on this machine")


def _not_an_elf(stage: Path, paths: Any, declared: Any, facts: Any) -> tuple[Any, dict[str, Any]]:
    """The audit of the cut library: a library's first 100 MiB is no whole ELF file to read."""
    return declared, {}


def packed_against_raw(endpoint: str, work: Path) -> dict[str, Any]:
    """One entry of 100 MiB of library bytes published (packed), fetched by a new machine; then
    the same with its blob stored raw, as the layout v1 kept it (this tree's reader made to
    read the raw object: _reading_raw), fetched again. Each over loopback and over a 1 Gbit/s
    link (servers.rate_proxy in front of SeaweedFS)."""
    import abicache

    data = real_library_bytes(100 << 20)
    prefix = uuid.uuid4().hex[:12]
    url = servers.s3_url(endpoint, prefix)
    a = abicache.Cache(work / "A", remote=url, audit=_not_an_elf)
    art = a.get_or_build("bench", "real", {"extra": {"size": len(data)}},
                         lambda out: (out / "code.bin").write_bytes(data))
    sha = art.manifest.files[0].sha256
    got: dict[str, Any] = {"bytes": len(data)}
    port = int(endpoint.rsplit(":", 1)[1])

    def fetch(label: str) -> None:
        with servers.rate_proxy(port, LINK_RATE) as slow:
            for where, over in (("loopback", endpoint), ("1 Gbit/s", f"http://127.0.0.1:{slow}")):
                b = abicache.Cache(work / f"B-{label}-{where}", remote=servers.s3_url(over, prefix))
                moved, times = [], []
                for _ in range(REPEAT):
                    b.store.ensure()
                    before = b.remote.stats["bytes_down"]
                    start = time.perf_counter()
                    assert b.get_or_build("bench", "real", {"extra": {"size": len(data)}}, _never).origin == "remote"
                    times.append(time.perf_counter() - start)
                    moved.append(b.remote.stats["bytes_down"] - before)
                    b._memo.clear()
                    for folder in (b.store.layout.entries, b.store.layout.blobs):
                        shutil.rmtree(folder)
                        folder.mkdir()
                got.setdefault(label, {})[where] = {"seconds": statistics.median(times), "moved": statistics.median(moved)}

    fetch("packed")
    client = servers.raw_s3(endpoint)
    client.put_object(Bucket=servers.BUCKET, Key=f"{prefix}/v2/blobs/{sha[:2]}/{sha}", Body=data)
    client.delete_object(Bucket=servers.BUCKET, Key=f"{prefix}/v2/blobs/{sha[:2]}/{sha}.zst")
    with _reading_raw():
        fetch("raw")
    return got


@contextlib.contextmanager
def _reading_raw() -> Any:
    """The fetch as it was before blobs were packed: the blob read under its sha256 and fed to
    the verifier as it comes (shipping/replicate.py's reader, for this benchmark only)."""
    from abicache.shipping import replicate

    def read(backend: Any, record: Any, verifier: Any) -> bool:
        def take(chunk: Any) -> None:
            verifier.moved += len(chunk)
            verifier.feed(chunk)
        return backend.read_blob(record.sha256, record.size, take)

    saved = replicate._read_blob
    replicate._read_blob = read
    try:
        yield
    finally:
        replicate._read_blob = saved


#: the link a fleet's machines share with their object store, in bytes per second (1 Gbit/s)
LINK_RATE = 125_000_000


def client_first_request(endpoint: str) -> dict[str, float]:
    env = {**servers.CREDENTIALS}
    servers.raw_s3(endpoint).put_object(Bucket=servers.BUCKET, Key="probe", Body=b"x" * 1000)
    out = {}
    for name, code in {
        "obstore": f"""
            import time; t = time.perf_counter()
            import json, obstore
            from obstore.store import S3Store
            s = S3Store({servers.BUCKET!r}, config={{"endpoint": {endpoint!r}, "region": "us-east-1"}},
                        client_options={{"allow_http": True}})
            obstore.get(s, "probe").bytes(); print(json.dumps(time.perf_counter() - t))""",
        "boto3": f"""
            import time; t = time.perf_counter()
            import json, boto3
            c = boto3.client("s3", endpoint_url={endpoint!r}, region_name="us-east-1")
            c.get_object(Bucket={servers.BUCKET!r}, Key="probe")["Body"].read(); print(json.dumps(time.perf_counter() - t))""",
    }.items():
        out[name] = statistics.median(run_json(code, env) for _ in range(REPEAT))
    return out


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    os.environ.update(servers.CREDENTIALS, ABICACHE_PROGRESS="0")
    work = Path(tempfile.mkdtemp(prefix="abicache-remote-bench-"))
    rows, doc = [], {}
    with servers.seaweedfs_s3() as endpoint, servers.redis_server() as redis:
        for engine in ("s3", "redis"):
            for size in (1 << 20, 100 << 20):
                url = servers.s3_url(endpoint) if engine == "s3" else redis.url()
                data = os.urandom(size)
                ours, sha = abicache_hit(url, work / f"{engine}{size}", f"a{size}", data)
                out = work / "raw.bin"
                raw = raw_obstore(url, sha, out) if engine == "s3" else raw_redis(redis, url, sha, out)
                client = "obstore" if engine == "s3" else "redis-py GET"
                rows.append((engine, f"{size >> 20} MiB", f"{size / ours / 1e6:.0f} MB/s", f"{client}: {size / raw / 1e6:.0f} MB/s",
                             f"{raw / ours:.0%}"))
                doc[f"{engine}_{size >> 20}MiB"] = {"abicache_s": ours, "raw_s": raw, "ratio": raw / ours}
                if engine == "s3":
                    boto = raw_boto3(endpoint, url, sha, out)
                    doc[f"{engine}_{size >> 20}MiB"]["boto3_s"] = boto
                    rows.append(("", "", "", f"boto3: {size / boto / 1e6:.0f} MB/s", f"{boto / ours:.0%}"))
        latency = {engine: fresh_process_hit(servers.s3_url(endpoint) if engine == "s3" else redis.url(),
                                             work / f"lat-{engine}") for engine in ("s3", "redis")}
        warm = {}
        for engine in ("s3", "redis"):
            url = servers.s3_url(endpoint) if engine == "s3" else redis.url()
            warm[engine], _ = abicache_hit(url, work / f"warm-{engine}", "small", b"y" * 4096)
        clients = client_first_request(endpoint)
        packing = packed_against_raw(endpoint, work / "packed")
    doc.update(fresh_process_small_hit_s=latency, warm_small_hit_s=warm, s3_client_first_request_s=clients,
               packed_100MiB=packing)

    console = Console()
    table = Table(title=f"Remote hit vs the raw client downloading the same object (medians of {REPEAT}; "
                        "target >= 80% of raw)", title_justify="left")
    for col in ("remote", "artifact", "abicache remote hit", "raw client to a file", "abicache / raw"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    small = Table(title="Small artifact (4 KiB) through the remote", title_justify="left")
    for col in ("remote", "warm process", "fresh process (import + client + fetch)"):
        small.add_column(col)
    for engine in ("s3", "redis"):
        small.add_row(engine, f"{warm[engine] * 1e3:.2f} ms", f"{latency[engine] * 1e3:.1f} ms")
    console.print(small)
    console.print(f"S3 client, import + first GET in a fresh process: obstore {clients['obstore'] * 1e3:.0f} ms, "
                  f"boto3 {clients['boto3'] * 1e3:.0f} ms ({clients['boto3'] / clients['obstore']:.1f}x)")
    for where in ("loopback", "1 Gbit/s"):
        p, r = packing["packed"][where], packing["raw"][where]
        console.print(f"100 MiB of library bytes from SeaweedFS's S3 over {where}: packed (zstd) moves "
                      f"{p['moved'] / packing['bytes']:.0%} of its bytes in {p['seconds']:.2f} s; stored raw (as "
                      f"before) {r['moved'] / packing['bytes']:.0%} in {r['seconds']:.2f} s: "
                      f"{p['seconds'] / r['seconds']:.2f}x the time (targets <= 40%, <= 0.6x)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "remote.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
