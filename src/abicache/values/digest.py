"""sha256 and blake2b without OpenSSL's start-up cost where a call hashes little.

`import hashlib` loads OpenSSL (libcrypto): 2-3 ms of a fresh process, more than a whole hit
of a C library costs. A hit hashes a few short texts (a key, a variant id, a value of a
variable), which CPython's own sha256 does as fast; large data (a source tree, a file) takes
OpenSSL's, which is five times faster on megabytes. Both compute the same digest.
"""

from __future__ import annotations

import sys

try:  # CPython's own implementations: 3.11's module, then 3.12's
    from _sha256 import sha256 as _small_sha256
except ImportError:  # pragma: no cover - depends on the interpreter
    try:
        from _sha2 import sha256 as _small_sha256  # type: ignore[no-redef]
    except ImportError:
        _small_sha256 = None  # type: ignore[assignment]
try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover
    from hashlib import blake2b  # noqa: F401  (re-exported)

#: above this many bytes OpenSSL's start-up is paid back by its speed
LARGE = 1 << 18


def sha256_hex(data: bytes) -> str:
    """The sha256 of `data`, in lower-case hex."""
    if _small_sha256 is None or (len(data) > LARGE or "_hashlib" in sys.modules):
        import hashlib
        return hashlib.sha256(data).hexdigest()
    return _small_sha256(data).hexdigest()
