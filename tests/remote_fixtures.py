"""Shared fixtures for the remote-tier tests: real servers, one per session,
and a raw view of what a remote holds (to inspect or tamper with it).

S3 is SeaweedFS (tests/servers.py starts `weed server` with its S3 gateway);
Redis is redis-server as fleets run it: an ACL user with a password, TLS only.
No test needs a fault that these real servers cannot produce (the stalled,
refusing and dripping servers of servers.py are real sockets too), so moto
is not used."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

import servers


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    why = servers.seaweedfs_available()
    if why:
        pytest.skip(why)
    os.environ.update(servers.CREDENTIALS)  # obstore reads AWS_* like every S3 client
    with servers.seaweedfs_s3() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def redis_srv() -> Iterator[servers.RedisServer]:
    why = servers.redis_available()
    if why:
        pytest.skip(why)
    with servers.redis_server() as server:
        yield server


@dataclass
class Raw:
    """Direct access to a remote's objects, bypassing abicache."""

    url: str
    client: object
    prefix: str

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")

    @property
    def folder(self) -> Path | None:
        """A file:// remote's folder (None for the servers)."""
        return Path(self.url.removeprefix("file://")) if self.url.startswith("file://") else None

    def _write(self, name: str, data: bytes) -> None:
        assert self.folder is not None
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def _s3_key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def _redis_blob(self, sha: str) -> str:
        return f"{self.prefix}:v2:b:{sha}"

    def put_blob(self, sha: str, data: bytes, *, frame: bytes | None = None) -> None:
        """A blob as abicache stores it: a zstd frame of data under <sha>.zst (remote/packed.py);
        frame: these bytes there instead (no frame, or a frame of other bytes)."""
        import zstandard

        name, data = sha + ".zst", frame if frame is not None else zstandard.ZstdCompressor(level=3).compress(data)
        if self.folder is not None:
            self._write(f"v2/blobs/{sha[:2]}/{name}", data)
        elif self.is_s3:
            self.client.put_object(Bucket=servers.BUCKET, Key=self._s3_key(f"v2/blobs/{sha[:2]}/{name}"), Body=data)
        else:
            self.client.set(self._redis_blob(name), data)

    def delete_blob(self, sha: str) -> None:
        name = sha + ".zst"
        if self.folder is not None:
            (self.folder / f"v2/blobs/{sha[:2]}/{name}").unlink(missing_ok=True)
        elif self.is_s3:
            self.client.delete_object(Bucket=servers.BUCKET, Key=self._s3_key(f"v2/blobs/{sha[:2]}/{name}"))
        else:
            self.client.delete(self._redis_blob(name))

    def blob_names(self) -> list[str]:
        """The names under v2/blobs/."""
        if self.folder is not None:
            return sorted(p.name for p in (self.folder / "v2/blobs").rglob("*") if p.is_file())
        if self.is_s3:
            listed = self.client.list_objects_v2(Bucket=servers.BUCKET, Prefix=self._s3_key("v2/blobs/"))
            return sorted(o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", []))
        return sorted(k.decode().rsplit(":", 1)[1] for k in self.client.scan_iter(self._redis_blob("*")))

    def manifests(self, kind: str, key: str) -> dict[str, bytes]:
        if self.folder is not None:
            folder = self.folder / f"v2/entries/{kind}/{key}"
            return {p.name: p.read_bytes() for p in folder.glob("*") if not p.name.startswith(".")} \
                if folder.is_dir() else {}
        if self.is_s3:
            prefix = self._s3_key(f"v2/entries/{kind}/{key}/")
            listed = self.client.list_objects_v2(Bucket=servers.BUCKET, Prefix=prefix).get("Contents", [])
            return {o["Key"][len(prefix):]: self.client.get_object(Bucket=servers.BUCKET, Key=o["Key"])["Body"].read()
                    for o in listed}
        found = self.client.hgetall(f"{self.prefix}:v2:m:{kind}:{key}")
        return {k.decode(): v for k, v in found.items()}

    def put_manifest(self, kind: str, key: str, variant: str, data: bytes) -> None:
        if self.folder is not None:
            self._write(f"v2/entries/{kind}/{key}/{variant}", data)
        elif self.is_s3:
            self.client.put_object(Bucket=servers.BUCKET, Key=self._s3_key(f"v2/entries/{kind}/{key}/{variant}"),
                                   Body=data)
        else:
            self.client.hset(f"{self.prefix}:v2:m:{kind}:{key}", variant, data)

    def put_odd_manifest_name(self) -> None:
        """Names another tool (or a hostile writer) could leave: not kind/key/variant, not UTF-8."""
        if self.folder is not None:
            for name in ("v2/entries/only-two", "v2/entries/a/b/c/d", "v2/entries/k/x/v",
                         f"v2/entries/test/{'ab' * 32}/{'cd' * 8}"):  # the last: well named, unreadable
                self._write(name, b"\xff{")
            os.makedirs(os.fsencode(self.folder / "v2/entries/test") + b"/\xff\xfe", exist_ok=True)
        elif self.is_s3:
            for name in ("v2/entries/only-two/parts", "v2/entries/a/b/c/d", "v2/entries/k/%ff%fe/v"):
                self.client.put_object(Bucket=servers.BUCKET, Key=self._s3_key(name), Body=b"{}")
        else:
            self.client.hset(f"{self.prefix}:v2:m:test:" .encode() + b"\xff\xfe", b"\xff", b"{}")
            self.client.hset(f"{self.prefix}:v2:m:short", "v", b"{}")

    def count_manifests(self) -> int:
        if self.folder is not None:
            return sum(1 for p in self.folder.glob("v2/entries/*/*/*") if len(p.name) == 16 and p.is_file())
        if self.is_s3:
            listed = self.client.list_objects_v2(Bucket=servers.BUCKET, Prefix=self._s3_key("v2/entries/"))
            return len(listed.get("Contents", []))
        return sum(self.client.hlen(k) for k in self.client.scan_iter(match=f"{self.prefix}:v2:m:*"))


@pytest.fixture(params=["s3", "redis", "file"])
def remote(request: pytest.FixtureRequest) -> tuple[str, Raw]:
    """A fresh remote (its own prefix on a shared server, or a folder of its own) and a raw view of it."""
    return make_remote(request, request.param)


def make_remote(request: pytest.FixtureRequest, engine: str) -> tuple[str, Raw]:
    prefix = uuid.uuid4().hex[:12]
    if engine == "file":
        folder = request.getfixturevalue("tmp_path") / f"remote folder {prefix}"
        folder.mkdir()
        return f"file://{folder}", Raw(f"file://{folder}", None, prefix)
    if engine == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        url = servers.s3_url(endpoint, prefix)
        return url, Raw(url, servers.raw_s3(endpoint), prefix)
    return make_remote_for(request.getfixturevalue("redis_srv"), prefix)


def make_remote_for(server: servers.RedisServer, prefix: str | None = None) -> tuple[str, Raw]:
    """A fresh prefix on a Redis server, and a raw view of it."""
    prefix = prefix or uuid.uuid4().hex[:12]
    url = server.url(prefix)
    assert parse_qs(urlsplit(url).query)["prefix"] == [prefix]
    return url, Raw(url, server.client(), prefix)
