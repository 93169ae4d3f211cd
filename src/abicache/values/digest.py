"""sha256 and blake2b without OpenSSL's start-up cost where a call hashes little.

`import hashlib` loads OpenSSL (libcrypto): 2-3 ms of a fresh process, more than a whole hit
of a C library costs. A hit hashes a few short texts (a key, a variant id, a value of a
variable), which CPython's own sha256 does as fast; large data (a source tree, a file) takes
OpenSSL's, which is five times faster on megabytes. Both compute the same digest.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any

#: above this many bytes OpenSSL's start-up is paid back by its speed
LARGE = 1 << 18
_small_sha256: Any = None  # not imported yet; False: this interpreter has neither module


def sha256_hex(data: bytes) -> str:
    """The sha256 of `data`, in lower-case hex. Where OpenSSL's module is loaded already (a
    process that imported torch, or hashed a file) it is taken: importing CPython's own costs
    a hit 0.4 ms there."""
    if len(data) > LARGE or "_hashlib" in sys.modules or _small() is None:
        import hashlib
        return hashlib.sha256(data).hexdigest()
    return _small_sha256(data).hexdigest()


def _small() -> Any:
    """CPython's own sha256: 3.11's module, then 3.12's; None without either (asked once)."""
    global _small_sha256
    if _small_sha256 is None:
        try:
            from _sha256 import sha256 as found
        except ImportError:  # pragma: no cover - depends on the interpreter
            try:
                from _sha2 import sha256 as found  # type: ignore[no-redef]
            except ImportError:
                found = False
        _small_sha256 = found
    return _small_sha256 or None


def blake2b(data: bytes = b"", **kwargs: Any) -> Any:
    """hashlib.blake2b, without importing OpenSSL: imported where it is first asked (a hit
    asks for none)."""
    try:
        from _blake2 import blake2b as made
    except ImportError:  # pragma: no cover
        from hashlib import blake2b as made
    return made(data, **kwargs)
