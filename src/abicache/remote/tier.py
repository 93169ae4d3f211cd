"""The remote tier's policy: fail open, verify everything, sign uploads.

- A remote failure never fails a build: the first RemoteError (after the
  client's own single retry) marks the remote down for the rest of the
  process, with one warning, and every later call is skipped at once.
- Everything read from the remote is untrusted: a manifest must parse
  (schema, types, sizes, no '../'), describe the very key and variant it was
  filed under, have the variant id its requirements give, and, where trusted
  keys are configured, carry a valid signature by one of them. A refusal is
  counted and reported; the entry is never used.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..settings import config
from ..errors import AbicacheWarning, ConfigError, ManifestError, RefusedError, RemoteError
from ..store import manifest as mf
from ..store.manifest import Manifest
from . import keys as keymod, url as urlmod
from .backend import Backend

T = TypeVar("T")
MODES = ("read-write", "read")

# Remotes found down in this process (redacted URL -> reason): shared by every
# Cache, so a dead remote costs one timeout per process, not one per lookup.
_down: dict[str, str] = {}
_down_lock = threading.Lock()


@dataclass(frozen=True)
class RemoteSettings:
    url: urlmod.RemoteURL
    mode: str = "read-write"
    timeout: float = 2.0
    signing_key: Path | None = None
    trusted: tuple[keymod.PublicKey, ...] = ()
    lease: float = 30.0  # seconds a build lease lives unrenewed (remote/lease.py); 0: no leases
    stuck: float = 60.0  # seconds a holder's build may go without progress before waiters build
    wait: float = 600.0  # the longest wait for another machine's build of unknown length
    retry_failed: bool = False  # build even when another machine has just failed to
    max_variants: int = 64  # variants of one key a lookup considers
    lookup_bytes: int = 16 << 20  # manifest bytes one lookup may read

    @classmethod
    def from_env(cls, url: str | None = None) -> RemoteSettings | None:
        text = url if url is not None else config.text("ABICACHE_REMOTE")
        if not text:
            return None
        mode = config.text("ABICACHE_REMOTE_MODE")
        if mode not in MODES:
            raise ConfigError(f"ABICACHE_REMOTE_MODE={mode!r}; use 'read-write' or 'read'")
        url = urlmod.parse(text)
        return cls(
            url=url,
            mode="read" if url.scheme in urlmod.READ_ONLY else mode,
            timeout=config.seconds("ABICACHE_REMOTE_TIMEOUT") or 0.1,
            signing_key=keymod.signing_key_from_env(),
            trusted=keymod.trusted_from_env(),
            lease=0.0 if url.scheme in urlmod.STATIC else config.seconds("ABICACHE_REMOTE_LEASE"),
            stuck=config.seconds("ABICACHE_LEASE_STUCK"),
            wait=config.seconds("ABICACHE_LEASE_WAIT"),
            retry_failed=config.flag("ABICACHE_RETRY_FAILED"),
            max_variants=config.count("ABICACHE_REMOTE_MAX_VARIANTS", least=1),
            lookup_bytes=config.count("ABICACHE_REMOTE_LOOKUP_BYTES", least=1 << 16),
        )


@dataclass
class Tier:
    settings: RemoteSettings
    stats: Counter[str] = field(default_factory=Counter)
    _backend: Any = None
    _pid: int = 0
    _signer: Any = None

    @property
    def name(self) -> str:
        return self.settings.url.redacted()

    # ---- availability ----------------------------------------------------

    @property
    def down(self) -> str | None:
        return _down.get(self.name)

    @property
    def writable(self) -> bool:
        """Uploads happen in read-write mode, and, where this fleet requires
        signatures, only from a machine that can sign."""
        if self.settings.mode != "read-write" or self.down:
            return False
        return self.settings.signing_key is not None or not self.settings.trusted

    def backend(self) -> Backend:
        # Clients do not survive fork (obstore's runtime, redis sockets): one per process.
        if self._backend is None or self._pid != os.getpid():
            self._backend, self._pid = _open(self.settings), os.getpid()
        return self._backend

    def call(self, what: Callable[[Backend], T]) -> T | None:
        """Run one remote operation; None (and the remote skipped from now on) if it fails."""
        if self.down:
            return None
        try:
            return what(self.backend())
        except RemoteError as exc:
            self.fail(str(exc))
            return None

    def fail(self, reason: str) -> None:
        self.stats["errors"] += 1
        with _down_lock:
            first = self.name not in _down
            _down.setdefault(self.name, reason)
        if first:
            warnings.warn(
                f"abicache: remote {self.name} is not usable ({reason}); skipping it for the rest of "
                "this process and building locally",
                AbicacheWarning,
                stacklevel=5,
            )

    # ---- trust -----------------------------------------------------------

    def admit(self, kind: str, key: str, variant: str, raw: bytes | None) -> Manifest:
        """The manifest, if it may be used; RefusedError saying why otherwise."""
        where = f"{kind}/{key[:16]}/{variant[:16]}"
        if raw is None:
            raise RefusedError(f"remote manifest {where} is larger than {mf.MAX_BYTES} bytes")
        try:
            manifest = mf.parse(raw)
        except ManifestError as exc:
            raise RefusedError(f"remote manifest {where} is malformed or hostile: {exc}") from None
        if (manifest.kind, manifest.key, manifest.variant) != (kind, key, variant):
            raise RefusedError(f"remote manifest {where} describes {manifest.kind}/{manifest.key[:16]}/"
                               f"{manifest.variant}, not the entry it is filed under")
        if mf.variant_of(manifest) != variant:
            raise RefusedError(f"remote manifest {where}: its requirements do not give its variant id "
                               "(the requirements were altered)")
        if self.settings.trusted:
            problem = keymod.check(manifest, self.settings.trusted)
            if problem is not None:
                raise RefusedError(f"remote manifest {where}: {problem}")
        return manifest

    def sign(self, manifest: Manifest) -> Manifest:
        if self.settings.signing_key is None:
            return manifest._replace(signature=None)
        return self._load_signer().sign(manifest)

    def _load_signer(self) -> keymod.Signer:
        if self._signer is None:
            self._signer = keymod.load_signer(self.settings.signing_key)  # type: ignore[arg-type]
        return self._signer

    def sign_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """A lease or failure record as this machine writes it: signed where it has a key."""
        if self.settings.signing_key is None:
            return record
        return keymod.sign_record(self._load_signer(), record)

    def record_problem(self, record: dict[str, Any]) -> str | None:
        """Why a lease or failure record read from the remote is not to be believed, or None.
        Where this fleet requires signatures, so do its records: anyone who can write the
        remote could otherwise stall it (a lease) or fail its builds (a failure)."""
        if not self.settings.trusted:
            return None
        return keymod.check_record(record, self.settings.trusted)


def _open(settings: RemoteSettings) -> Backend:
    """The client; RemoteError (so: one warning, then local builds) when its library is missing."""
    try:
        if settings.signing_key is not None or settings.trusted:
            import cryptography  # noqa: F401  signing and checking need it: a remote without it is unusable

        if settings.url.scheme == "s3":
            from .s3 import S3Backend

            return S3Backend(settings.url, settings.timeout)
        if settings.url.scheme == "file":
            from .folder import FolderBackend

            return FolderBackend(settings.url, settings.timeout)
        if settings.url.scheme in ("http", "https"):
            from .http import HttpBackend

            return HttpBackend(settings.url, settings.timeout)
        from .redis_kv import RedisBackend

        return RedisBackend(settings.url, settings.timeout)
    except ImportError as exc:
        raise RemoteError(f"a library it needs is not installed ({exc.name or exc}); "
                          "install it with: pip install 'abicache[remote]'") from None


_tiers: dict[RemoteSettings, Tier] = {}


def tier_from(remote: str | RemoteSettings | bool | None) -> Tier | None:
    """The tier of a Cache's remote argument: a URL, RemoteSettings, or None/True for
    ABICACHE_REMOTE (a bad value there is warned about, and ignored: local hits go on)."""
    from ..errors import warn_once

    if remote is None or remote is True:
        try:
            settings = RemoteSettings.from_env()
        except ConfigError as exc:
            warn_once(f"abicache: ABICACHE_REMOTE is ignored, local cache only: {exc}")
            return None
    elif isinstance(remote, str):
        settings = RemoteSettings.from_env(remote)
    elif isinstance(remote, RemoteSettings):
        settings = remote
    else:
        return None
    return tier_for(settings) if settings is not None else None


def tier_for(settings: RemoteSettings) -> Tier:
    """One Tier (client, counters) per configuration in a process."""
    tier = _tiers.get(settings)
    if tier is None:
        tier = _tiers[settings] = Tier(settings)
    return tier


def reset() -> None:
    """Forget which remotes were down (tests; long-running services after an outage)."""
    with _down_lock:
        _down.clear()
