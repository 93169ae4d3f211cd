"""A hostile co-user on the same machine: a real second user (`nobody`, via
setpriv) who plants code where a victim's store might load it.

Shared by tests/test_store_safety.py and bench/faults.py. The attacker runs
only shell tools (mkdir, cp, ln), so no interpreter needs to be readable by
that user. Every helper needs root (to switch users); `why_not()` says why
the hostile tests cannot run here.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from abicache.store import manifest as mf, manifest_names

ATTACKER = 65534  # nobody
EVIL_C = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
/* Runs the moment the library is loaded: proof that planted code executed. */
__attribute__((constructor)) static void planted(void) {
    const char *mark = getenv("ABICACHE_PLANTED_MARK");
    if (mark) { int fd = open(mark, O_CREAT | O_WRONLY, 0644); if (fd >= 0) close(fd); }
}
extern "C" int answer(void) { return 666; }
"""
GOOD_C = 'extern "C" int answer(void) { return 42; }'


def why_not() -> str | None:
    """None if the hostile co-user tests can run here, else the reason."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root to act as a second user (setpriv --reuid nobody)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    if shutil.which("c++") is None:
        return "no C++ compiler to build the planted library"
    return None


def as_attacker(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command as the attacker (uid/gid nobody, no supplementary groups)."""
    return subprocess.run(["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups", *argv],
                          capture_output=True, text=True, check=check, timeout=60)


_made: list[Path] = []


def public_dir(prefix: str = "abicache-hostile-") -> Path:
    """A folder everyone may enter and write (like /tmp itself); cleanup() removes it."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o1777)
    _made.append(path)
    return path


def cleanup() -> None:
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)


atexit.register(cleanup)  # what a test that made one did not remove itself (a suite run left dozens in /tmp)


def evil_library(work: Path) -> bytes:
    return evil_file(work).read_bytes()


def evil_file(work: Path) -> Path:
    """The planted library, compiled here, in a folder the attacker can read."""
    out = public_dir("abicache-evil-") / "evil.so"
    src = out.with_suffix(".cpp")
    src.write_text(EVIL_C)
    subprocess.run(["c++", "-shared", "-fPIC", "-O1", str(src), "-o", str(out)], check=True)
    out.chmod(0o644)
    return out


def manifest_doc(vdir: Path) -> dict:
    """An entry's manifest, whether a file or kept in its folder's names (manifest_names)."""
    return json.loads(manifest_names.read_any(os.fspath(vdir), mf.MAX_BYTES))


def rewrite_manifest(vdir: Path, data: bytes) -> None:
    """Replace an entry's manifest by the file manifest.json holding data (its names, if
    it had them, removed): what an editor or an attacker with write access would leave."""
    os.chmod(vdir, 0o755)
    for name in os.listdir(vdir):
        if name.startswith(manifest_names.PREFIX):
            os.unlink(vdir / name)
    mpath = vdir / mf.FILENAME
    if mpath.exists():
        mpath.chmod(0o644)
    mpath.write_bytes(data)
    mpath.chmod(0o444)


def remove_manifest(vdir: Path) -> None:
    """Remove an entry's manifest in whichever form it has."""
    for name in os.listdir(vdir):
        if name == mf.FILENAME or name.startswith(manifest_names.PREFIX):
            os.unlink(vdir / name)


def forge(vdir_copy: Path, blobs_copy: Path, evil: bytes) -> None:
    """Turn a copied, genuine variant directory into a self-consistent planted
    one: every file replaced by `evil`, the manifest's hashes and sizes
    rewritten to match, and the blob a hard link to it under its new hash
    (as the store keeps them: an entry file is its blob's inode)."""
    import hashlib

    doc = manifest_doc(vdir_copy)
    sha = hashlib.sha256(evil).hexdigest()
    for rel, meta in doc["files"].items():
        target = vdir_copy / rel
        target.chmod(0o644)
        target.write_bytes(evil)
        target.chmod(meta["mode"])
        meta.update(sha256=sha, size=len(evil))
    rewrite_manifest(vdir_copy, json.dumps(doc, indent=1, sort_keys=True).encode())
    executable = any(meta["mode"] & 0o111 for meta in doc["files"].values())
    blob = blobs_copy / sha[:2] / (sha + ("x" if executable else ""))  # the store's blob name
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        os.link(vdir_copy / next(iter(doc["files"])), blob)


def plant_command(root: Path, rel: Path, plant: Path, evil_file: Path) -> str:
    """The attacker's shell command: plant the forged variant `plant` at
    root/rel, with its blob, both one inode (what a hit used to check)."""
    import hashlib

    sha = hashlib.sha256(evil_file.read_bytes()).hexdigest()
    doc = json.loads((plant / mf.FILENAME).read_bytes())
    lib, meta = next(iter(doc["files"].items()))
    name = sha + ("x" if meta["mode"] & 0o111 else "")  # the store's blob name
    target, blob = root / rel, root / "v3" / "blobs" / sha[:2] / name
    return (f"mkdir -p '{target.parent}' '{blob.parent}' && cp -r '{plant}' '{target}' && "
            f"cp '{evil_file}' '{blob}' && chmod {meta['mode']:o} '{blob}' && ln -f '{blob}' '{target}/{lib}' && "
            f"chmod 0444 '{target}/{mf.FILENAME}'")


def copy_tree(src: Path) -> Path:
    """A readable copy of src (no hard links kept; the variants links, which name no file,
    kept as links) in a public folder."""
    dest = public_dir("abicache-plant-") / src.name
    shutil.copytree(src, dest, symlinks=True, copy_function=shutil.copyfile)
    for folder, dirs, files in os.walk(dest):
        os.chmod(folder, 0o755)
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                os.chmod(os.path.join(folder, name), 0o644)
    return dest
