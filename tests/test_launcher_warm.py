"""The warm launcher (src/abicache/launcher/warm.py): a miss the native front cannot serve
from a record is served by a fork of a Python process that has imported what a miss needs,
reached by an abstract socket that both ends check, and never where its fork would see
another world than the front's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_launcher_front import SRC, environment, front  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("cc") is None
                                or not os.path.exists("/proc/self/ns/mnt"),
                                reason="g++, cc (which builds the front) and Linux namespaces are needed")

SERVER = "from abicache.launcher.warm import serve"


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment whose server is this test's alone (HOME is part of its name), with
    `g++` a script that logs the command line of the process that ran it, then runs g++."""
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    wrapper = bin_folder / "g++"
    wrapper.write_text(f'#!/bin/sh\ntr "\\0" " " < /proc/$PPID/cmdline >> "{tmp_path}/parents.log"; '
                       f'echo >> "{tmp_path}/parents.log"\n'
                       f'case "$*" in *-DSLOW*) echo $$ > "{tmp_path}/compiler.pid"; sleep 30;; esac\n'
                       f'exec {shutil.which("g++")} "$@"\n')
    wrapper.chmod(0o755)
    (tmp_path / "home").mkdir()
    env = environment(HOME=str(tmp_path / "home"), PATH=f"{bin_folder}:{os.environ['PATH']}")
    yield env
    stop_servers(env["HOME"])


def stop_servers(home: str) -> None:
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and SERVER in Path(f"/proc/{pid}/cmdline").read_text() and \
                    f"HOME={home}\0" in Path(f"/proc/{pid}/environ").read_text():
                os.kill(int(pid), signal.SIGTERM)
        except OSError:
            pass


def address_of(front: Path, env: dict[str, str]) -> str:
    """The warm launcher's socket name as the front computes it here."""
    return subprocess.run([str(front), "--abicache-warm-address"], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def nobody() -> int:
    """The uid of another user (processes of another user need root here)."""
    if os.geteuid() != 0:
        pytest.skip("a process of another user needs root here")
    import pwd

    return pwd.getpwnam("nobody").pw_uid


def project(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "value.h").write_text("#define VALUE 3\n")
    (folder / "unit.cpp").write_text('#include "value.h"\n#warning served\nint unit() { return VALUE; }\n')
    time.sleep(0.05)
    return folder


def compile(front: Path, folder: Path, env: dict[str, str], *words: str) -> subprocess.CompletedProcess[bytes]:
    words = words or ("g++", "-DRUN=1", "-MD", "-MF", "unit.d", "-c", "unit.cpp", "-o", "unit.o")
    return subprocess.run([str(front), *words], cwd=folder, env=env, capture_output=True, timeout=300)


def started_by(tmp_path: Path) -> str:
    """The command line of the process that ran the last compile."""
    return (tmp_path / "parents.log").read_text().splitlines()[-1]


def warm_server(front: Path, folder: Path, env: dict[str, str], tmp_path: Path) -> None:
    """A first miss, run in Python, starts the server; wait until it answers."""
    assert compile(front, folder, env, "g++", "-DRUN=0", "-c", "unit.cpp", "-o", "first.o").returncode == 0
    assert "warm import after" in started_by(tmp_path)
    address = address_of(front, env)
    import socket

    for _ in range(200):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(b"\0" + address.encode())
            return
        except OSError:
            time.sleep(0.05)
        finally:
            probe.close()
    pytest.fail("no warm launcher answered")


def test_the_front_names_the_server_as_python_does(front: Path, home: dict[str, str], tmp_path: Path) -> None:
    def names(**more: str) -> tuple[str, str]:
        env = {**home, **more}
        native = address_of(front, env)
        python = subprocess.run([sys.executable, "-c", "from abicache.launcher import warm; "
                                 "print(warm.address()[1:].decode())"], env=env, capture_output=True, text=True,
                                check=True).stdout.strip()
        return native, python

    native, python = names()
    assert native == python and native.startswith("abicache-warm-")
    other_home, _ = names(HOME=str(tmp_path / "elsewhere"))
    other_path, python_other = names(PYTHONSAFEPATH="1")
    other_locale, python_locale = names(LC_ALL="C")
    assert len({native, other_home, other_path, other_locale}) == 4  # what decides what the interpreter imports
    assert (other_path, other_locale) == (python_other, python_locale)


def test_a_miss_is_served_by_a_warm_fork_as_python_would(front: Path, home: dict[str, str],
                                                       tmp_path: Path) -> None:
    folder = project(tmp_path / "p")
    warm_server(front, folder, home, tmp_path)
    done = compile(front, folder, home)
    assert done.returncode == 0, done.stderr
    assert SERVER in started_by(tmp_path)
    assert b"#warning served" in done.stderr  # what the compiler printed, printed by the front's own stderr
    subprocess.run([shutil.which("g++"), "-DRUN=1", "-c", "unit.cpp", "-o", "bare.o"], cwd=folder, check=True)
    assert (folder / "unit.o").read_bytes() == (folder / "bare.o").read_bytes()
    assert "unit.cpp" in (folder / "unit.d").read_text()
    for _ in range(100):  # the rest of the miss goes on in the fork: its entry, then its record
        again = subprocess.run([str(front), "--abicache-serve-only", "g++", "-DRUN=1", "-MD", "-MF", "unit.d", "-c",
                                "unit.cpp", "-o", "unit.o"], cwd=folder, env=home, capture_output=True)
        if again.returncode == 0:
            break
        time.sleep(0.05)
    assert again.returncode == 0 and b"#warning served" in again.stderr  # the record's hit, by the front alone
    for _ in range(100):  # counted as the fork exits
        counts = json.loads(subprocess.run([sys.executable, "-m", "abicache", "stats", "--json"], env=home,
                                           capture_output=True, text=True, check=True).stdout)["counts"]
        by_kind = counts["by_kind"].get("cc.compile", {})
        if by_kind.get("misses") == 2:
            break
        time.sleep(0.05)
    assert by_kind["misses"] == 2 and by_kind["hits"] >= 1


def test_a_failed_compile_and_an_uncacheable_command_are_the_compilers(front: Path, home: dict[str, str],
                                                                    tmp_path: Path) -> None:
    folder = project(tmp_path / "p")
    warm_server(front, folder, home, tmp_path)
    (folder / "broken.cpp").write_text("int broken( {\n")
    failed = compile(front, folder, home, "g++", "-c", "broken.cpp", "-o", "broken.o")
    assert failed.returncode == 1 and b"broken.cpp:1" in failed.stderr
    assert SERVER in started_by(tmp_path) and not (folder / "broken.o").exists()
    (folder / "main.cpp").write_text("int unit();\nint main() { return unit() - 3; }\n")
    linked = compile(front, folder, home, "g++", "main.cpp", "first.o", "-o", "prog")  # two sources and a link
    assert linked.returncode == 0, linked.stderr
    assert "warm import after" not in started_by(tmp_path) and SERVER not in started_by(tmp_path)  # the front ran it itself
    assert subprocess.run([str(folder / "prog")]).returncode == 0


def test_a_signal_the_build_sends_stops_the_compile_and_the_front(front: Path, home: dict[str, str],
                                                                tmp_path: Path) -> None:
    folder = project(tmp_path / "p")
    warm_server(front, folder, home, tmp_path)
    waiting = subprocess.Popen([str(front), "g++", "-DSLOW", "-c", "unit.cpp", "-o", "slow.o"], cwd=folder, env=home,
                               stderr=subprocess.PIPE)
    pid_file = tmp_path / "compiler.pid"
    for _ in range(600):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.05)
    compiler = int(pid_file.read_text())
    waiting.send_signal(signal.SIGTERM)
    assert waiting.wait(timeout=20) == -signal.SIGTERM
    for _ in range(100):
        try:
            os.kill(compiler, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the compile went on after the build stopped it")
    assert not (folder / "slow.o").exists()


def test_no_server_but_this_users_own_is_trusted(front: Path, home: dict[str, str], tmp_path: Path) -> None:
    """A process of another user holding the name (it could answer `status 0` having compiled
    nothing, or something else) is never believed: Python compiles."""
    other = nobody()
    folder = project(tmp_path / "p")
    address = address_of(front, home)
    squatter = subprocess.Popen(
        [sys.executable, "-c", "import os, socket, sys\n"
         f"os.setuid({other}); s = socket.socket(socket.AF_UNIX); s.bind(b'\\0{address}'); s.listen(8)\n"
         "print('ready', flush=True)\n"
         "while True:\n    c, _ = s.accept(); c.recv(1 << 20); c.sendall(b'pid 1\\nstatus 0\\n'); c.close()\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "ready"
        done = compile(front, folder, home)
        assert done.returncode == 0, done.stderr
        assert (folder / "unit.o").exists() and "warm import after" in started_by(tmp_path)
    finally:
        squatter.kill()
        squatter.wait()


def test_an_observed_build_and_another_namespace_are_never_served_warm(front: Path, home: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """A build the observer watches must run its compiles where the observer sees them; a front
    in another mount namespace sees other files than a server outside it."""
    folder = project(tmp_path / "p")
    warm_server(front, folder, home, tmp_path)
    watched = {**home, "ABICACHE_TRACE_FD": "99"}
    assert compile(front, folder, watched).returncode == 0
    assert "warm import after" in started_by(tmp_path)
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -m is not allowed here")
    inside = subprocess.run([unshare, "-m", str(front), "--abicache-warm-address"], env=home, capture_output=True,
                            text=True, check=True).stdout.strip()
    assert inside != address_of(front, home)


def test_a_server_leaves_when_idle(home: dict[str, str]) -> None:
    script = ("import sys; sys.path.insert(0, sys.argv[1]); from abicache.launcher import warm; "
              "warm.IDLE_SECONDS = 0.5; warm.serve()")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, str(SRC)], env=home, timeout=60)
    assert done.returncode == 0 and time.monotonic() - started < 30


def test_a_server_serves_no_other_user(front: Path, home: dict[str, str], tmp_path: Path) -> None:
    """Another user's process that connects (to have a compile run as this user) is closed on
    before it is read."""
    other = nobody()
    folder = project(tmp_path / "p")
    warm_server(front, folder, home, tmp_path)
    address = address_of(front, home)
    client = subprocess.run(
        [sys.executable, "-c", "import os, socket\n"
         f"os.setuid({other}); s = socket.socket(socket.AF_UNIX); s.connect(b'\\0{address}')\n"
         "body = b'/bin/true\\0'\n"
         "try:\n"
         "    socket.send_fds(s, [b'abicache-warm 1 22 1 %d\\n' % len(body) + body], [os.open('/', os.O_RDONLY), 0, 1, 2])\n"
         "    print(repr(s.recv(100)))\n"
         "except (BrokenPipeError, ConnectionResetError):\n    print('closed')\n"],
        capture_output=True, text=True, timeout=60)
    assert client.stdout.strip() in ("b''", "closed"), (client.stdout, client.stderr)


def test_what_the_build_does_with_the_outputs_after_the_answer_is_not_kept(front: Path, home: dict[str, str],
                                                                           tmp_path: Path) -> None:
    """ninja removes a depfile as soon as the compile ends, and a later step may rewrite the
    object: the entry keeps what the compiler wrote, copied before the front was answered."""
    folder = project(tmp_path / "p")
    warm_server(front, folder, home, tmp_path)
    assert compile(front, folder, home).returncode == 0
    assert SERVER in started_by(tmp_path)
    depfile = (folder / "unit.d").read_bytes()
    (folder / "unit.d").unlink()
    (folder / "unit.o").write_bytes(b"rewritten by a later step")
    for _ in range(100):  # the entry, then its record: served by the front alone
        again = subprocess.run([str(front), "--abicache-serve-only", "g++", "-DRUN=1", "-MD", "-MF", "unit.d", "-c",
                                "unit.cpp", "-o", "unit.o"], cwd=folder, env=home, capture_output=True)
        if again.returncode == 0:
            break
        time.sleep(0.05)
    assert again.returncode == 0
    subprocess.run([shutil.which("g++"), "-DRUN=1", "-c", "unit.cpp", "-o", "bare.o"], cwd=folder, check=True)
    assert (folder / "unit.o").read_bytes() == (folder / "bare.o").read_bytes()
    assert (folder / "unit.d").read_bytes() == depfile
