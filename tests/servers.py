"""Real servers on 127.0.0.1 for the remote tier: moto's S3 server, redis-server,
and misbehaving ones (a port that refuses, a listener that never answers).

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


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def moto_available() -> str | None:
    """None if moto's server can run here, else why not."""
    try:
        import moto.server  # noqa: F401
        import boto3  # noqa: F401
    except ImportError as exc:
        return f"moto[server] is not installed ({exc}); pip install 'moto[server]'"
    return None


@contextmanager
def moto_s3() -> Iterator[str]:
    """A moto S3 server with an empty bucket; yields its endpoint URL."""
    port = free_port()
    env = {**os.environ, **CREDENTIALS}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        _wait_for(port, proc, "moto_server")
        endpoint = f"http://127.0.0.1:{port}"
        raw_s3(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        _stop(proc)


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


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server without persistence; yields redis://127.0.0.1:PORT."""
    port = free_port()
    folder = tempfile.mkdtemp(prefix="abicache-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--daemonize", "no", "--dir", folder, "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(port, proc, "redis-server")
        yield f"redis://127.0.0.1:{port}"
    finally:
        _stop(proc)
        shutil.rmtree(folder, ignore_errors=True)


def redis_url(base: str, prefix: str | None = None) -> str:
    return f"{base}/0?prefix={prefix or uuid.uuid4().hex[:12]}"


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
    import threading

    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)

    def pump(src: socket.socket, dst: socket.socket, drip: bool) -> None:
        try:
            while not stop.is_set():
                data = src.recv(1 if drip else 65536)
                if not data:
                    break
                dst.sendall(data)
                if drip:
                    stop.wait(seconds_per_byte)
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
            threading.Thread(target=pump, args=(server, client, True), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        listener.close()
